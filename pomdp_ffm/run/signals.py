"""Every signal a run answers, in one place (launch/README.md, "Rerun, resume, failures").

SIGTERM and SIGUSR1 ask a run to stop: the trainer finishes the update or episode in hand, saves
checkpoints/last.pt and exits with EXIT_STOPPED. Inside a submitit job the scheduler's warning signal (USR2
unless SUBMITIT_PREEMPT_SIGNAL says otherwise) does the same first, and submitit's own handler, which
requeues the job with its timeout accounting and exits the process, runs only after the checkpoint is on disk
(``hand_over``). Outside the ``with`` block, submitit's handler acts alone: there is nothing new to save then.

In a sweep whose jobs run in the launching process (Hydra's basic launcher) or in its worker processes
(joblib's, ``hydra/launcher=local``), a stop signal stops the sweep: the launching process forwards it to its
workers (``SweepSignals``), the jobs in hand checkpoint and stop, the jobs after them do not start
(``sweep_stopped``), and the launcher exits with EXIT_STOPPED. Rerunning the command resumes the stopped runs
and starts the others. Under submitit every job is its own process and gets its own signals.

Workers end with the process that started them, even one killed by SIGKILL (``WorkerSignals``,
``end_with_parent``), so that no orphan trains on; so does a sweep started by launch/paper_grid.py, which is sent
SIGTERM, its stop signal, when the script ends (``end_with_launcher``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing import resource_tracker

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequested(Exception):
    """Raised between two updates or before an episode, where a stop signal came (``StopSignals.check``)."""


class StopSignals:
    def __init__(self):
        self.requested: int | None = None
        name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
        self.warning_signum = getattr(signal, name, None)
        self._requeue = None  # submitit's handler of the warning signal
        self._warning_caught: tuple | None = None  # the warning, handed to it after the checkpoint
        self._old: dict[int, object] = {}

    def request(self, signum: int, frame=None) -> None:
        """What a stop signal does (also callable directly, e.g. from a test)."""
        self.requested = signum

    def check(self) -> None:
        """Raise StopRequested where a stop was requested."""
        if self.requested is not None:
            raise StopRequested

    def _on_warning(self, signum, frame) -> None:
        self._warning_caught = (signum, frame)
        self.request(signum)

    def __enter__(self) -> StopSignals:
        try:
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self.request)
            w = self.warning_signum
            if w is not None and w not in STOP_SIGNALS and callable(signal.getsignal(w)):
                # A Python handler on the warning signal is submitit's: defer it until the checkpoint is saved.
                self._requeue = signal.getsignal(w)
                self._old[w] = signal.signal(w, self._on_warning)
        except ValueError:  # signals can only be handled in the main thread; a worker thread trains unguarded
            _restore(self._old)
        # A stop that came while this run was being set up (remembered by SweepSignals), looked for once this
        # handler is in, so that none falls between the two.
        if _sweep_stop is not None:
            self.request(_sweep_stop)
        return self

    def __exit__(self, *exc) -> bool:
        _restore(self._old)
        return False

    def hand_over(self) -> None:
        """After the checkpoint: let submitit requeue the job (it exits the process) if its warning stopped us."""
        if self._warning_caught is not None and callable(self._requeue):
            self._requeue(*self._warning_caught)


def _restore(old: dict) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)
    old.clear()


# The stop signal this process received during a sweep, by a job or between two jobs: no later job of the sweep
# starts in this process.
_sweep_stop: int | None = None


def sweep_stopped() -> int | None:
    return _sweep_stop


def stop_sweep(signum: int | None) -> None:
    """Remember a stop signal (None: forget it)."""
    global _sweep_stop
    _sweep_stop = signum


def _job_processes() -> list[int]:
    """The worker processes of joblib's loky executor, where Hydra's joblib launcher runs a sweep's jobs."""
    module = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(module, "_executor", None)
    processes = getattr(executor, "_processes", None) or {}
    return [p.pid for p in list(processes.values()) if getattr(p, "pid", None)]


class SweepSignals:
    """Around a sweep launched in this process: a stop signal is remembered (``stop_sweep``) and forwarded to the
    processes running the sweep's jobs. In each job process its subclass WorkerSignals is installed, so that a
    signal between jobs (where a job's StopSignals is not) is remembered instead of killing the worker.

    ``workers``: the jobs run in worker processes that this one starts (joblib's). Until a worker has installed
    its own handler, as it starts (``workers_follow``), a forwarded signal would kill it; so the stop signals are
    blocked here, which the workers inherit (a blocked signal waits for its process to unblock it:
    ``unblock_in_worker``), and a thread of this process takes them with ``sigwait`` instead of a handler."""

    def __init__(self, forward: bool = True, workers: bool = False):
        self.forward = forward
        # The watcher needs sigtimedwait, which macOS lacks: there a worker stays exposed until its handler is in,
        # as without this.
        self.workers = workers and hasattr(signal, "sigtimedwait")
        self._old: dict[int, object] = {}
        self._signalled: set[int] = set()
        self._watcher: threading.Thread | None = None
        self._mask: set | None = None

    def _on_stop(self, signum, frame=None) -> None:
        stop_sweep(signum)
        self._forward(again=True)

    def _forward(self, again: bool = False) -> None:
        """The sweep's stop signal to its job processes: all of them (``again``), or those that started since."""
        if not self.forward or _sweep_stop is None:
            return
        for pid in _job_processes():
            if again or pid not in self._signalled:
                self._signalled.add(pid)
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(pid, _sweep_stop)

    def _watch(self) -> None:
        while self._watcher is not None:  # (__exit__ ends the loop)
            got = signal.sigtimedwait(STOP_SIGNALS, 0.2)
            # A stop (SIGSTOP) and continue (SIGCONT) of this process during the wait ends it early with a record of
            # no signal (CPython then reads an unfilled one: any number, 0 included); what was asked is still pending.
            if got is not None and got.si_signo in STOP_SIGNALS:
                self._on_stop(got.si_signo)
            else:
                # Workers started after the stop get it too (blocked until their handler is in, they take it there and
                # start no job); a stop that came before any worker existed would otherwise reach no job.
                self._forward()

    def __enter__(self) -> SweepSignals:
        try:
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._on_stop)
        except ValueError:  # not the main thread
            self.__exit__()
            return self
        if self.workers:
            # The resource trackers, which multiprocessing and loky start with the first worker, unblock SIGINT and
            # SIGTERM in the thread that starts them once they are up: started now, before the block, they do not.
            resource_tracker.ensure_running()
            with contextlib.suppress(ImportError):  # no joblib: no joblib launcher either
                from joblib.externals.loky.backend import resource_tracker as loky_tracker

                loky_tracker.ensure_running()
            self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            self._watcher = threading.Thread(target=self._watch, name="sweep-signals", daemon=True)
            self._watcher.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self._watcher is not None:
            watcher = self._watcher
            self._watcher = None  # which ends its loop
            watcher.join()
        if self._mask is not None:  # a signal that came after the watcher stopped reaches this one's handler
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
            self._mask = None
        _restore(self._old)
        return False


class WorkerSignals(SweepSignals):
    """In a process running a sweep's jobs: a stop signal between jobs is remembered. A joblib worker ends with
    its launcher, even one killed by SIGKILL: the kernel sends it SIGTERM, a job in hand stops (checkpoint
    saved), and the worker exits with ``exit_code`` after it, or at once when idle."""

    def __init__(self, exit_code: int):
        super().__init__(forward=False)
        self.exit_code = exit_code
        self.busy = False  # a job in hand: a stop lets it checkpoint before the worker exits
        self.parent = getattr(multiprocessing.parent_process(), "pid", None)  # None: jobs run here (n_jobs=1)

    def __enter__(self) -> WorkerSignals:
        super().__enter__()
        unblock_in_worker()
        if self.parent is not None:
            end_with_parent(signal.SIGTERM, self.parent)
        return self

    def orphaned(self) -> bool:
        return self.parent is not None and os.getppid() != self.parent

    def _on_stop(self, signum, frame=None) -> None:
        super()._on_stop(signum, frame)
        if not self.busy and self.orphaned():
            os._exit(self.exit_code)

    @contextlib.contextmanager
    def job(self):
        self.busy = True
        try:
            yield
        finally:
            self.busy = False
            if self.orphaned():  # its result has nowhere to go, and no job will come
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(self.exit_code)


@functools.cache
def job_worker(exit_code: int) -> WorkerSignals:
    """This process's WorkerSignals, installed at the first call (a joblib worker's start, or the first job)."""
    return WorkerSignals(exit_code).__enter__()


def workers_follow(exit_code: int) -> None:
    """joblib's workers install their WorkerSignals as they start, so that one that never gets a job ends with
    this process too (Hydra's launcher passes no initializer, so the "loky" backend is registered with one)."""
    try:
        from joblib import register_parallel_backend
        from joblib.parallel import LokyBackend
    except ImportError:  # no joblib: no joblib launcher either
        return
    register_parallel_backend("loky", functools.partial(LokyBackend, initializer=job_worker, initargs=(exit_code,)))


def end_with_parent(signum: int, parent: int | None = None) -> None:
    """The kernel sends this process ``signum`` when its parent (pid ``parent``) ends, however it ends (Linux)."""
    parent = os.getppid() if parent is None else parent
    if sys.platform.startswith("linux"):
        # prctl(PR_SET_PDEATHSIG) rather than a watchdog thread: no polling, and the kernel sends it even on SIGKILL.
        ctypes.CDLL(None, use_errno=True).prctl(1, signum)
        if os.getppid() != parent:  # it ended before the prctl: no signal will come
            os.kill(os.getpid(), signum)


# Set by a script that starts ``python -m pomdp_ffm.train`` and waits for it (launch/paper_grid.py) to its own pid:
# the command is stopped when the script ends (``end_with_launcher``).
END_WITH_ENV = "POMDP_FFM_END_WITH"


def end_with_launcher() -> None:
    """Where END_WITH_ENV names this process's parent: the kernel sends this process SIGTERM, a stop signal, when the
    parent ends, even by SIGKILL, so that the sweep stops as a stop signal stops it (its runs checkpointed, its
    workers ended) instead of training on with nobody waiting for it. Called once a handler takes SIGTERM. The
    variable is removed here: the processes this one starts are its own workers, which follow it instead."""
    parent = os.environ.pop(END_WITH_ENV, None)
    if parent is not None:
        end_with_parent(signal.SIGTERM, int(parent))


def env_worker(index, env_fn, pipe, parent_pipe, shared_memory, error_queue, autoreset_mode, semaphore) -> None:
    """Gymnasium's AsyncVectorEnv worker (its ``worker``), ending without a word once the process it serves is gone.
    A run killed by SIGKILL closes the worker's pipe at once, but the kernel's signal (``end_with_parent``) comes
    only once the worker's own parent, the forkserver, has noticed and ended too: in between, Gymnasium's worker
    reports the closed pipe down that pipe, and the failed send as two tracebacks on the terminal, one per worker.
    (Here, not in the caller's module: the forkserver has imported this one, so a worker starts without imports.)"""
    from gymnasium.vector.async_vector_env import _async_worker

    try:
        _async_worker(index, env_fn, pipe, parent_pipe, shared_memory, error_queue, autoreset_mode, semaphore)
    except (BrokenPipeError, ConnectionResetError):  # (what sending on a pipe the other end closed raises)
        os._exit(0)  # nobody is left to answer: nothing to say, nothing to flush (its error queue's thread)


def unblock_in_worker() -> None:
    """In a job's worker process, once its handler is installed: the stop signals its launcher blocked
    (``SweepSignals(workers=True)``) are let in, and one that came meanwhile is delivered now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

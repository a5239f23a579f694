"""Every signal a run answers, in one place.

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
"""
from __future__ import annotations

import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopSignals:
    def __init__(self):
        self.requested: int | None = None
        name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
        self.warning_signum = getattr(signal, name, None)
        self._requeue = None
        self._warning_caught: tuple | None = None
        self._old: dict[int, object] = {}

    def request(self, signum: int) -> None:
        """What a stop signal does (also callable directly, e.g. from a test)."""
        self.requested = signum

    def _on_stop(self, signum, frame) -> None:
        self.request(signum)

    def _on_warning(self, signum, frame) -> None:
        self._warning_caught = (signum, frame)
        self.request(signum)

    def __enter__(self) -> "StopSignals":
        try:
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._on_stop)
            w = self.warning_signum
            if w is not None and w not in STOP_SIGNALS and callable(signal.getsignal(w)):
                # A Python handler on the warning signal is submitit's: defer it until the checkpoint is saved.
                self._requeue = signal.getsignal(w)
                self._old[w] = signal.signal(w, self._on_warning)
        except ValueError:  # signals can only be handled in the main thread; a worker thread trains unguarded
            self._restore()
        # A stop that came while this run was being set up (remembered by SweepSignals), looked for once this
        # handler is in, so that none falls between the two.
        if _sweep_stop is not None:
            self.request(_sweep_stop)
        return self

    def __exit__(self, *exc) -> bool:
        self._restore()
        return False

    def _restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old.clear()

    def hand_over(self) -> None:
        """After the checkpoint: let submitit requeue the job (it exits the process) if its warning stopped us."""
        if self._warning_caught is not None and callable(self._requeue):
            self._requeue(*self._warning_caught)


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
    processes running the sweep's jobs. Installed in each job process too, between its jobs (where a job's
    StopSignals is not), so that a signal there is remembered instead of killing the worker.

    ``workers``: the jobs run in worker processes that this one starts (joblib's). Until a worker has installed
    its own handler, at its first job, a forwarded signal would kill it; so the stop signals are blocked here,
    which the workers inherit (a blocked signal waits for its process to unblock it: ``unblock_in_worker``), and
    a thread of this process takes them with ``sigwait`` instead of a handler."""

    def __init__(self, forward: bool = True, workers: bool = False):
        self.forward = forward
        # sigwait needs both (macOS has pthread_sigmask, not sigtimedwait): elsewhere a worker stays exposed
        # until its first job, as without this.
        self.workers = workers and hasattr(signal, "pthread_sigmask") and hasattr(signal, "sigtimedwait")
        self._old: dict[int, object] = {}
        self._signalled: set[int] = set()
        self._watching = False
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
                try:
                    os.kill(pid, _sweep_stop)
                except ProcessLookupError:  # it ended meanwhile
                    pass

    def _watch(self) -> None:
        while self._watching:
            got = signal.sigtimedwait(STOP_SIGNALS, 0.2)
            if got is not None:
                self._on_stop(got.si_signo)
            else:
                # Workers started after the stop get it too (blocked until their first job, they take it there and
                # do not start it); a stop that came before any worker existed would otherwise reach no job.
                self._forward()

    def __enter__(self) -> "SweepSignals":
        try:
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._on_stop)
        except ValueError:  # not the main thread
            self.__exit__()
            return self
        if self.workers:
            # The resource trackers, which multiprocessing and loky start with the first worker, unblock SIGINT and
            # SIGTERM in the thread that starts them once they are up: started now, before the block, they do not.
            _start_resource_trackers()
            self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            self._watching = True
            self._watcher = threading.Thread(target=self._watch, name="sweep-signals", daemon=True)
            self._watcher.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self._watcher is not None:
            self._watching = False
            self._watcher.join()
            self._watcher = None
        if self._mask is not None:  # a signal that came after the watcher stopped reaches this one's handler
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
            self._mask = None
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old.clear()
        return False


def _start_resource_trackers() -> None:
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    try:
        from joblib.externals.loky.backend import resource_tracker as loky_tracker
    except ImportError:  # no joblib: no joblib launcher either
        return
    loky_tracker.ensure_running()


def unblock_in_worker() -> None:
    """In a job's worker process, once its handler is installed: the stop signals its launcher blocked
    (``SweepSignals(workers=True)``) are let in, and one that came meanwhile is delivered now."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

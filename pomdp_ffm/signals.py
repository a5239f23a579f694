"""Every signal a run answers, in one place.

SIGTERM and SIGUSR1 ask a run to stop: the trainer finishes the update or episode in hand, saves
checkpoints/last.pt and exits with EXIT_STOPPED. Inside a submitit job the scheduler's warning signal (USR2
unless SUBMITIT_PREEMPT_SIGNAL says otherwise) does the same first, and submitit's own handler, which
requeues the job with its timeout accounting and exits the process, runs only after the checkpoint is on disk
(``hand_over``). Outside the ``with`` block, submitit's handler acts alone: there is nothing new to save then.
"""
from __future__ import annotations

import os
import signal

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

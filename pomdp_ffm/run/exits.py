"""Every command's exit codes (a run, a sweep, a status listing, launch/, analysis/), torch-free so that any can
import them; launch/README.md says what each asks of the user."""

EXIT_OK, EXIT_FAILED, EXIT_REFUSED, EXIT_DIVERGED = 0, 1, 2, 3
EXIT_UNWRITABLE = 74  # sysexits' EX_IOERR: a file could not be written (unwritable.Unwritable)
EXIT_STOPPED = 75  # sysexits' EX_TEMPFAIL: stopped by a signal, checkpoint saved; a rerun resumes

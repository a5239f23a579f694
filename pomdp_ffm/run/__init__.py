"""What a run is made of on disk and in the process, below the RL core and the launch side, which both use it:
``rundir`` owns a run directory's files, its lock and atomic writes; ``checkpoint`` the checkpoint format and its
tensors-only reading; ``signals`` stop signals; ``unwritable`` a file that cannot be written; ``exits`` every
command's exit codes. It imports nothing of the package above it (tests/test_architecture.py)."""

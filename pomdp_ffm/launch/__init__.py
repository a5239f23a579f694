"""The launch side: what ``python -m pomdp_ffm.train`` needs around a run, apart from the RL core. ``precheck``
checks the command line before Hydra starts; ``start`` checks, plans and locks a run directory and records each
attempt; ``rundir`` owns a run directory's files, its lock and atomic writes; ``checkpoint`` reads a checkpoint;
``grid`` a sweep's jobs and their statuses; ``signals`` stop signals; ``unwritable`` and ``exits`` the failures a
command reports and their exit codes. The core uses five of them: ``rundir`` (a trainer saves its checkpoints),
``checkpoint`` (their format), ``signals`` (it is told to stop), ``unwritable`` (a log that cannot be written) and
``start`` (a seed axis starts its seeds' attempts)."""

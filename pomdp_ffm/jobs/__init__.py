"""The launch side, above the trainer: what ``python -m pomdp_ffm.train`` does around a run. ``precheck`` checks the
command line before Hydra starts; ``plan`` checks a run directory against a config, reading only, and says its
status; ``start`` locks it and records each attempt;
``seeds`` runs a seed axis's runs in one process; ``grid`` a sweep's jobs and their statuses. Nothing in the core
imports it (tests/test_architecture.py)."""

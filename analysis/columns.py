"""The tidy table's columns: one row per evaluation of one run, the same for our runs, the reference's and
the published results."""

from __future__ import annotations

import pandas as pd

TABLE_COLUMNS = [
    "run_id",
    "source",
    "task",
    "family",
    "obs",
    "algo",
    "model",
    "model_label",
    "seed",
    "trial",
    "finished",
    "status",
    "env_steps",
    "eval_return",
    "rl_steps",
    "rollouts",
    "eval_episode_len",
    "success_rate",
    "time_cost_s",
    "fps",
    "run_dir",
]


def empty_table() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64") for c in TABLE_COLUMNS})

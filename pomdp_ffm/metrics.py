"""Every statistic progress.csv logs, declared once: its name, its column (the reference's, from its
policies/learner.py and utils/logger.py), and for an update's statistics how a burst of updates reduces it to its
row. The update's return (pomdp_ffm/update.py, under these names), the burst's sums, the CSV header and the
analysis reader (analysis/constants.py) all read this table.

A train row carries the ``rl_loss/...`` columns of a burst, an evaluation row the ``z/...`` and ``metrics/...``
columns; the other cells stay empty, as in the reference's logs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Metric:
    name: str
    column: str
    # "mean": over the burst's updates that reported it (a TD3 policy delay makes the actor's fewer); "last": the
    # burst's last update's value (the gradient norms, computed at that update only).
    reduce: str = "mean"


def _update_metric(name: str, reduce: str = "mean") -> Metric:
    return Metric(name, f"rl_loss/{name}", reduce)


# What update() may return; each algorithm names the ones it reports (algos.SAC.metrics, algos.TD3.metrics).
UPDATE = {m.name: m for m in (
    *map(_update_metric, ("qf1_loss", "qf2_loss", "policy_loss", "policy_entropy", "alpha")),
    *(_update_metric(name, "last") for name in ("q_grad_norm", "q_rnn_grad_norm", "pi_grad_norm",
                                                 "pi_rnn_grad_norm")),
)}
GRAD_NORMS = tuple(name for name, m in UPDATE.items() if m.reduce == "last")

# The evaluation row: the clocks when it was due, then the deterministic evaluation (and the stochastic one with
# eval.eval_stochastic), then the wall clock.
ENV_STEPS, ROLLOUTS, RL_STEPS = "z/env_steps", "z/rollouts", "z/rl_steps"
EVAL_LENGTH, EVAL_RETURN, EVAL_SUCCESS = ("metrics/total_steps_eval", "metrics/return_eval_total",
                                          "metrics/success_rate_eval")
STOCHASTIC = {column: f"{column}_sto" for column in (EVAL_LENGTH, EVAL_RETURN, EVAL_SUCCESS)}
TIME_COST, FPS = "z/time_cost", "z/fps"
TIMING = [TIME_COST, FPS]  # the only columns two runs of one config may differ in


def columns(update_metrics: Iterable[str], eval_stochastic: bool) -> list[str]:
    """progress.csv's header for an algorithm's update metrics."""
    train = [UPDATE[name].column for name in (*update_metrics, *GRAD_NORMS)]
    evaluation = [ENV_STEPS, ROLLOUTS, RL_STEPS, EVAL_LENGTH, EVAL_RETURN, EVAL_SUCCESS]
    return train + evaluation + (list(STOCHASTIC.values()) if eval_stochastic else []) + TIMING


def summed(name: str) -> bool:
    """Whether a burst sums this update statistic (for its mean) rather than keeping its last value."""
    return UPDATE[name].reduce == "mean"


def burst_row(sums: dict[str, float], counts: dict[str, int], last: dict[str, float]) -> dict[str, float]:
    """A burst's train row: each summed statistic's mean, each other's last value, under their columns."""
    row = {UPDATE[k].column: v / counts[k] for k, v in sums.items()}
    row.update({UPDATE[k].column: float(v) for k, v in last.items() if not summed(k)})
    return row

"""Every statistic progress.csv logs, declared once: name, the reference's column and, for an update's, how a burst
reduces it. The update returns these names (each algorithm lists its own, algos.SAC.metrics); the burst, the CSV
header and analysis/constants.py take everything else from here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    column: str
    # "mean" over the burst's updates that reported it (TD3's delay makes the actor's fewer), or "last" (the
    # gradient norms, computed at the burst's last update only)
    reduce: str = "mean"


# What update() may return; each algorithm names the ones it reports (algos.SAC.metrics, algos.TD3.metrics).
UPDATE = {
    name: Metric(name, f"rl_loss/{name}", "last" if name.endswith("grad_norm") else "mean")
    for name in (
        "qf1_loss",
        "qf2_loss",
        "policy_loss",
        "policy_entropy",
        "alpha",
        "q_grad_norm",
        "q_rnn_grad_norm",
        "pi_grad_norm",
        "pi_rnn_grad_norm",
    )
}
GRAD_NORMS = tuple(name for name, m in UPDATE.items() if m.reduce == "last")

# The evaluation row: the clocks, the deterministic (and with eval.eval_stochastic the stochastic) evaluation, time
ENV_STEPS, ROLLOUTS, RL_STEPS = "z/env_steps", "z/rollouts", "z/rl_steps"
EVAL_LENGTH, EVAL_RETURN, EVAL_SUCCESS = (
    "metrics/total_steps_eval",
    "metrics/return_eval_total",
    "metrics/success_rate_eval",
)
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

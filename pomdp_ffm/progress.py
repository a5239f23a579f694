"""What a run writes and shows as it goes: progress.csv's rows (an evaluation's, a burst's; logger.MetricsWriter),
TensorBoard's when asked, and the progress bar with the latest update rate and return."""

from __future__ import annotations

import logging
import time

from tqdm import tqdm

from .burst import Burst
from .config import RunConfig
from .evaluation import Clocks, EvalResult
from .logger import MetricsWriter
from .metrics import (
    ENV_STEPS,
    EVAL_LENGTH,
    EVAL_RETURN,
    EVAL_SUCCESS,
    FPS,
    RL_STEPS,
    ROLLOUTS,
    STOCHASTIC,
    TIME_COST,
    burst_row,
)
from .run.rundir import RunDir
from .standing import Standing

log = logging.getLogger("pomdp_ffm")


class Progress:
    """Opened where the run stands (``standing``; ``checkpoint``: the rows a resumed run's checkpoint holds)."""

    def __init__(self, cfg: RunConfig, rundir: RunDir, columns: list[str], budget: int, standing: Standing, checkpoint):
        tensorboard = rundir / RunDir.TENSORBOARD if cfg.eval.log_tensorboard else None
        self.writer = MetricsWriter(rundir.progress, columns, tensorboard, checkpoint=checkpoint)
        self.t0, self.last_eval_time = time.time() - standing.elapsed, time.time()
        self.standing = standing  # read for the bar's last return, which the trainer keeps
        self.updates_per_s = 0.0
        self.bar = tqdm(
            total=budget,
            initial=standing.env_steps,
            unit="step",
            dynamic_ncols=True,
            disable=not cfg.progress,
            mininterval=2.0,
            desc=cfg.env.env_name,
        )

    def step(self, n: int = 1) -> None:
        self.bar.update(n)

    def elapsed(self) -> float:
        return time.time() - self.t0

    def burst(self, burst: Burst, env_steps: int) -> None:
        """A closed burst's row (an empty burst writes none)."""
        if burst.n > 0:
            self.writer.write(burst_row(burst.sums, burst.counts, burst.last), env_steps)
            self.updates_per_s = (burst.done - burst.start) / max(time.time() - burst.t0, 1e-9)
            self._show_status()

    def evaluation(
        self, deterministic: EvalResult, stochastic: EvalResult | None, at: Clocks, since_env_steps: int
    ) -> None:
        """An evaluation's row (the one place that writes one), at the clocks when it was due; ``since_env_steps``:
        the env steps at the last one (its FPS's start)."""
        row = {
            ENV_STEPS: at.env_steps,
            ROLLOUTS: at.rollouts,
            RL_STEPS: at.rl_steps,
            EVAL_LENGTH: deterministic.length,
            EVAL_RETURN: deterministic.ret,
            EVAL_SUCCESS: deterministic.success,
        }
        if stochastic is not None:
            row.update({STOCHASTIC[k]: getattr(stochastic, f) for k, f in FIELDS.items()})
        row[TIME_COST] = int(at.time - self.t0)
        row[FPS] = (at.env_steps - since_env_steps) / max(at.time - self.last_eval_time, 1e-9)
        self.last_eval_time = at.time
        self.writer.write(row, at.env_steps)
        self._show_status()
        log.info(
            "env steps %d  updates %d  eval return %.2f  length %.1f",
            at.env_steps,
            at.rl_steps,
            deterministic.ret,
            deterministic.length,
        )

    @property
    def num_eval_rows(self) -> int:
        return self.writer.num_eval_rows

    def state(self) -> dict:
        return self.writer.state()

    def close(self) -> None:
        self.bar.close()
        self.writer.close()

    def _show_status(self) -> None:
        self.bar.set_postfix_str(f"upd/s={self.updates_per_s:.0f} eval={self.standing.last_return:.1f}", refresh=False)


FIELDS = {EVAL_RETURN: "ret", EVAL_LENGTH: "length", EVAL_SUCCESS: "success"}  # a result's field by column

"""The reference's training loop (its policies/learner.py; docs/reference.md#training-loop), owning env, buffer,
agent and progress.csv. ``Trainer.train`` is the loop: units of work, each the initial pool's random episodes or an
iteration's, then the burst of updates they call for (``update_bursts``), its row, and the evaluation when due (its
row, a snapshot, a checkpoint). A seed axis (jobs/seeds.py) drives several trainers through the same unit-sized calls,
and ``update_bursts`` runs their bursts together where one runner updates them all."""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import rng as rngs
from .acting_graph import make_actor
from .agent import RecurrentAgent, agent_shape, check_weights_fit
from .buffer import SeqReplayBuffer
from .burst import Burst
from .compiling import compile_before_acting, compiles
from .config import RunConfig, check_eval_clock, env_step_budget, resolve_device
from .cuda_graph import UpdateRunner
from .envs import get_task, make_env
from .evaluation import Clocks, Due, EvalResult, Evaluation, Evaluator
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
    columns,
    summed,
)
from .optim import AdamForm
from .rollout import AgentPolicy, NonFiniteAction, RandomPolicy, Rollout, TrainingDiverged, play_all
from .run.checkpoint import CHECKPOINT_FORMAT
from .run.rundir import RunDir
from .run.signals import StopSignals

log = logging.getLogger("pomdp_ffm")


class StopRequested(Exception):
    """Raised between two updates or before an episode."""


@dataclass
class Standing:
    """Where the run stands: its clocks, the last evaluation's, the seconds trained, the burst in hand; saved whole in
    the checkpoint (under "counters", the name of the checkpoint format's key)."""

    env_steps: int = 0
    rollouts: int = 0
    rl_steps: int = 0
    last_eval_iters: int = 0  # the eval clock's value at the last evaluation
    last_eval_env_steps: int = 0
    last_return: float = math.nan
    elapsed: float = 0.0  # wall seconds trained, over all attempts
    pool_done: bool = False
    burst: Burst | None = None  # the burst in hand, from its unit's episodes to its row

    @property
    def burst_over(self) -> bool:
        return self.burst is None or self.burst.over


@dataclass
class Outcome:
    stopped: bool = False
    signal: int | None = None
    standing: Standing = field(default_factory=Standing)


class Trainer:
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: RunDir | str | Path,
        stop: StopSignals | None = None,
        *,
        composed: dict | None = None,
        timers: Counter | None = None,
    ):
        """Writes nothing. ``composed``: the config its checkpoints store; ``timers``: seconds and counts
        (``n_<part>``) by part."""
        self.cfg = cfg
        self.rundir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.stop = stop if stop is not None else StopSignals()
        self.config_copy = composed
        self.timers = timers if timers is not None else Counter()
        torch.set_num_threads(cfg.num_threads)
        # Process-wide, as torch's flag is: the seeds of one axis share their config, hence the value.
        torch.backends.cuda.matmul.allow_tf32 = cfg.train.tf32
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.device = resolve_device(cfg.device)
        t = cfg.train
        self.max_len = get_task(cfg.env.env_name).max_episode_steps  # an unknown task fails here, with the list
        self.iter_len, self.budget = env_step_budget(t, self.max_len)
        check_eval_clock(cfg, self.max_len)
        self.standing, self.metrics, self.bar, self._closed = Standing(), None, None, False
        self.unit_episodes = self.unit_steps = 0  # the episodes collected in the unit of work in hand
        self._updates_per_s = 0.0
        # One env instance for training and evaluation, as in the reference.
        self.env = make_env(cfg.env.env_name, seed=cfg.seed)
        try:
            obs_dim, act_dim = self.env.observation_space.shape[0], self.env.action_space.shape[0]
            self.seq_len = self.max_len if t.sampled_seq_len == -1 else t.sampled_seq_len
            self.buffer = SeqReplayBuffer(
                int(t.buffer_size), obs_dim, act_dim, self.seq_len, t.sample_weight_baseline, seed=cfg.seed
            )
            check_weights_fit(shape := agent_shape(obs_dim, act_dim, cfg.policy))  # (built on the host, then moved)
            compiled = compiles(t.compile, [shape], self.device)  # (its Adam's form: fused where compiled)
            adam = AdamForm.for_update(compiled, t.cuda_graph, self.device)
            self.agent = RecurrentAgent(obs_dim, act_dim, cfg.policy, adam).to(self.device)
            self.updater = UpdateRunner(self.agent, t.cuda_graph, compile=compiled)
            self.acting = make_actor(self.agent, t.cuda_graph)
            self.evaluator = Evaluator(cfg, self.env, self.acting, self.agent, self.timers)
            self.columns = columns(self.agent.algo.metrics, cfg.eval.eval_stochastic)
        except BaseException:
            self.env.close()  # a PyBullet env holds its physics server
            raise

    def train(self, resume: dict | None = None) -> Outcome:
        """Train to the budget, or until a stop signal (then checkpoint). The run directory must be locked."""
        self.open(resume)
        c = self.standing
        try:
            try:
                if compile_before_acting(self):  # (train.compile; a stop that came meanwhile is taken right after)
                    self._check_stop()
                while c.burst is not None or c.env_steps < self.budget:
                    if c.burst is None:  # (else resumed inside a burst, its unit's episodes in the buffer)
                        self.collect()  # the initial pool's random episodes, or an iteration's; its burst's size
                    update_bursts([self], self.updater)  # no host read between its updates
                    if (evaluation := self.end_burst()) is not None:  # its row (after a deferred evaluation's)
                        play_all(evaluation.next, evaluation.ended)
                        self.evaluated(evaluation)  # its row; a snapshot, a checkpoint when due
            except StopRequested:
                return self.stopped()  # (its checkpoint may play the rest of a deferred evaluation)
            return self.finished()
        except NonFiniteAction as e:  # played anywhere above (a seed axis's seed: jobs/seeds.py, SeedAxis.failed)
            self.diverged(e)

    def open(self, resume: dict | None = None) -> None:
        if resume is not None:
            self._restore(resume)
        self.metrics = MetricsWriter(
            self.rundir.progress,
            self.columns,
            self.rundir / RunDir.TENSORBOARD if self.cfg.eval.log_tensorboard else None,
            checkpoint=None if resume is None else resume["progress"],
        )
        self._t0 = time.time() - self.standing.elapsed
        self._last_eval_time = time.time()
        self.bar = tqdm(
            total=self.budget,
            initial=self.standing.env_steps,
            unit="step",
            dynamic_ncols=True,
            disable=not self.cfg.progress,
            mininterval=2.0,
            desc=self.cfg.env.env_name,
        )

    # --- a unit of work: the initial pool, or an iteration ------------------------------------------------------
    def collect(self) -> None:
        """The next unit's episodes into the buffer, then the burst they call for (a seed axis that gathers its
        seeds' acting steps makes the same calls, the episodes played together)."""
        self.start_unit()
        play_all(self.next_episode, self.store)
        self.start_burst()

    def start_unit(self) -> None:
        """A stop is taken before an iteration, never inside its episodes (a checkpoint holds no half episode)."""
        if self.standing.pool_done:
            self._check_stop()
        self.unit_episodes = self.unit_steps = 0

    def next_episode(self) -> Rollout | None:
        """The unit's next episode, its env reset; None once the unit has them all: the reference's initial pool
        of random actions up to its size in env steps, or an iteration's num_rollouts_per_iter by the agent."""
        c, t = self.standing, self.cfg.train
        if not c.pool_done:
            if c.env_steps >= t.num_init_rollouts_pool * self.max_len:
                return None
            policy, timers = RandomPolicy([self.env]), Counter()  # the pool's apart: its acting is a uniform draw
        elif self.unit_episodes < t.num_rollouts_per_iter:
            policy, timers = AgentPolicy(self.acting, deterministic=False), self.timers
        else:
            return None
        return Rollout([self.env], policy, record=True, on_step=self.bar.update if self.bar else None, timers=timers)

    def store(self, rollout: Rollout) -> None:
        """An ended episode counted, and stored where the buffer can sample it."""
        (ep,) = rollout.episodes()
        pool = not self.standing.pool_done
        if pool:
            self.timers.update({f"pool_{k}": v for k, v in rollout.timers.items()})
        self.timers["n_pool_steps" if pool else "n_steps"] += ep.length
        if ep.length >= 2:
            self.buffer.add_episode(ep)
        else:
            # Counted in env_steps like every step taken (patches/011-length-1-episodes.md).
            log.warning("episode of length %d not stored (the sequence buffer needs >= 2 steps)", ep.length)
        self.standing.env_steps += ep.length
        self.standing.rollouts += 1
        self.unit_episodes += 1
        self.unit_steps += ep.length

    def start_burst(self, n: int | None = None) -> None:
        """The burst the unit's episodes call for (``n``: another size). As the reference: a float ratio bursts
        int(steps x ratio) updates after the pool, an int count does not; an iteration's is ceil(its steps x ratio),
        or the int count. With nothing in the buffer to sample, none."""
        ratio = self.cfg.train.num_updates_per_iter
        if n is None and not self.standing.pool_done:
            n = int(self.standing.env_steps * ratio) if isinstance(ratio, float) else 0
        elif n is None:
            n = ratio if isinstance(ratio, int) else math.ceil(self.unit_steps * ratio)
        self.standing.burst = Burst(n if len(self.buffer) > 0 else 0, self.agent.device)

    def end_burst(self) -> Evaluation | None:
        """The burst's row, after the row of an evaluation deferred into it (the order without the deferral); then
        the evaluation due now, to be played and handed to ``evaluated``: None at the end of the pool, where none is
        due, or where it is deferred into the next burst (eval.during_updates)."""
        c, burst = self.standing, self.standing.burst
        if burst.n > 0:
            self._close_burst(burst)  # (a non-finite statistic: the diverged checkpoint holds the burst)
        c.burst = None
        self._finish_deferred()
        if burst.n > 0:  # an empty burst writes no row
            self.metrics.write(burst_row(burst.sums, burst.counts, burst.last), c.env_steps)
            self._updates_per_s = (burst.done - burst.start) / max(time.time() - burst.t0, 1e-9)
            self._show_status()
        return self._due_evaluation()

    def _due_evaluation(self) -> Evaluation | None:
        c, ev = self.standing, self.cfg.eval
        if not c.pool_done:
            c.pool_done = True
            return None
        iters = c.env_steps // self.iter_len  # the reference's env-step clock
        if iters == c.last_eval_iters or iters % ev.log_interval != 0:
            return None
        c.last_eval_iters = iters
        snapshot = ev.save_interval > 0 and c.env_steps > 0.75 * self.budget and iters % ev.save_interval == 0
        checkpoint = iters % self.cfg.checkpoint.interval == 0
        # Not deferred where something waits for it: a snapshot (named by the return), a checkpoint, the end.
        if ev.during_updates and not (snapshot or checkpoint) and c.env_steps < self.budget:
            self.evaluator.defer(Due(at=self._clocks()))
            return None
        return self.evaluator.evaluation(Due(snapshot=snapshot, checkpoint=checkpoint))

    def evaluated(self, evaluation: Evaluation) -> None:
        """A played evaluation's row, then the snapshot and checkpoint waiting for it."""
        due = evaluation.due
        self._log_evaluation(*evaluation.results(), due.at or self._clocks())
        if due.snapshot:
            self._snapshot(self.standing.last_return)
        if due.checkpoint:
            self.save_checkpoint()

    def stopped(self) -> Outcome:
        c = self.standing
        if c.burst is not None and c.burst.n > 0:
            self._close_burst(c.burst)  # its sums into the checkpoint; a non-finite one fails the run instead
        self.save_checkpoint()  # (what the stop leaves is said once, by whoever started the run: start.Attempt.end)
        return Outcome(stopped=True, signal=self.stop.requested, standing=c)

    def finished(self) -> Outcome:
        c = self.standing
        self._finish_deferred()
        self._snapshot(c.last_return)
        self.save_checkpoint()
        log.info("finished: %d env steps, %d updates, last eval return %.2f", c.env_steps, c.rl_steps, c.last_return)
        return Outcome(standing=c)

    def close(self) -> None:
        """Idempotent: whoever owns the trainer may call it."""
        if self._closed:
            return
        self._closed = True
        for opened in (self.bar, self.metrics):
            if opened is not None:
                opened.close()
        try:
            self.evaluator.close()
        finally:
            self.env.close()

    def save_checkpoint(self, path: Path | None = None) -> Path:
        """Tensors and plain containers only, for ``checkpoint.load_checkpoint`` to read tensors-only."""
        self._finish_deferred()  # played and logged now: the checkpoint holds the rows
        c = self.standing
        c.elapsed = time.time() - self._t0
        rng = {**rngs.for_checkpoint(rngs.host_rng_state()), "env": self.env.rng_state()}
        buffer = (
            {
                k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
                for k, v in self.buffer.state_dict().items()
            }
            if self.cfg.checkpoint.save_buffer
            else None
        )
        state = {
            "format": CHECKPOINT_FORMAT,
            "config": self.config_copy,
            "agent": self.agent.training_state(),
            "counters": {**vars(c), "burst": None if c.burst is None else c.burst.saved()},
            "progress": self.metrics.state(),
            "rng": rng,
            "buffer": buffer,
        }
        return self.rundir.save(state, path or self.rundir.checkpoint)

    # --- the parts above share ------------------------------------------------------------------------------------
    def _check_stop(self) -> None:
        if self.stop.requested is not None:
            raise StopRequested

    def _record_update(self, stats: dict) -> None:
        """An update run here or in a seed axis's joint round: counted, its statistics added to the burst."""
        self.timers["n_updates"] += 1
        self.standing.rl_steps += 1
        self.standing.burst.add(stats, self.standing.rl_steps)

    def _close_burst(self, burst: Burst) -> None:
        # The burst's one device read waits for the queued updates: update time too.
        t_w = time.perf_counter()
        first_bad = burst.close()
        self.timers["update"] += time.perf_counter() - t_w
        if first_bad >= 0:
            c, last = self.standing, {k: float(v) for k, v in burst.last.items()}
            self.diverged(
                f"non-finite loss first at update {first_bad} (env step {c.env_steps}; the burst ran on to update "
                f"{c.rl_steps}, whose statistics were {last})"
            )

    def diverged(self, what: str | NonFiniteAction) -> None:
        """A non-finite loss, or action (Rollout.send: its weights made it), is the run's end: diverged.pt saved."""
        acting = isinstance(what, NonFiniteAction)
        where = f" (env step {self.standing.env_steps}, update {self.standing.rl_steps})" if acting else ""
        path = self.save_checkpoint(self.rundir / RunDir.DIVERGED)  # (no evaluation is deferred now: played or dropped)
        log.error(msg := f"{what}{where}; checkpoint saved to {path}")
        raise TrainingDiverged(msg) from (what if acting else None)

    def _clocks(self) -> Clocks:
        c = self.standing
        return Clocks(c.env_steps, c.rollouts, c.rl_steps, time.time())

    def _log_evaluation(self, deterministic: EvalResult, stochastic: EvalResult | None, at: Clocks) -> None:
        """An evaluation's row (the one place that writes one), at the clocks when it was due."""
        c = self.standing
        row = {
            ENV_STEPS: at.env_steps,
            ROLLOUTS: at.rollouts,
            RL_STEPS: at.rl_steps,
            EVAL_LENGTH: deterministic.length,
            EVAL_RETURN: deterministic.ret,
            EVAL_SUCCESS: deterministic.success,
        }
        if stochastic is not None:
            row[STOCHASTIC[EVAL_RETURN]] = stochastic.ret
            row[STOCHASTIC[EVAL_LENGTH]] = stochastic.length
            row[STOCHASTIC[EVAL_SUCCESS]] = stochastic.success
        row[TIME_COST] = int(at.time - self._t0)
        row[FPS] = (at.env_steps - c.last_eval_env_steps) / max(at.time - self._last_eval_time, 1e-9)
        self._last_eval_time, c.last_eval_env_steps = at.time, at.env_steps
        self.metrics.write(row, at.env_steps)
        c.last_return = deterministic.ret
        self._show_status()
        log.info(
            "env steps %d  updates %d  eval return %.2f  length %.1f",
            at.env_steps,
            at.rl_steps,
            deterministic.ret,
            deterministic.length,
        )

    def _finish_deferred(self) -> None:
        """The rest of the deferred evaluation played, then its row."""
        if (evaluation := self.evaluator.finish_deferred()) is not None:
            self.evaluated(evaluation)

    def _show_status(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"upd/s={self._updates_per_s:.0f} eval={self.standing.last_return:.1f}", refresh=False
            )

    def _snapshot(self, perf: float) -> None:
        """The reference's weights-only snapshot, save/agent_<iters>_perf<return>.pt."""
        self.rundir.save(
            {"agent": self.agent.state_dict()}, self.rundir.snapshot(self.standing.env_steps // self.iter_len, perf)
        )

    def _restore(self, state: dict) -> None:
        """A checkpoint that jobs/plan.plan() accepted."""
        self.agent.load_training_state(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        saved = state["counters"]
        self.standing = Standing(**{**saved, "burst": Burst.restored(saved["burst"], self.agent.device)})
        self.config_copy = state["config"]
        rngs.set_from_checkpoint(state["rng"])
        self.env.set_rng_state(state["rng"]["env"])  # at an episode boundary: the env's next reset matches
        log.info("resumed from %s at %d env steps", self.rundir.checkpoint, self.standing.env_steps)


def update_bursts(trainers: list[Trainer], runner: UpdateRunner, limit: int | None = None) -> None:
    """The trainers' bursts in hand, in rounds of one update each through ``runner`` (a trainer's own, or a seed
    axis's joint one), until one burst is over, after ``limit`` rounds, or where a TD3 policy delay parts the
    trainers (a checkpoint from another schedule: the seed axis realigns them). Gradient norms at a burst's last
    update (computed for all in a round where one is at its last, kept by those at theirs). No host read between
    the updates: a non-finite statistic is found once the burst ends or stops (patches/014). Several trainers draw
    from the lead's generators: a seed is then not its run alone (patches/016)."""
    clock, S, bursts = time.perf_counter, len(trainers), [t.standing.burst for t in trainers]
    rounds = min(b.n - b.done for b in bursts)
    for _ in range(rounds if limit is None else min(rounds, limit)):
        if S > 1 and len({t.agent.actor_step_due() for t in trainers}) > 1:
            break
        trainers[0]._check_stop()
        last = [b.done == b.n - 1 for b in bursts]
        t_s = clock()
        batches = [t.buffer.sample(t.cfg.train.batch_size) for t in trainers]
        t_u = clock()
        grad_norms = any(last)
        stats = runner.update_all(batches, grad_norms=grad_norms)
        t_e = clock()
        for t, st, at_last in zip(trainers, stats, last):
            t.timers.update(sample=(t_u - t_s) / S, update=(t_e - t_u) / S)
            if S > 1:
                t.timers["n_joint_updates"] += 1
            if grad_norms and not at_last:
                st = {k: v for k, v in st.items() if summed(k)}
            t._record_update(st)
        for t in trainers:  # in a joint round a deferred evaluation's error is raised later, in its seed's own turn
            t.evaluator.between_updates(hold_errors=S > 1)

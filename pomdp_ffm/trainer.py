"""The training loop of the reference (its policies/learner.py), as an object that owns env, buffer, agent and
progress.csv (docs/reference.md#training-loop):

    random pool -> [float ratio: one burst of updates] -> [collect one episode -> burst of updates
                                                           -> maybe evaluate, log, checkpoint]*

Beside it: the evaluations in ``evaluation.py``, the generators' states a checkpoint holds in ``checkpoint.py``, the
run directory (file names, lock, atomic writes) in ``rundir.py``. ``start.py`` checks and locks the directory and
hands the trainer, on resume, the loaded checkpoint.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from .acting_graph import make_actor
from .agent import RecurrentAgent
from .buffer import SeqReplayBuffer
from .burst import Burst
from .checkpoint import arrays_to_tensors, host_rng_state, restore_rng, rng_state
from .config import DEVICE_PATTERN, RunConfig, TrainConfig
from .envs import get_task, make_env
from .evaluation import Evaluator
from .graph import make_updater
from .logger import MetricsWriter
from .metrics import burst_row, columns
from .rollout import AgentPolicy, RandomPolicy, Work, answered, play_episodes
from .rundir import CHECKPOINT_FORMAT, RunDir
from .signals import StopSignals

log = logging.getLogger("pomdp_ffm")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = re.fullmatch(DEVICE_PATTERN, name)
    if m is None:
        raise ValueError(f"device={name!r} is not one of ['auto', 'cpu', 'cuda', 'cuda:N']")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available here; use device=cpu or device=auto")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise ValueError(f"device={name!r} but this machine has {torch.cuda.device_count()} CUDA device(s), "
                         f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class TrainingDiverged(FloatingPointError):
    pass


class StopRequested(Exception):
    """Raised between two updates (or before an episode) once a stop signal has arrived."""


@dataclass
class Counters:
    """Where the run stands; saved whole in the checkpoint."""

    env_steps: int = 0
    rollouts: int = 0
    rl_steps: int = 0
    last_eval_iters: int = 0  # the eval clock's value at the last evaluation
    last_eval_env_steps: int = 0
    last_return: float = math.nan
    elapsed: float = 0.0  # wall seconds trained, over all attempts
    pool_done: bool = False
    # The burst of updates in hand: {"n", "done", "sums", "counts"}. A checkpoint taken inside it (a stop
    # signal between two updates) resumes with the updates still owed and the partial sums of its row.
    burst: dict | None = None


@dataclass
class Outcome:
    stopped: bool = False
    signal: int | None = None
    counters: Counters = field(default_factory=Counters)


def env_step_budget(train: TrainConfig, max_len: int) -> tuple[int, int]:
    """(iter_len, budget): the eval clock's "iteration" of iter_len env steps, and the run's env-step budget
    max_len x (pool + iters x rollouts/iter) (docs/reference.md#budgets)."""
    iter_len = train.num_rollouts_per_iter * max_len
    return iter_len, max_len * train.num_init_rollouts_pool + train.num_iters * iter_len


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: RunDir | str | Path, stop: StopSignals | None = None, *,
                 composed: dict | None = None, host_rng: Callable[[], tuple] = host_rng_state,
                 timers: Counter | None = None):
        """Builds everything and checks what only the task can tell; writes nothing. ``stop``: the stop signals it
        looks at between updates and before episodes; ``composed``: the config its checkpoints store (on resume,
        the checkpoint's own); ``host_rng``: numpy's and Python's generator states for its checkpoints (a seed of
        an axis keeps its own apart: pomdp_ffm/seeds.py); ``timers``: wall seconds of its work by part, and counts
        (``n_<part>``), for a benchmark (pomdp_ffm/bench/loop.py); the random pool's apart (``pool_<part>``)."""
        self.cfg = cfg
        self.run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.stop = stop if stop is not None else StopSignals()
        self.config_copy, self.host_rng = composed, host_rng
        self.timers = timers if timers is not None else Counter()
        torch.set_num_threads(cfg.num_threads)
        # Process-wide, as torch's flag is: the seeds of one axis share their config, hence the value.
        torch.backends.cuda.matmul.allow_tf32 = cfg.train.tf32
        seed_everything(cfg.seed)
        self.device = resolve_device(cfg.device)
        t = cfg.train
        self.max_len = get_task(cfg.env.env_name).max_episode_steps  # an unknown task fails here, with the list
        self.iter_len, self.budget = env_step_budget(t, self.max_len)
        # Evaluations come at the ends of the iterations after the initial pool whose count (the env-step clock)
        # is a multiple of eval.log_interval: one must fall in this budget, or the run would train to its end and
        # fail there (with episodes of full length; the pool's shorter episodes can only make it earlier).
        last_iters = self.budget // self.iter_len
        pool_iters = self.max_len * t.num_init_rollouts_pool // self.iter_len
        if last_iters // cfg.eval.log_interval == pool_iters // cfg.eval.log_interval:
            raise ValueError(f"eval.log_interval={cfg.eval.log_interval} divides none of the iterations "
                             f"{pool_iters + 1}-{last_iters} that follow the initial pool on {cfg.env.env_name} "
                             f"(train.num_iters={t.num_iters}, train.num_init_rollouts_pool={t.num_init_rollouts_pool})"
                             ": no evaluation would ever be logged")
        # One env instance for training and evaluation, as in the reference.
        self.env = make_env(cfg.env.env_name, seed=cfg.seed)
        try:
            self._build(cfg)
        except BaseException:
            self.env.close()  # (a PyBullet env holds its physics server)
            raise

    def _build(self, cfg: RunConfig) -> None:
        t = cfg.train
        self.obs_dim = self.env.observation_space.shape[0]
        self.act_dim = self.env.action_space.shape[0]
        self.seq_len = self.max_len if t.sampled_seq_len == -1 else t.sampled_seq_len
        self.buffer = SeqReplayBuffer(int(t.buffer_size), self.obs_dim, self.act_dim, self.seq_len,
                                      t.sample_weight_baseline, seed=cfg.seed)
        self.agent = RecurrentAgent(self.obs_dim, self.act_dim, cfg.policy).to(self.device)
        # agent.update, or its CUDA-graph replays on CUDA with train.cuda_graph (pomdp_ffm/graph.py)
        self.updater = make_updater(self.agent, t.cuda_graph)
        # What acts (collection, evaluation): the agent, or its acting step as graph replays on CUDA
        self.acting = make_actor(self.agent, t.cuda_graph)
        self.evaluator = Evaluator(cfg, self.env, self.acting, self.agent, self.timers)
        self.columns = columns(self.agent.algo.metrics, cfg.eval.eval_stochastic)
        self.counters = Counters()
        self.metrics: MetricsWriter | None = None
        self.bar = None
        self._updates_per_s = 0.0
        self._closed = False

    # --- the loop ---------------------------------------------------------------------------------------------
    def train(self, resume: dict | None = None) -> Outcome:
        """Train to the budget, or until a stop signal (then checkpoint). The run directory must be locked."""
        self.open(resume)
        try:
            while self.step():
                pass
        except StopRequested:
            return self.stopped()
        return self.finished()

    def open(self, resume: dict | None = None) -> None:
        """Restore a checkpoint (if any) and open the metrics writer and the progress bar."""
        if resume is not None:
            self._restore(resume)
        self.metrics = MetricsWriter(self.run.progress, self.columns,
                                     self.run / RunDir.TENSORBOARD if self.cfg.eval.log_tensorboard else None,
                                     checkpoint=None if resume is None else resume["progress"])
        self._t0 = time.time() - self.counters.elapsed
        self._last_eval_time = time.time()
        self.bar = tqdm(total=self.budget, initial=self.counters.env_steps, unit="step", dynamic_ncols=True,
                        disable=not self.cfg.progress, mininterval=2.0, desc=self.cfg.env.env_name)

    def step(self) -> bool:
        """One unit of work (``step_parts``), its acting steps and bursts answered here. False once the budget is
        reached; raises StopRequested when a stop signal has arrived."""
        Work(self.step_parts()).run()
        return self.counters.env_steps < self.budget

    def step_parts(self):
        """One unit of work: the random pool and its burst, the rest of a burst a stop interrupted, or one
        iteration; as a generator that yields each acting step of the agent or of the random pool (an
        ``ActRequest``) and each burst of updates (a ``Burst``) for its caller to answer (``rollout.Work``): the
        trainer itself (``step``), or a seed axis that gathers several seeds' (pomdp_ffm/seeds.py)."""
        c = self.counters
        if not c.pool_done:
            yield from self._initial_pool()
        elif c.burst is not None:  # stopped inside an iteration's updates
            yield from self._finish_iteration()
        elif c.env_steps < self.budget:
            self.check_stop()
            yield from self._iteration()

    def _initial_pool(self):
        t, c = self.cfg.train, self.counters
        while c.env_steps < t.num_init_rollouts_pool * self.max_len:
            yield from self._collect(random_actions=True)
        # The reference bursts int(steps x ratio) updates after the pool for a float ratio only; an int count
        # of updates per iteration starts with the first iteration.
        if isinstance(t.num_updates_per_iter, float):
            if c.burst is None:
                self._start_burst(int(c.env_steps * t.num_updates_per_iter))
            yield from self._run_burst()
        c.pool_done = True

    def _iteration(self):
        steps = 0
        for _ in range(self.cfg.train.num_rollouts_per_iter):
            steps += yield from self._collect(random_actions=False)
        ratio = self.cfg.train.num_updates_per_iter
        self._start_burst(ratio if isinstance(ratio, int) else math.ceil(steps * ratio))
        yield from self._finish_iteration()

    def _finish_iteration(self):
        yield from self._run_burst()
        c, ev = self.counters, self.cfg.eval
        iters = c.env_steps // self.iter_len  # the reference's env-step clock
        if iters != c.last_eval_iters and iters % ev.log_interval == 0:
            c.last_eval_iters = iters
            snapshot = ev.save_interval > 0 and c.env_steps > 0.75 * self.budget and iters % ev.save_interval == 0
            checkpoint = iters % self.cfg.checkpoint.interval == 0
            # Deferred only where nothing waits for its result: a snapshot (named by the return), a checkpoint
            # (which holds the rows), the run's end.
            if ev.during_updates and not (snapshot or checkpoint) and c.env_steps < self.budget:
                self.evaluator.defer(self._clocks())
                return
            self.log_evaluation(*(yield from self.evaluator.evaluations()))
            if snapshot:
                self._snapshot(c.last_return)
            if checkpoint:
                self.save_checkpoint()

    def stopped(self) -> Outcome:
        c = self.counters
        self.save_checkpoint()
        saved = "checkpoint saved" if self.cfg.checkpoint.save_buffer else \
            "checkpoint saved without its replay buffer (checkpoint.save_buffer=false): the run cannot be resumed"
        log.info("stopped by signal %d at %d env steps, %d updates; %s", self.stop.requested, c.env_steps,
                 c.rl_steps, saved)
        return Outcome(stopped=True, signal=self.stop.requested, counters=c)

    def finished(self) -> Outcome:
        c = self.counters
        self._settle_deferred()
        self._snapshot(c.last_return)
        self.save_checkpoint()
        log.info("finished: %d env steps, %d updates, last eval return %.2f", c.env_steps, c.rl_steps, c.last_return)
        return Outcome(counters=c)

    def check_stop(self) -> None:
        if self.stop.requested is not None:
            raise StopRequested

    def close(self) -> None:
        """Close what the trainer holds (the progress bar, progress.csv, the envs); once, whoever calls it."""
        if self._closed:
            return
        self._closed = True
        if self.bar is not None:
            self.bar.close()
        if self.metrics is not None:
            self.metrics.close()
        try:
            self.evaluator.close()
        finally:
            self.env.close()

    # --- collect ----------------------------------------------------------------------------------------------
    def _collect(self, random_actions: bool):
        """One episode into the buffer; its length."""
        envs = [self.env]
        policy = RandomPolicy(envs) if random_actions else AgentPolicy(self.acting, deterministic=False)
        timers = Counter() if random_actions else self.timers
        (ep,) = yield from play_episodes(envs, policy, record=True, on_step=self.bar.update if self.bar else None,
                                         timers=timers)
        if random_actions:  # apart: the pool's acting is a uniform draw
            self.timers.update({f"pool_{k}": v for k, v in timers.items()})
        self.timers["n_pool_steps" if random_actions else "n_steps"] += ep.length
        if ep.length >= 2:
            self.buffer.add_episode(ep)
        else:
            # Counted in env_steps like every step taken (patches/011-length-1-episodes.md).
            log.warning("episode of length %d not stored (the sequence buffer needs >= 2 steps)", ep.length)
        self.counters.env_steps += ep.length
        self.counters.rollouts += 1
        return ep.length

    # --- burst of updates -------------------------------------------------------------------------------------
    def _start_burst(self, n: int) -> None:
        self.counters.burst = {"n": n, "done": 0, "sums": {}, "counts": {}}

    def _run_burst(self):
        """The burst in hand (counters.burst), yielded as a ``Burst`` for its updates to be run, then logged.
        No host sync between its updates: statistics are summed on the device, and a non-finite one is found
        (the first update that had it) when the burst ends or stops (patches/014-update-without-host-sync.md)."""
        c = self.counters
        if c.burst["n"] <= 0 or len(self.buffer) == 0:
            c.burst = None
            yield from self._finish_deferred()
            return
        burst = Burst(self, c.burst)
        t0 = time.time()
        try:
            yield burst
        finally:
            # One read of the device per burst (or per stop inside it): the sums, for the row or the checkpoint.
            # It waits for the GPU to finish the updates queued: that wait is update time too.
            t_w = time.perf_counter()
            first_bad = burst.close()
            self.timers["update"] += time.perf_counter() - t_w
            if first_bad >= 0:
                self._diverged(first_bad, burst.last)
        c.burst = None
        # A deferred evaluation's row comes before this burst's, as it would have without the deferral.
        yield from self._finish_deferred()
        self.metrics.write(burst_row(burst.state["sums"], burst.counts, burst.last), c.env_steps)
        self._updates_per_s = burst.ran / max(time.time() - t0, 1e-9)
        self._show_status()

    def run_updates(self, burst: Burst, limit: int | None = None) -> None:
        """The burst's remaining updates (at most ``limit`` of them), one after another through this trainer's
        updater; gradient-norm diagnostics at the burst's last update."""
        clock, timers, n = time.perf_counter, self.timers, burst.n
        stop_at = n if limit is None else min(n, burst.done + limit)
        while burst.done < stop_at:
            self.check_stop()
            t_s = clock()
            batch = self.sample_batch()
            t_u = clock()
            stats = self.updater(batch, grad_norms=burst.done == n - 1)
            timers["sample"] += t_u - t_s
            timers["update"] += clock() - t_u
            self.record_update(burst, stats)
            self.evaluator.between_updates()

    def record_update(self, burst: Burst, stats: dict) -> None:
        """One more update, run here or in a seed axis's joint round: counted, and its statistics added to the
        burst."""
        self.timers["n_updates"] += 1
        self.counters.rl_steps += 1
        burst.add(stats, self.counters.rl_steps)

    def sample_batch(self):
        return self.buffer.sample(self.cfg.train.batch_size)

    def _diverged(self, first_bad: int, last: dict) -> None:
        c = self.counters
        path = self.save_checkpoint(self.run / RunDir.DIVERGED)
        last = {k: float(v) for k, v in last.items()}
        msg = (f"non-finite loss first at update {first_bad} (env step {c.env_steps}; the burst ran on to update "
               f"{c.rl_steps}, whose statistics were {last}); checkpoint saved to {path}")
        log.error(msg)
        raise TrainingDiverged(msg)

    # --- log --------------------------------------------------------------------------------------------------
    def log_evaluation(self, deterministic: tuple[float, float, float],
                       stochastic: tuple[float, float, float] | None = None, at: dict | None = None) -> float:
        """The evaluation row (returns, lengths, success rates and the clocks); the deterministic mean return.
        ``at``: the clocks when the evaluation was due (``_clocks()``), for one played later; default: now."""
        ret, length, success = deterministic
        c = self.counters
        at = at if at is not None else self._clocks()
        now = at["time"]
        row = {"z/env_steps": at["env_steps"], "z/rollouts": at["rollouts"], "z/rl_steps": at["rl_steps"],
               "metrics/total_steps_eval": length, "metrics/return_eval_total": ret,
               "metrics/success_rate_eval": success}
        if stochastic is not None:
            r_s, l_s, s_s = stochastic
            row.update({"metrics/total_steps_eval_sto": l_s, "metrics/return_eval_total_sto": r_s,
                        "metrics/success_rate_eval_sto": s_s})
        row["z/time_cost"] = int(now - self._t0)
        row["z/fps"] = (at["env_steps"] - c.last_eval_env_steps) / max(now - self._last_eval_time, 1e-9)
        self._last_eval_time, c.last_eval_env_steps = now, at["env_steps"]
        self.metrics.write(row, at["env_steps"])
        c.last_return = ret
        self._show_status()
        log.info("env steps %d  updates %d  eval return %.2f  length %.1f", at["env_steps"], at["rl_steps"], ret,
                 length)
        return ret

    def _clocks(self) -> dict:
        c = self.counters
        return {"env_steps": c.env_steps, "rollouts": c.rollouts, "rl_steps": c.rl_steps, "time": time.time()}

    def _finish_deferred(self):
        """The rest of the deferred evaluation (its acting steps yielded as any evaluation's), then its row."""
        done = yield from self.evaluator.rest()
        if done is not None:
            result, at = done
            self.log_evaluation(result, None, at)

    def _settle_deferred(self) -> None:
        """The deferred evaluation played to its end and logged at once (before a checkpoint, which holds the
        rows)."""
        answered(self._finish_deferred())

    def _show_status(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"upd/s={self._updates_per_s:.0f} eval={self.counters.last_return:.1f}",
                                     refresh=False)

    # --- checkpoint -------------------------------------------------------------------------------------------
    def _snapshot(self, perf: float) -> None:
        """The reference's agent snapshot: save/agent_<iters>_perf<return>.pt (weights only)."""
        self.run.save({"agent": self.agent.state_dict()},
                      self.run.snapshot(self.counters.env_steps // self.iter_len, perf))

    def save_checkpoint(self, path: Path | None = None) -> Path:
        self._settle_deferred()
        self.counters.elapsed = time.time() - self._t0
        state = {
            "format": CHECKPOINT_FORMAT,
            "config": self.config_copy,
            "agent": self.agent.training_state(),
            "counters": dataclasses.asdict(self.counters),
            "progress": self.metrics.state(),
            "rng": rng_state(self.env, self.host_rng),
            "buffer": arrays_to_tensors(self.buffer.state_dict()) if self.cfg.checkpoint.save_buffer else None,
        }
        return self.run.save(state, path or self.run.checkpoint)

    def _restore(self, state: dict) -> None:
        """A checkpoint that pomdp_ffm.start.plan() accepted (the format, the config, the buffer)."""
        self.agent.load_training_state(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.counters = Counters(**state["counters"])
        self.config_copy = state["config"]
        restore_rng(state["rng"], self.env)
        log.info("resumed from %s at %d env steps", self.run.checkpoint, self.counters.env_steps)

"""The reference's training loop (its policies/learner.py; docs/reference.md#training-loop), owning env, buffer,
agent and progress.csv: random pool -> [float ratio: a burst of updates] -> [collect an episode -> a burst of
updates -> maybe evaluate, log, checkpoint]*."""
from __future__ import annotations

import logging
import math
import random
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from .acting_graph import make_actor
from .agent import RecurrentAgent
from .buffer import SeqReplayBuffer
from .config import DEVICE_PATTERN, RunConfig, TrainConfig
from .envs import get_task, make_env
from .evaluation import Evaluator
from .graph import make_updater
from .logger import MetricsWriter
from .metrics import (ENV_STEPS, EVAL_LENGTH, EVAL_RETURN, EVAL_SUCCESS, FPS, RL_STEPS, ROLLOUTS, STOCHASTIC,
                      TIME_COST, burst_row, columns, summed)
from .rollout import AgentPolicy, RandomPolicy, Work, answered, play_episodes
from .rundir import CHECKPOINT_FORMAT, RunDir
from .signals import StopSignals

log = logging.getLogger("pomdp_ffm")


def host_rng_state() -> tuple:
    return np.random.get_state(), random.getstate()


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


class TrainingDiverged(FloatingPointError):
    pass


class StopRequested(Exception):
    """Raised between two updates or before an episode."""


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
    burst: dict | None = None  # the burst in hand (trainer.Burst's state): a checkpoint inside it resumes it


@dataclass
class Outcome:
    stopped: bool = False
    signal: int | None = None
    counters: Counters = field(default_factory=Counters)


def env_step_budget(train: TrainConfig, max_len: int) -> tuple[int, int]:
    """(env steps per iteration of the eval clock, the run's env-step budget) (docs/reference.md#budgets)."""
    iter_len = train.num_rollouts_per_iter * max_len
    return iter_len, max_len * train.num_init_rollouts_pool + train.num_iters * iter_len


class Burst:
    """A burst of updates (counters.burst) summed on the device: ``add`` reads nothing on the host, ``close`` reads
    the sums once into its state (for its row, or the checkpoint of a stop inside it)."""

    def __init__(self, trainer, state: dict):
        self.trainer, self.state = trainer, state
        self.n, self.start = state["n"], state["done"]
        dev = trainer.agent.device
        # Float64 sums, as the reference's float sums; a count per key, as a TD3 policy delay skips actor steps.
        self.sums = {k: torch.as_tensor(v, dtype=torch.float64, device=dev) for k, v in state["sums"].items()}
        self.counts = state["counts"]
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=dev)
        self.last: dict[str, torch.Tensor] = {}

    @property
    def done(self) -> int:
        return self.state["done"]

    def answer(self) -> None:
        self.trainer.run_updates(self)

    def add(self, stats: dict[str, torch.Tensor], update: int) -> None:
        """Update number ``update``'s statistics summed and checked on the device, as one vector: each operation
        here is a kernel launch outside the update's graph (53 for SAC's statistics one at a time, 13 so)."""
        values = torch.stack(list(stats.values()))  # a copy: what the update returned may be overwritten
        finite = torch.isfinite(values).all()
        self.first_bad = torch.where((self.first_bad < 0) & ~finite, update, self.first_bad)
        old, added = [], []
        for k, v in zip(stats, values.double().unbind()):
            if summed(k):
                if k in self.sums:
                    old.append(self.sums[k])
                    added.append(v)
                else:
                    self.sums[k] = v
                self.counts[k] = self.counts.get(k, 0) + 1
        if old:
            torch._foreach_add_(old, added)  # in place, the same float64 additions
        self.last = dict(zip(stats, values.unbind()))
        self.state["done"] += 1

    def close(self) -> int:
        """Read the sums into the burst's state; the update count at the first non-finite statistic, or -1."""
        self.state["sums"] = {k: float(v) for k, v in self.sums.items()}
        return int(self.first_bad)


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: RunDir | str | Path, stop: StopSignals | None = None, *,
                 composed: dict | None = None, host_rng: Callable[[], tuple] = host_rng_state,
                 timers: Counter | None = None):
        """Writes nothing. ``composed``: the config its checkpoints store; ``host_rng``: numpy's and Python's states
        for them (a seed of an axis keeps its own); ``timers``: seconds and counts (``n_<part>``) by part."""
        self.cfg = cfg
        self.run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.stop = stop if stop is not None else StopSignals()
        self.config_copy, self.host_rng = composed, host_rng
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
        # Evaluations end the post-pool iterations whose count is a multiple of eval.log_interval: without one in
        # the budget the run would fail at its end (full-length episodes; shorter ones only make it earlier).
        last_iters = self.budget // self.iter_len
        pool_iters = self.max_len * t.num_init_rollouts_pool // self.iter_len
        if last_iters // cfg.eval.log_interval == pool_iters // cfg.eval.log_interval:
            raise ValueError(f"eval.log_interval={cfg.eval.log_interval} divides none of the iterations "
                             f"{pool_iters + 1}-{last_iters} that follow the initial pool on {cfg.env.env_name} "
                             f"(train.num_iters={t.num_iters}, train.num_init_rollouts_pool={t.num_init_rollouts_pool})"
                             ": no evaluation would ever be logged")
        self.counters, self.metrics, self.bar, self._updates_per_s, self._closed = Counters(), None, None, 0.0, False
        # One env instance for training and evaluation, as in the reference.
        self.env = make_env(cfg.env.env_name, seed=cfg.seed)
        try:
            obs_dim, act_dim = self.env.observation_space.shape[0], self.env.action_space.shape[0]
            self.seq_len = self.max_len if t.sampled_seq_len == -1 else t.sampled_seq_len
            self.buffer = SeqReplayBuffer(int(t.buffer_size), obs_dim, act_dim, self.seq_len, t.sample_weight_baseline,
                                          seed=cfg.seed)
            self.agent = RecurrentAgent(obs_dim, act_dim, cfg.policy).to(self.device)
            self.updater = make_updater(self.agent, t.cuda_graph, compile=t.compile)
            self.acting = make_actor(self.agent, t.cuda_graph)
            self.evaluator = Evaluator(cfg, self.env, self.acting, self.agent, self.timers)
            self.columns = columns(self.agent.algo.metrics, cfg.eval.eval_stochastic)
        except BaseException:
            self.env.close()  # a PyBullet env holds its physics server
            raise

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
        """One unit of work, answered here; False once the budget is reached."""
        Work(self.step_parts()).run()
        return self.counters.env_steps < self.budget

    def step_parts(self):
        """One unit of work (the pool, a burst's rest after a stop, or an iteration): items for a caller to answer."""
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
        # As the reference: a float ratio bursts int(steps x ratio) updates after the pool, an int count does not.
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
            # Not deferred where something waits for it: a snapshot (named by the return), a checkpoint, the end.
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
        answered(self._finish_deferred())
        self._snapshot(c.last_return)
        self.save_checkpoint()
        log.info("finished: %d env steps, %d updates, last eval return %.2f", c.env_steps, c.rl_steps, c.last_return)
        return Outcome(counters=c)

    def check_stop(self) -> None:
        if self.stop.requested is not None:
            raise StopRequested

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

    def _collect(self, random_actions: bool):
        """One episode into the buffer; its length."""
        policy = RandomPolicy([self.env]) if random_actions else AgentPolicy(self.acting, deterministic=False)
        timers = Counter() if random_actions else self.timers  # the pool's apart: its acting is a uniform draw
        (ep,) = yield from play_episodes([self.env], policy, record=True,
                                         on_step=self.bar.update if self.bar else None, timers=timers)
        if random_actions:
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

    def _start_burst(self, n: int) -> None:
        self.counters.burst = {"n": n, "done": 0, "sums": {}, "counts": {}}

    def _run_burst(self):
        """The burst in hand, yielded for its updates to be run, then logged. No host sync between its updates: a
        non-finite statistic is found once the burst ends or stops (patches/014-update-without-host-sync.md)."""
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
            # The burst's one device read waits for the queued updates: update time too.
            t_w = time.perf_counter()
            first_bad = burst.close()
            self.timers["update"] += time.perf_counter() - t_w
            if first_bad >= 0:
                self._diverged(first_bad, burst.last)
        c.burst = None
        # A deferred evaluation's row comes before this burst's, as it would have without the deferral.
        yield from self._finish_deferred()
        self.metrics.write(burst_row(burst.state["sums"], burst.counts, burst.last), c.env_steps)
        self._updates_per_s = (burst.done - burst.start) / max(time.time() - t0, 1e-9)
        self._show_status()

    def run_updates(self, burst: Burst, limit: int | None = None) -> None:
        """The burst's remaining updates (at most ``limit``); gradient norms at its last."""
        clock, timers, n = time.perf_counter, self.timers, burst.n
        stop_at = n if limit is None else min(n, burst.done + limit)
        while burst.done < stop_at:
            self.check_stop()
            t_s = clock()
            batch = self.sample_batch()
            t_u = clock()
            stats = self.updater(batch, grad_norms=burst.done == n - 1)
            timers.update(sample=t_u - t_s, update=clock() - t_u)
            self.record_update(burst, stats)
            self.evaluator.between_updates()

    def record_update(self, burst: Burst, stats: dict) -> None:
        """An update run here or in a seed axis's joint round: counted, its statistics added to the burst."""
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

    def log_evaluation(self, deterministic: tuple[float, float, float],
                       stochastic: tuple[float, float, float] | None = None, at: dict | None = None) -> float:
        """Log the evaluation row; the deterministic mean return. ``at``: the clocks when it was due (default now)."""
        (ret, length, success), c, at = deterministic, self.counters, at or self._clocks()
        now = at["time"]
        row = {ENV_STEPS: at["env_steps"], ROLLOUTS: at["rollouts"], RL_STEPS: at["rl_steps"], EVAL_LENGTH: length,
               EVAL_RETURN: ret, EVAL_SUCCESS: success}
        if stochastic is not None:
            row.update(zip((STOCHASTIC[k] for k in (EVAL_RETURN, EVAL_LENGTH, EVAL_SUCCESS)), stochastic))
        row[TIME_COST] = int(now - self._t0)
        row[FPS] = (at["env_steps"] - c.last_eval_env_steps) / max(now - self._last_eval_time, 1e-9)
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
        """The rest of the deferred evaluation (its acting steps yielded), then its row."""
        done = yield from self.evaluator.rest()
        if done is not None:
            self.log_evaluation(done[0], None, done[1])

    def _show_status(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"upd/s={self._updates_per_s:.0f} eval={self.counters.last_return:.1f}",
                                     refresh=False)

    def _snapshot(self, perf: float) -> None:
        """The reference's weights-only snapshot, save/agent_<iters>_perf<return>.pt."""
        self.run.save({"agent": self.agent.state_dict()},
                      self.run.snapshot(self.counters.env_steps // self.iter_len, perf))

    def save_checkpoint(self, path: Path | None = None) -> Path:
        """Tensors and plain containers only, for ``rundir.load_checkpoint`` to read tensors-only."""
        answered(self._finish_deferred())  # played and logged now: the checkpoint holds the rows
        self.counters.elapsed = time.time() - self._t0
        (kind, keys, pos, has_gauss, cached), py_state = self.host_rng()
        np_state = {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                    "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
        rng = {"torch": torch.get_rng_state(), "numpy": np_state, "python": py_state, "env": self.env.rng_state(),
               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        buffer = {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
                  for k, v in self.buffer.state_dict().items()} if self.cfg.checkpoint.save_buffer else None
        state = {"format": CHECKPOINT_FORMAT, "config": self.config_copy, "agent": self.agent.training_state(),
                 "counters": asdict(self.counters), "progress": self.metrics.state(), "rng": rng,
                 "buffer": buffer}
        return self.run.save(state, path or self.run.checkpoint)

    def _restore(self, state: dict) -> None:
        """A checkpoint that start.plan() accepted."""
        self.agent.load_training_state(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.counters = Counters(**state["counters"])
        self.config_copy = state["config"]
        rng, n = state["rng"], state["rng"]["numpy"]
        torch.set_rng_state(rng["torch"].cpu())
        np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                             n["cached_gaussian"]))
        random.setstate(rng["python"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.env.set_rng_state(rng["env"])  # at an episode boundary: the env's next reset matches
        log.info("resumed from %s at %d env steps", self.run.checkpoint, self.counters.env_steps)

"""The training loop of the reference (its policies/learner.py), as an object that owns env, buffer, agent and
metrics (docs/reference.md#training-loop):

    random pool -> [float ratio: one burst of updates] -> [collect one episode -> updates -> maybe eval]*

The run directory (file names, lock, atomic writes) belongs to ``RunDir``; ``pomdp_ffm.train`` verifies it and
hands the trainer a locked directory and, on resume, the loaded checkpoint.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import random
import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from tqdm import tqdm

from .agent import ActorSnapshot, OffStreamActing, RecurrentAgent
from .buffer import SeqReplayBuffer
from .config import DEVICE_PATTERN, RunConfig, TrainConfig
from .envs import EnvInWorker, get_task, make_env, worker_start_method
from .graph import make_actor, make_updater
from .logger import MetricsWriter, columns_for
from .rollout import ActRequest, AgentPolicy, EnvsStepping, RandomPolicy, answered, play_episodes
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


class _StopRequested(Exception):
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


class Burst:
    """The running sums of one burst of updates (counters.burst: {"n", "done", "sums", "counts"}) on the device:
    ``add`` after each update reads nothing on the host; ``close`` reads the sums once and stores them in the
    burst's state (for its row, or for the checkpoint of a stop inside it)."""

    def __init__(self, trainer: "Trainer", state: dict):
        self.trainer, self.state = trainer, state
        self.n, self.start = state["n"], state["done"]
        dev = trainer.agent.device
        # Float64 sums of the float32 statistics, as the reference's float sums; with a TD3 policy delay the
        # actor's statistics come from fewer updates, hence a count per key.
        self.sums = {k: torch.as_tensor(v, dtype=torch.float64, device=dev) for k, v in state["sums"].items()}
        self.counts = state["counts"]
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=dev)
        self.last: dict[str, torch.Tensor] = {}

    @property
    def done(self) -> int:
        return self.state["done"]

    @property
    def ran(self) -> int:
        return self.done - self.start

    def add(self, stats: dict[str, torch.Tensor]) -> None:
        """One update's statistics (scalars): counted, summed, checked for non-finite values (on the device).
        As one vector, not one statistic at a time: on a GPU each operation here is a kernel launch outside the
        update's graph (53 for SAC's statistics one at a time, 13 as a vector)."""
        t = self.trainer
        t._count("updates")
        t.counters.rl_steps += 1
        values = torch.stack(list(stats.values()))  # a copy: what the update returned may be overwritten
        finite = torch.isfinite(values).all()
        self.first_bad = torch.where((self.first_bad < 0) & ~finite, t.counters.rl_steps, self.first_bad)
        as_double = values.double().unbind()
        old, added = [], []
        for k, v in zip(stats, as_double):
            if not k.endswith("grad_norm"):
                if k in self.sums:
                    old.append(self.sums[k])
                    added.append(v)
                else:
                    self.sums[k] = v
                self.counts[k] = self.counts.get(k, 0) + 1
        if old:
            torch._foreach_add_(old, added)  # each sum its own tensor: in place, the same float64 additions
        self.last = dict(zip(stats, values.unbind()))
        self.state["done"] += 1

    def close(self) -> int:
        """Read the sums into the burst's state; the update count at the first non-finite statistic, or -1."""
        self.state["sums"] = {k: float(v) for k, v in self.sums.items()}
        return int(self.first_bad)


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: RunDir | str | Path, stop: StopSignals | None = None):
        """Builds everything and checks what only the task can tell; writes nothing."""
        self.cfg = cfg
        self.run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.stop = stop if stop is not None else StopSignals()
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
        if cfg.eval.workers and not cfg.eval_in_workers():
            log.warning("eval.workers=true changes nothing here: with eval.episodes_together=false or one "
                        "evaluation episode, the evaluation plays on the training env")
        if cfg.env_workers():
            worker_start_method()  # one the workers cannot use is refused before any starts
        # One env instance for training and evaluation, as in the reference.
        self.env = (EnvInWorker if t.env_worker else make_env)(cfg.env.env_name, seed=cfg.seed)
        try:
            self._build(cfg)
        except BaseException:
            self.env.close()  # a worker process must not outlive a trainer that was never built
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
        self.columns = columns_for(self.agent.algo.stat_keys, cfg.eval.eval_stochastic)
        self.counters = Counters()
        self.metrics: MetricsWriter | None = None
        self.config_copy: dict | None = None  # the composed config, stored in every checkpoint
        self._eval_envs: list = []
        # An evaluation played during the next burst of updates (eval.during_updates), and what it acts with.
        self._deferred: _DeferredEvaluation | None = None
        self._deferred_error: Exception | None = None  # one it raised in a seed axis's joint round
        self._actor_copy: ActorSnapshot | OffStreamActing | None = None
        self._queued = QueuedUpdates(self.device)
        # Wall seconds and counts of this process's work, by part (python -m pomdp_ffm.bench loop reads them).
        self.timers: Counter = Counter()
        self.pool_timers: Counter = Counter()  # the random pool's, apart: its "acting" is a uniform draw
        self.bar = None
        self._updates_per_s = 0.0
        # numpy's and Python's global generator states as this run's own, for checkpoints: None reads the
        # globals; a seed axis sets it while this run's code runs with another seed's left in place.
        self.host_rng = None

    # ------------------------------------------------------------------------------------------------
    def train(self, resume: dict | None = None) -> Outcome:
        """Train to the budget, or until a stop signal (then checkpoint). The run directory must be locked."""
        self.open(resume)
        try:
            try:
                while self.step():
                    pass
            except _StopRequested:
                return self.stopped()
            return self.finished()
        finally:
            self.shut()

    # The same in parts, for a caller that interleaves several trainers (pomdp_ffm/seeds.py).
    def open(self, resume: dict | None = None) -> None:
        """Restore a checkpoint (if any) and open the metrics writer and the progress bar."""
        if resume is not None:
            self._restore(resume)
        self.metrics = MetricsWriter(self.run.progress, self.columns,
                                     self.run / RunDir.TENSORBOARD if self.cfg.eval.log_tensorboard else None,
                                     checkpoint_rows=None if resume is None else resume["progress_rows"])
        self._t0 = time.time() - self.counters.elapsed
        self._last_eval_time = time.time()
        self.bar = tqdm(total=self.budget, initial=self.counters.env_steps, unit="step", dynamic_ncols=True,
                        disable=not self.cfg.progress, mininterval=2.0, desc=self.cfg.env.env_name)

    def step(self) -> bool:
        """One unit of work: the random pool and its burst, the rest of a burst a stop interrupted, or one
        iteration. False once the budget is reached. Raises _StopRequested when a stop signal has arrived."""
        self.drive(self.step_parts())
        return self.counters.env_steps < self.budget

    def step_parts(self):
        """``step()`` as a generator that hands its work to its caller: each acting step of the agent or of the
        random pool (an ``ActRequest``, answered with (actions, state)) and each burst of updates (a ``Burst``,
        whose updates the caller runs before resuming it). ``drive`` does both here; pomdp_ffm/seeds.py gathers
        several seeds' steps and bursts. An exception in either is thrown back into it, so that a burst records
        how far it got."""
        c = self.counters
        if not c.pool_done:
            yield from self._initial_pool()
        elif c.burst is not None:  # stopped inside an iteration's updates
            yield from self._finish_iteration()
        elif c.env_steps < self.budget:
            self._check_stop()
            yield from self._iteration()

    def drive(self, parts, item=None, until=None):
        """Run a generator of ``step_parts`` from its start, or from the ``item`` it has just yielded: acting
        steps answered by their policy, bursts run alone with this trainer's updater. With ``until``, the first
        item for which ``until(item)`` is true is returned unanswered (the generator suspended there); None once
        the generator has ended."""
        item = next(parts, None) if item is None else item
        while item is not None and not (until is not None and until(item)):
            item = _advance(parts, lambda: self._answer(item))
        return item

    def resume(self, parts, answer, until=None):
        """``drive`` on from the item ``parts`` is suspended at, answered with ``answer()``."""
        item = _advance(parts, answer)
        return None if item is None else self.drive(parts, item, until)

    def _answer(self, item: "ActRequest | EnvsStepping | Burst"):
        if isinstance(item, Burst):
            self.run_updates(item)
            return None
        return item.answer()

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

    def shut(self) -> None:
        if self._deferred is not None:
            log.warning("the evaluation due at env step %d was not finished: progress.csv has no row for it",
                        self._deferred.at["env_steps"])
            self._deferred = None
        if self.bar is not None:
            self.bar.close()
        if self.metrics is not None:
            self.metrics.close()

    def _check_stop(self) -> None:
        if self.stop.requested is not None:
            raise _StopRequested

    # ------------------------------------------------------------------------------------------------
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
                self._defer_evaluation()
                return
            self.log_evaluation(*(yield from self._evaluations()))
            if snapshot:
                self._snapshot(c.last_return)
            if checkpoint:
                self.save_checkpoint()

    # ------------------------------------------------------------------------------------------------
    def collect_episode(self, random_actions: bool) -> int:
        """One episode into the buffer; its length."""
        return answered(self._collect(random_actions))

    def _collect(self, random_actions: bool):
        envs = [self.env]
        policy = RandomPolicy(envs) if random_actions else AgentPolicy(self.acting, deterministic=False)
        timers = self.pool_timers if random_actions else self.timers
        (ep,) = yield from play_episodes(envs, policy, record=True, on_step=self.bar.update if self.bar else None,
                                         timers=timers)
        self._count("pool_steps" if random_actions else "steps", ep.length)
        if ep.length >= 2:
            self.buffer.add_episode(ep.observs, ep.actions, ep.rewards, ep.terminals, ep.next_observs)
        else:
            # Counted in env_steps like every step taken (patches/011-length-1-episodes.md).
            log.warning("episode of length %d not stored (the sequence buffer needs >= 2 steps)", ep.length)
        self.counters.env_steps += ep.length
        self.counters.rollouts += 1
        return ep.length

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
        row = {f"rl_loss/{k}": v / burst.counts[k] for k, v in burst.state["sums"].items()}
        row.update({f"rl_loss/{k}": float(v) for k, v in burst.last.items() if k.endswith("grad_norm")})
        self.metrics.write(row, c.env_steps)
        self._updates_per_s = burst.ran / max(time.time() - t0, 1e-9)
        self._show_status()

    def run_updates(self, burst: "Burst", limit: int | None = None) -> None:
        """The burst's remaining updates (at most ``limit`` of them), one after another through this trainer's
        updater; gradient-norm diagnostics at the burst's last update."""
        clock, timers, n = time.perf_counter, self.timers, burst.n
        stop_at = n if limit is None else min(n, burst.done + limit)
        while burst.done < stop_at:
            self._check_stop()
            t_s = clock()
            batch = self.sample_batch()
            t_u = clock()
            stats = self.updater(batch, grad_norms=burst.done == n - 1)
            timers["sample"] += t_u - t_s
            timers["update"] += clock() - t_u
            burst.add(stats)
            self.between_updates()

    def between_updates(self, hold_errors: bool = False) -> None:
        """After an update has been issued: the deferred evaluation (if any) advanced as far as it goes without
        waiting for the updates, i.e. while the device is still busy with the updates queued, or while its envs
        step in workers (on a CPU with envs in this process it waits for the burst's end, which costs the same).
        An error in it ends it; ``hold_errors`` (a seed axis's joint rounds, which run every seed's) keeps the
        error for this trainer's own turn, where ``_finish_deferred`` raises it."""
        d = self._deferred
        if d is None:
            return
        self._queued.mark()
        try:
            while d.item is not None and d.ready(self._queued.busy()):
                d.advance()
        except Exception as e:
            self._deferred = None  # its generator is dead: nothing of it is left to play or to log
            if not hold_errors:
                raise
            self._deferred_error = e

    def sample_batch(self):
        return self.buffer.sample(self.cfg.train.batch_size)

    def _show_status(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"upd/s={self._updates_per_s:.0f} eval={self.counters.last_return:.1f}",
                                     refresh=False)

    def _diverged(self, first_bad: int, last: dict) -> None:
        c = self.counters
        path = self.save_checkpoint(self.run / RunDir.DIVERGED)
        last = {k: float(v) for k, v in last.items()}
        msg = (f"non-finite loss first at update {first_bad} (env step {c.env_steps}; the burst ran on to update "
               f"{c.rl_steps}, whose statistics were {last}); checkpoint saved to {path}")
        log.error(msg)
        raise TrainingDiverged(msg)

    # ------------------------------------------------------------------------------------------------
    def evaluate(self, deterministic: bool = True) -> tuple[float, float, float]:
        """Mean return, mean length and success rate over num_eval_tasks episodes (docs/reference.md#evaluation).
        (``_evaluate`` as a generator of its acting steps, answered here.)

        The reference plays them one after another on the training env. With ``eval.episodes_together`` the
        deterministic episodes are played together, one batched actor forward per step, on copies of the env:
        copy k starts from the RNG state the training env would have after k resets, and the training env is
        left where the k-th reset would leave it, so the episodes and the env's stream are the reference's.
        (This needs env steps that draw nothing from the env's RNG: true of every registered task, see
        tests/test_trainer.py.) A stochastic evaluation stays one after another: its action noise is drawn
        per step, and a batch would draw it in another order."""
        return answered(self._evaluate(deterministic))

    def _evaluate(self, deterministic: bool, acting=None, on_copies: bool = False):
        """``acting``: what acts (default: the trainer's); ``on_copies``: the episodes on copies of the env even for
        one episode (a deferred evaluation, while the training env collects)."""
        n, eval_timers = self.cfg.env.num_eval_tasks, Counter()
        policy = AgentPolicy(self.acting if acting is None else acting, deterministic)
        if deterministic and self.cfg.eval.episodes_together and (n > 1 or on_copies):
            eps = yield from self._episodes_together(policy, n, eval_timers)
        else:
            eps = []
            for _ in range(n):
                eps += yield from play_episodes([self.env], policy, record=False, timers=eval_timers)
        # Its parts, not its wall time: in a seed axis an evaluation waits while the other seeds act and step.
        self.timers["eval"] += eval_timers["act"] + eval_timers["env"]
        self.timers.update({f"eval_{k}": v for k, v in eval_timers.items()})
        self._count("eval_steps", sum(e.length for e in eps))
        self._count("evals")
        return (float(np.mean([e.ret for e in eps])), float(np.mean([e.length for e in eps])),
                float(np.mean([e.success for e in eps])))

    def _episodes_together(self, policy: AgentPolicy, n: int, timers: dict) -> list:
        while len(self._eval_envs) < n:
            env = (EnvInWorker if self.cfg.eval.workers else make_env)(self.cfg.env.env_name)
            self._eval_envs.append(env)  # closed with the trainer, even if its first reset fails
            # A PyBullet env's first reset builds its scene and starts from a slightly different state than
            # later resets with the same RNG; the training env is always past its first reset here.
            env.reset()
        envs, chain = self._eval_envs[:n], [self.env.rng_state()]

        def reset(i: int) -> np.ndarray:
            obs, rng = envs[i].reset_from(chain[-1])
            chain.append(rng)
            if i == n - 1:  # all resets happen before the first step: a deferred evaluation's too
                self.env.set_rng_state(rng)
            return obs

        return (yield from play_episodes(envs, policy, record=False, reset=reset, timers=timers))

    def _count(self, key: str, n: int = 1) -> None:
        self.timers[f"n_{key}"] += n

    def _evaluations(self):
        """The evaluations a row logs: deterministic, and stochastic with ``eval.eval_stochastic``."""
        deterministic = yield from self._evaluate(deterministic=True)
        stochastic = (yield from self._evaluate(deterministic=False)) if self.cfg.eval.eval_stochastic else None
        return deterministic, stochastic

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

    # --- eval.during_updates ------------------------------------------------------------------------
    def _defer_evaluation(self) -> None:
        """Start the evaluation due now and leave the rest of it to the next burst of updates: a copy of the
        actor as it is now acts, its envs are reset now (so the training env's RNG moves on as the evaluation
        would move it, before the next episode is collected), and the row keeps the clocks of now."""
        self._settle_deferred()  # never two at once (a burst always ends the previous one)
        if self._actor_copy is None:
            copy = ActorSnapshot(self.agent)
            self._actor_copy = OffStreamActing(copy) if self.device.type == "cuda" else copy
        self._actor_copy.take()
        self._deferred = _DeferredEvaluation(self._evaluate(True, self._actor_copy, on_copies=True),
                                             self._clocks(), elsewhere=self.cfg.eval.workers)

    def _finish_deferred(self):
        """The rest of the deferred evaluation (its acting steps yielded as any evaluation's), then its row."""
        if self._deferred_error is not None:
            e, self._deferred_error = self._deferred_error, None
            raise e
        d, self._deferred = self._deferred, None
        if d is not None:
            self.log_evaluation((yield from d.rest()), None, d.at)

    def _settle_deferred(self) -> None:
        """The deferred evaluation played to its end and logged at once (before a checkpoint, which holds the
        rows)."""
        if self._deferred is not None or self._deferred_error is not None:
            answered(self._finish_deferred())

    # ------------------------------------------------------------------------------------------------
    def _snapshot(self, perf: float) -> None:
        """The reference's agent snapshot: save/agent_<iters>_perf<return>.pt (weights only)."""
        self.run.save({"agent": self.agent.state_dict()},
                      self.run.snapshot(self.counters.env_steps // self.iter_len, perf))

    def checkpoint_state(self) -> dict:
        """Everything a resumed run needs, as tensors and plain containers only (loadable tensors-only)."""
        self.counters.elapsed = time.time() - self._t0
        env_rng = self.env.rng_state()
        np_state, py_state = self.host_rng() if self.host_rng else (np.random.get_state(), random.getstate())
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.config_copy,
            "agent": self.agent.training_state(),
            "counters": dataclasses.asdict(self.counters),
            "progress_rows": [list(r) for r in self.metrics.rows],
            "rng": {"torch": torch.get_rng_state(), "numpy": _numpy_rng_to_plain(np_state), "python": py_state,
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                    "env": env_rng},
            "buffer": _arrays_to_tensors(self.buffer.state_dict()) if self.cfg.checkpoint.save_buffer else None,
        }

    def save_checkpoint(self, path: Path | None = None) -> Path:
        self._settle_deferred()
        return self.run.save(self.checkpoint_state(), path or self.run.checkpoint)

    def _restore(self, state: dict) -> None:
        """A checkpoint that pomdp_ffm.train.plan() accepted (the format, the config, the buffer)."""
        self.agent.load_training_state(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.counters = Counters(**state["counters"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"].cpu())
        np.random.set_state(_numpy_rng_from_plain(rng["numpy"]))
        random.setstate(rng["python"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        # The env resumes at an episode boundary with its RNG where it was: the next reset matches.
        self.env.set_rng_state(rng["env"])
        log.info("resumed from %s at %d env steps", self.run.checkpoint, self.counters.env_steps)

    def close(self) -> None:
        """Close every env (an env in a worker never raises on close)."""
        close_each([self.env, *self._eval_envs])


def close_each(things: Iterable, quiet_as: str | None = None) -> None:
    """Close every one of ``things``, each whatever the others do. The first error is raised after, or, where
    another error is already on its way up, each is logged as closing ``quiet_as`` failing."""
    errors = []
    for thing in things:
        try:
            thing.close()
        except Exception as e:
            errors.append(e)
    if errors and quiet_as is None:
        raise errors[0]
    for e in errors:
        log.warning("closing %s failed: %s: %s", quiet_as, type(e).__name__, e)


class QueuedUpdates:
    """Whether the device is still busy with updates queued before the latest one (CUDA events, queried without
    waiting): then host work done now (a deferred evaluation's steps) hides behind the device's. Always false on
    a CPU, where an update is done when its call returns."""

    DEPTH = 2

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"
        self.events: deque = deque(maxlen=self.DEPTH)

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.events.append(event)

    def busy(self) -> bool:
        return len(self.events) == self.DEPTH and not self.events[0].query()


class _DeferredEvaluation:
    """An evaluation (``Trainer._evaluate`` generator) started when it was due, advanced between updates, and
    finished (``rest``) by the burst that follows."""

    def __init__(self, evaluation, at: dict, elsewhere: bool):
        self.evaluation, self.at, self.elsewhere = evaluation, at, elsewhere
        self.result = None
        self._send(None)  # its resets, up to its first acting step

    def _send(self, answer) -> None:
        try:
            self.item = self.evaluation.send(answer)
        except StopIteration as done:
            self.item, self.result = None, done.value

    def ready(self, device_busy: bool) -> bool:
        """Whether advancing now costs the updates nothing: envs in workers whose steps are done, or an acting
        step while the device is busy anyway or while the envs it feeds would otherwise idle in their workers."""
        if isinstance(self.item, EnvsStepping):
            return self.item.ready()
        return device_busy or self.elsewhere

    def advance(self) -> None:
        self._send(self.item.answer())

    def rest(self):
        while self.item is not None:
            self._send((yield self.item))
        return self.result


def _advance(parts, answer):
    """Send ``answer()`` into the suspended generator (or throw in the exception it raises): its next item, or
    None once it has ended."""
    try:
        try:
            value = answer()
        except BaseException as e:
            return parts.throw(e)
        return parts.send(value)
    except StopIteration:
        return None


# --- plain containers for the tensors-only checkpoint -------------------------------------------------------
def _arrays_to_tensors(d: dict) -> dict:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for k, v in d.items()}


def _numpy_rng_to_plain(state: tuple) -> dict:
    kind, keys, pos, has_gauss, cached = state
    return {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _numpy_rng_from_plain(d: dict) -> tuple:
    return (d["kind"], d["keys"].numpy().astype(np.uint32), d["pos"], d["has_gauss"], d["cached_gaussian"])


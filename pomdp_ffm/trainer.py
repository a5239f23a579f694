"""The reference's training loop (its policies/learner.py; docs/reference.md#training-loop). A ``Trainer`` owns one
run's env, buffer, agent and progress.csv; ``train_together`` is the loop, for one trainer (``Trainer.train``) or a
seed axis's several (jobs/seeds.py): units of work, each the initial pool's random episodes or an iteration's, then
the burst of updates they call for (``update_bursts``), its row, and the evaluation when due (its row, a snapshot, a
checkpoint)."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from . import rng as rngs
from .acting_graph import gathers, make_actor
from .agent import RecurrentAgent, agent_shape, check_weights_fit
from .buffer import SeqReplayBuffer
from .burst import Burst, update_bursts
from .compiling import compile_before_acting, compiles
from .config import RunConfig, check_eval_clock, env_step_budget, resolve_device
from .cuda_graph import UpdateRunner, joint_runner
from .envs import get_task, make_env
from .evaluation import Clocks, EvalResult, Evaluation, Evaluator, Schedule
from .metrics import columns
from .optim import AdamForm
from .progress import Progress
from .rng import SharedRNGDrawn, host_rng_state, same_host_rng
from .rollout import AgentPolicy, NonFiniteAction, RandomPolicy, Rollout, TrainingDiverged, play_all, play_together
from .run.checkpoint import CHECKPOINT_FORMAT
from .run.rundir import RunDir
from .run.signals import StopRequested, StopSignals
from .standing import Outcome, Standing

log = logging.getLogger("pomdp_ffm")


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
        """Writes nothing. ``composed``: the config its checkpoints store; ``timers``: seconds, ``n_<part>`` counts."""
        self.cfg = cfg
        self.rundir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.stop = stop if stop is not None else StopSignals()
        self.config_copy = composed
        self.timers = timers if timers is not None else Counter()
        torch.set_num_threads(cfg.num_threads)
        # Process-wide, as torch's flag is: the seeds of one axis share their config, hence the value.
        torch.backends.cuda.matmul.allow_tf32 = cfg.train.tf32
        rngs.seed_all(cfg.seed)
        self.device = resolve_device(cfg.device)
        t = cfg.train
        self.max_len = get_task(cfg.env.env_name).max_episode_steps  # an unknown task fails here, with the list
        self.iter_len, self.budget = env_step_budget(t, self.max_len)
        check_eval_clock(cfg, self.max_len)
        self.schedule = Schedule.of(cfg, self.iter_len, self.budget)
        self.standing, self.progress, self._closed = Standing(), None, False
        self.unit_episodes = self.unit_steps = 0  # the episodes collected in the unit of work in hand
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
        """Train to the budget, or until a stop signal (then checkpoint): ``train_together`` with this trainer alone.
        The run directory must be locked."""
        seat = Seat(self, resume)
        train_together([seat])
        return seat.outcome

    def _open(self, resume: dict | None = None) -> None:
        if resume is not None:
            self._restore(resume)
        checkpoint = None if resume is None else resume["progress"]
        self.progress = Progress(self.cfg, self.rundir, self.columns, self.budget, self.standing, checkpoint)

    def _start_unit(self) -> None:
        """A stop is taken before an iteration, never inside its episodes (a checkpoint holds no half episode)."""
        if self.standing.pool_done:
            self.stop.check()
        self.unit_episodes = self.unit_steps = 0

    def _next_episode(self) -> Rollout | None:
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
        return Rollout([self.env], policy, record=True, on_step=self.progress.step, timers=timers)

    def _store(self, rollout: Rollout) -> None:
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

    def _start_burst(self) -> None:
        """The burst the unit's episodes call for. As the reference: a float ratio bursts int(steps x ratio) updates
        after the pool, an int count does not; an iteration's is ceil(its steps x ratio), or the int count. With
        nothing in the buffer to sample, none."""
        ratio = self.cfg.train.num_updates_per_iter
        if not self.standing.pool_done:
            n = int(self.standing.env_steps * ratio) if isinstance(ratio, float) else 0
        else:
            n = ratio if isinstance(ratio, int) else math.ceil(self.unit_steps * ratio)
        self.standing.begin_burst(n if len(self.buffer) > 0 else 0, self.agent.device)

    def _end_burst(self) -> Evaluation | None:
        """The burst's row, after the row of an evaluation deferred into it (the order without the deferral); then
        the evaluation due now, to be played and handed to ``evaluated``: None at the end of the pool, where none is
        due, or where it is deferred into the next burst (eval.during_updates)."""
        c, burst = self.standing, self.standing.burst
        if burst.n > 0:
            self._close_burst(burst)  # (a non-finite statistic: the diverged checkpoint holds the burst)
        c.burst = None
        self._finish_deferred()
        self.progress.burst(burst, c.env_steps)
        return self._due_evaluation()

    def _due_evaluation(self) -> Evaluation | None:
        c = self.standing
        if not c.pool_done:
            c.pool_done = True
            return None
        if (due := self.schedule.due(c.env_steps, c.last_eval_iters)) is None:
            return None
        c.last_eval_iters = due.iters
        if due.deferred:
            self.evaluator.defer(replace(due, at=self.standing.clocks()))
            return None
        return self.evaluator.evaluation(due)

    def _evaluated(self, evaluation: Evaluation) -> None:
        """A played evaluation's row, then the snapshot and checkpoint waiting for it."""
        due = evaluation.due
        self._log_evaluation(*evaluation.results(), due.at or self.standing.clocks())
        if due.snapshot:
            self._snapshot(self.standing.last_return)
        if due.checkpoint:
            self.save_checkpoint()

    def _stopped(self) -> Outcome:
        c = self.standing
        if c.burst is not None and c.burst.n > 0:
            self._close_burst(c.burst)  # its sums into the checkpoint; a non-finite one fails the run instead
        self.save_checkpoint()  # (what the stop leaves is said once, by whoever started the run: start.Attempt.end)
        return Outcome(stopped=True, signal=self.stop.requested, standing=c)

    def _finished(self) -> Outcome:
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
        if self.progress is not None:
            self.progress.close()
        try:
            self.evaluator.close()
        finally:
            self.env.close()

    def save_checkpoint(self, path: Path | None = None) -> Path:
        """Tensors and plain containers only, for ``checkpoint.load_checkpoint`` to read tensors-only."""
        self._finish_deferred()  # played and logged now: the checkpoint holds the rows
        c = self.standing
        c.elapsed = self.progress.elapsed()
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
            "counters": c.saved(),
            "progress": self.progress.state(),
            "rng": rng,
            "buffer": buffer,
        }
        return self.rundir.save(state, path or self.rundir.checkpoint)

    def _close_burst(self, burst: Burst) -> None:
        # The burst's one device read waits for the queued updates: update time too.
        t_w = time.perf_counter()
        first_bad = burst.close()
        self.timers["update"] += time.perf_counter() - t_w
        if first_bad >= 0:
            c, last = self.standing, {k: float(v) for k, v in burst.last.items()}
            self._diverged(
                f"non-finite loss first at update {first_bad} (env step {c.env_steps}; the burst ran on to update "
                f"{c.rl_steps}, whose statistics were {last})"
            )

    def _diverged(self, what: str | NonFiniteAction) -> None:
        """A non-finite loss, or action (Rollout.send: its weights made it), is the run's end: diverged.pt saved."""
        acting = isinstance(what, NonFiniteAction)
        where = f" (env step {self.standing.env_steps}, update {self.standing.rl_steps})" if acting else ""
        path = self.save_checkpoint(self.rundir / RunDir.DIVERGED)  # (no evaluation is deferred now: played or dropped)
        log.error(msg := f"{what}{where}; checkpoint saved to {path}")
        raise TrainingDiverged(msg) from (what if acting else None)

    def _log_evaluation(self, deterministic: EvalResult, stochastic: EvalResult | None, at: Clocks) -> None:
        c = self.standing
        since, c.last_eval_env_steps, c.last_return = c.last_eval_env_steps, at.env_steps, deterministic.ret
        self.progress.evaluation(deterministic, stochastic, at, since_env_steps=since)

    def _finish_deferred(self) -> None:
        """The rest of the deferred evaluation played, then its row."""
        if (evaluation := self.evaluator.finish_deferred()) is not None:
            self._evaluated(evaluation)

    def _snapshot(self, perf: float) -> None:
        """The reference's weights-only snapshot, save/agent_<iters>_perf<return>.pt."""
        self.rundir.save(
            {"agent": self.agent.state_dict()}, self.rundir.snapshot(self.standing.env_steps // self.iter_len, perf)
        )

    def _restore(self, state: dict) -> None:
        """A checkpoint that jobs/plan.plan() accepted."""
        self.agent.load_training_state(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.standing = Standing.restored(state["counters"], self.agent.device)
        self.config_copy = state["config"]
        rngs.set_from_checkpoint(state["rng"])
        self.env.set_rng_state(state["rng"]["env"])  # at an episode boundary: the env's next reset matches
        log.info("resumed from %s at %d env steps", self.rundir.checkpoint, self.standing.env_steps)


class Seat:
    """A trainer in ``train_together``, and what its turns, failures and ends mean. This one is a run alone: no
    turns to take, every error goes up, its outcome kept (a seed axis's seeds: jobs/seeds.py, SeedSeat)."""

    def __init__(self, trainer: Trainer, resume: dict | None = None):
        self.trainer, self.resume, self.outcome = trainer, resume, None

    def turn(self, host: bool = True) -> contextlib.AbstractContextManager:  # (host: numpy's, Python's generators)
        return contextlib.nullcontext()

    def failed(self, e: BaseException) -> None:
        raise e

    def ended(self, outcome: Outcome) -> None:
        self.outcome = outcome


def train_together(seats: list[Seat]) -> None:
    """The training loop, for one trainer or a seed axis's several (each in its seat's turn): those without a burst
    in hand collect their next unit's episodes, the bursts run until one is over, and each trainer whose burst is over
    ends its unit (its rows, its evaluation when due, its checkpoint), until every one has finished, failed, or
    stopped at a stop signal (each then checkpointed). A trainer alone plays and updates as the reference's loop; on
    CUDA with ``train.cuda_graph`` several update in joint rounds and act gathered (patches/016)."""
    _Loop(seats).train()


class _Loop:
    def __init__(self, seats: list[Seat]):
        self.running, self.stop = list(seats), seats[0].trainer.stop if seats else None
        self.runners: dict[tuple[int, ...], UpdateRunner | None] = {}  # joint runners by their seats: graphs kept
        self.gather = gathers([s.trainer.acting for s in seats])

    def train(self) -> None:
        try:
            for s in list(self.running):
                with self.own_turn(s):
                    s.trainer._open(s.resume)
                    self.finish_if_done(s)
            if self.running:  # train.compile: once (the trainers share one architecture), before any episode
                with self.own_turn(*self.running):
                    if compile_before_acting(self.running[0].trainer) and self.stop.requested is not None:
                        raise StopRequested  # (one that came while it compiled)
            while self.running:
                self.collect([s for s in self.running if s.trainer.standing.burst is None])
                pending = [s for s in self.running if not s.trainer.standing.burst_over]
                for group, runner in (groups := self.update_groups(pending)):
                    with self.own_turn(*group):
                        update_bursts([s.trainer for s in group], runner)  # no host read between its updates
                if len(groups) == 1 and len(groups[0][0]) > 1:  # (a joint round)
                    self.realign([s for s in pending if s in self.running])
                self.end_units([s for s in self.running if s.trainer.standing.burst_over])  # (an empty burst too)
        except (StopRequested, KeyboardInterrupt) as e:
            for s in list(self.running):
                if isinstance(e, KeyboardInterrupt):
                    self.fail(s, KeyboardInterrupt())
                    continue
                with self.own_turn(s):  # a burst found diverged as it closes fails its trainer
                    s.ended(s.trainer._stopped())
                    self.running.remove(s)
            if isinstance(e, KeyboardInterrupt):
                raise

    def collect(self, seats: list[Seat]) -> None:
        """These trainers' next units' episodes, then their bursts; where acting is gathered (not the initial pool's
        uniform draws), the episodes of all played together (rollout.play_together)."""
        gathered = [s for s in seats if self.gather and s.trainer.standing.pool_done]
        for s in seats:
            if s not in gathered:
                with self.own_turn(s):
                    s.trainer._start_unit()
                    play_all(s.trainer._next_episode, s.trainer._store)
                    s.trainer._start_burst()
        for s in gathered:  # every trainer's stop check before any episode: a checkpoint holds no half episode
            with self.own_turn(s, host=False):
                s.trainer._start_unit()
        self.play_together(
            [s for s in gathered if s in self.running], lambda s: (s.trainer._next_episode, s.trainer._store)
        )
        for s in gathered:
            if s in self.running:
                with self.own_turn(s):
                    s.trainer._start_burst()

    def update_groups(self, pending: list[Seat]) -> list[tuple[list[Seat], UpdateRunner]]:
        """The bursts in hand: in joint rounds where a joint runner serves them all, else each by its own runner."""
        if len(pending) > 1 and (key := tuple(map(id, pending))) not in self.runners:
            with self.own_turn(*pending):
                self.runners[key] = joint_runner([s.trainer for s in pending])
        if len(pending) > 1 and (runner := self.runners.get(tuple(map(id, pending)))) is not None:
            return [(pending, runner)]
        return [([s], s.trainer.updater) for s in pending if s in self.running]

    def end_units(self, seats: list[Seat]) -> None:
        """The rest of these trainers' units after their bursts: rows, evaluations (gathered), checkpoints, ends."""
        due = {}
        for s in seats:
            with self.own_turn(s):
                if (evaluation := s.trainer._end_burst()) is not None:  # its row (after a deferred evaluation's)
                    due[s] = evaluation
        if self.gather:
            self.play_together([s for s in due if s in self.running], lambda s: (due[s].next, due[s].ended))
        for s in seats:
            if s in self.running:
                with self.own_turn(s):
                    if s in due:
                        if not self.gather:
                            play_all(due[s].next, due[s].ended)
                        s.trainer._evaluated(due[s])  # its row; a snapshot, a checkpoint when due
                    self.finish_if_done(s)

    def realign(self, pending: list[Seat]) -> None:
        """Trainers parted by a policy delay d (a checkpoint from another schedule): each takes alone the fewest
        updates that bring all counts to one remainder mod d (then that many ahead in its bursts)."""
        if any(s.trainer.standing.burst_over for s in pending):
            return
        d = pending[0].trainer.agent.algo.policy_delay
        phases = [s.trainer.agent.num_updates % d for s in pending]
        target = min(range(d), key=lambda p: (sum((p - q) % d for q in phases), (p - phases[0]) % d))
        for s, q in zip(pending, phases):
            if (target - q) % d != 0:
                with self.own_turn(s):
                    update_bursts([s.trainer], s.trainer.updater, limit=(target - q) % d)  # or to its burst's end

    def finish_if_done(self, s: Seat) -> None:
        t = s.trainer
        if t.standing.burst is None and t.standing.env_steps >= t.budget:
            s.ended(t._finished())
            self.running.remove(s)

    @contextlib.contextmanager
    def own_turn(self, *seats: Seat, host: bool = True):
        """The first seat's turn, where an error is the failure of each of ``seats``; a stop goes up."""
        try:
            with seats[0].turn(host):
                yield
        except StopRequested:
            raise
        except BaseException as e:
            for s in seats:
                if s in self.running:
                    self.fail(s, e)

    def fail(self, s: Seat, e: BaseException) -> None:
        """A non-finite action ends its trainer as a non-finite loss does (diverged.pt); the seat says the rest."""
        self.running.remove(s)
        if isinstance(e, NonFiniteAction):  # (played anywhere: an episode, an evaluation, a deferred one)
            with s.turn():
                try:
                    s.trainer._diverged(e)
                except Exception as diverged:  # (TrainingDiverged; or the checkpoint's write failed: Unwritable)
                    e = diverged
        s.failed(e)

    def play_together(self, seats: list[Seat], plan: Callable[[Seat], tuple[Callable, Callable]]) -> None:
        """``plan(seat)``'s rollouts (its ``next`` and ``ended``) for each seat in lockstep (rollout.play_together),
        in turns that swap torch's generators only: numpy's and Python's are checked untouched (all fail if not)."""
        before = host_rng_state()
        turns = [lambda s=s: self.own_turn(s, host=False) for s in seats]
        play_together([plan(s) for s in seats], turns, playing=lambda i: seats[i] in self.running)
        if not same_host_rng(before, host_rng_state()):
            for s in [s for s in seats if s in self.running]:
                self.fail(s, SharedRNGDrawn())

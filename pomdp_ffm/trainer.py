"""The training loop of the reference (spec 6), as an object that owns env, buffer, agent and logs.

    random pool -> a burst of updates -> [collect one episode -> updates per env step -> maybe eval]*

Run directory: config.yaml, progress.csv, experiment.log, checkpoints/last.pt (resume), save/agent_*.pt (the
reference's snapshots), DONE when finished.
"""
from __future__ import annotations

import logging
import math
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .agent import RecurrentAgent
from .buffer import SeqReplayBuffer
from .config import RunConfig
from .envs import get_task, make_env
from .logger import ProgressCSV, columns_for

log = logging.getLogger("pomdp_ffm")

CHECKPOINT = Path("checkpoints") / "last.pt"
DONE = "DONE"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available here; use device=cpu or device=auto")
    if not (name == "cpu" or name.startswith("cuda")):
        raise ValueError(f"device={name!r} is not one of ['auto', 'cpu', 'cuda', 'cuda:N']")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class TrainingDiverged(FloatingPointError):
    pass


class _StopRequested(Exception):
    """Raised between two updates (or before an iteration) once a stop signal has arrived."""


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: str | Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        task = get_task(cfg.env.env_name)
        if task.discrete:
            raise ValueError(f"task {task.name!r} has a discrete action space; {cfg.policy.algo_name} needs "
                             "continuous actions (SAC-discrete is not part of this project)")
        torch.set_num_threads(cfg.num_threads)
        seed_everything(cfg.seed)
        self.device = resolve_device(cfg.device)
        # One env instance for training and evaluation, as in the reference.
        self.env = make_env(task.name, seed=cfg.seed)
        self.max_len = self.env.max_episode_steps
        self.obs_dim = self.env.observation_space.shape[0]
        self.act_dim = self.env.action_space.shape[0]
        t = cfg.train
        self.seq_len = self.max_len if t.sampled_seq_len == -1 else t.sampled_seq_len
        if self.seq_len < 2:
            raise ValueError(f"train.sampled_seq_len={t.sampled_seq_len} must be -1 or >= 2")
        self.buffer = SeqReplayBuffer(int(t.buffer_size), self.obs_dim, self.act_dim, self.seq_len,
                                      t.sample_weight_baseline, seed=cfg.seed)
        self.agent = RecurrentAgent(self.obs_dim, self.act_dim, cfg.policy).to(self.device)
        # env-step budget = max_len x (pool + iters x rollouts/iter) (spec 6.9); an "iteration" of the eval clock
        # is iter_len env steps (spec 6.5).
        self.iter_len = t.num_rollouts_per_iter * self.max_len
        self.budget = self.max_len * t.num_init_rollouts_pool + t.num_iters * self.iter_len
        self.counters = {"env_steps": 0, "rollouts": 0, "rl_steps": 0, "last_eval_iters": 0, "elapsed": 0.0,
                         "pool_done": False, "burst": None}
        self.last_return = float("nan")
        self._stop_signal: int | None = None
        self.bar = None
        self._updates_per_s = 0.0

    # ------------------------------------------------------------------------------------------------
    def run(self) -> dict:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._setup_logging()
        resumed_rows = self._maybe_resume()
        self.csv = ProgressCSV(self.run_dir / "progress.csv",
                               columns_for(self.cfg.policy.algo_name, self.cfg.eval.eval_stochastic),
                               keep_rows=resumed_rows)
        self.tb = self._tensorboard()
        self._t0 = time.time() - self.counters["elapsed"]
        self._last_eval = (time.time(), self.counters["env_steps"])
        old_handlers = self._install_signal_handlers()
        bar = tqdm(total=self.budget, initial=self.counters["env_steps"], unit="step", dynamic_ncols=True,
                   disable=not self.cfg.progress, mininterval=2.0, desc=self.cfg.env.env_name)
        self.bar = bar
        try:
            try:
                if not self.counters["pool_done"]:
                    self._initial_pool()
                elif self.counters["burst"] is not None:  # stopped inside an iteration's updates
                    self._finish_iteration()
                while self.counters["env_steps"] < self.budget:
                    if self._stop_signal is not None:
                        raise _StopRequested
                    self._iteration()
            except _StopRequested:
                self.save_checkpoint()
                log.info("stopped by signal %d at %d env steps, %d updates; checkpoint saved", self._stop_signal,
                         self.counters["env_steps"], self.counters["rl_steps"])
                return {"stopped": True, **self.counters}
            self._snapshot(self.last_return)
            self.save_checkpoint()
            (self.run_dir / DONE).write_text(f"env_steps={self.counters['env_steps']}\n")
            log.info("finished: %d env steps, %d updates, last eval return %.2f", self.counters["env_steps"],
                     self.counters["rl_steps"], self.last_return)
            return {"stopped": False, **self.counters, "last_return": self.last_return}
        finally:
            bar.close()
            self.csv.close()
            if self.tb is not None:
                self.tb.close()
            for sig, h in old_handlers.items():
                signal.signal(sig, h)

    # ------------------------------------------------------------------------------------------------
    def _initial_pool(self) -> None:
        t = self.cfg.train
        while self.counters["env_steps"] < t.num_init_rollouts_pool * self.max_len:
            self.collect_episode(random_actions=True)
        # A float ratio means int(steps * ratio) updates at once after the pool (spec 6.2).
        if self.counters["burst"] is None:
            self._start_burst(self._num_updates(self.counters["env_steps"], burst=True))
        self._run_burst()
        self.counters["pool_done"] = True

    def _iteration(self) -> None:
        steps = 0
        for _ in range(self.cfg.train.num_rollouts_per_iter):
            steps += self.collect_episode(random_actions=False)
        self._start_burst(self._num_updates(steps, burst=False))
        self._finish_iteration()

    def _finish_iteration(self) -> None:
        self._run_burst()
        iters = self.counters["env_steps"] // self.iter_len  # the reference's env-step clock (spec 6.5)
        if iters != self.counters["last_eval_iters"] and iters % self.cfg.eval.log_interval == 0:
            self.counters["last_eval_iters"] = iters
            self.evaluate_and_log()
            if self.cfg.eval.save_interval > 0 and self.counters["env_steps"] > 0.75 * self.budget \
                    and iters % self.cfg.eval.save_interval == 0:
                self._snapshot(self.last_return)
            if iters % self.cfg.checkpoint.interval == 0:
                self.save_checkpoint()

    def _num_updates(self, steps: int, burst: bool) -> int:
        ratio = self.cfg.train.num_updates_per_iter
        if isinstance(ratio, int):
            return ratio
        return int(steps * ratio) if burst else math.ceil(steps * ratio)

    # ------------------------------------------------------------------------------------------------
    def collect_episode(self, random_actions: bool) -> int:
        env, agent = self.env, self.agent
        obs, _ = env.reset()
        prev_action, prev_reward = np.zeros(self.act_dim, np.float32), 0.0
        state = agent.initial_state(1)
        O, A, R, D, O2 = [], [], [], [], []
        ep_return, done = 0.0, False
        while not done:
            if random_actions:
                # The native action space (Pendulum: [-2, 2]), stored unclipped like the reference.
                action = env.action_space.sample()
            else:
                action, state = agent.act(obs, prev_action, prev_reward, state, deterministic=False)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            O.append(obs), A.append(action), R.append(reward), O2.append(next_obs)
            D.append(terminated and not truncated)  # a time-out bootstraps, a fall does not
            obs, prev_action, prev_reward = next_obs, action, float(reward)
            ep_return += float(reward)
        L = len(O)
        if L >= 2:
            self.buffer.add_episode(np.asarray(O, np.float32), np.asarray(A, np.float32),
                                    np.asarray(R, np.float32), np.asarray(D, np.float32),
                                    np.asarray(O2, np.float32))
        else:
            log.warning("episode of length %d not stored (the sequence buffer needs >= 2 steps)", L)
        self.counters["env_steps"] += L
        self.counters["rollouts"] += 1
        if self.bar is not None:
            self.bar.update(L)
        return L

    def _start_burst(self, n: int) -> None:
        # The burst lives in the counters, so a checkpoint taken inside it (a stop signal between two updates)
        # resumes with the updates still owed and the partial loss sums of the row it will log.
        self.counters["burst"] = {"n": n, "done": 0, "sums": {}, "counts": {}}

    def _run_burst(self) -> None:
        burst = self.counters["burst"]
        n, start = burst["n"], burst["done"]
        if n <= 0 or len(self.buffer) == 0:
            self.counters["burst"] = None
            return
        sums, counts = burst["sums"], burst["counts"]  # with a TD3 policy delay, actor stats come from fewer updates
        t0 = time.time()
        for i in range(start, n):
            if self._stop_signal is not None:
                raise _StopRequested
            stats = self.agent.update(self.buffer.sample(self.cfg.train.batch_size), grad_norms=(i == n - 1))
            bad = {k: v for k, v in stats.items() if not math.isfinite(v)}
            if bad:
                self._diverged(bad)
            self.counters["rl_steps"] += 1
            for k, v in stats.items():
                if not k.endswith("grad_norm"):
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
            burst["done"] = i + 1
        self.counters["burst"] = None
        row = {f"rl_loss/{k}": v / counts[k] for k, v in sums.items()}
        row.update({f"rl_loss/{k}": v for k, v in stats.items() if k.endswith("grad_norm")})
        self.csv.write(row)
        if self.tb is not None:
            for k, v in row.items():
                self.tb.add_scalar(k, v, self.counters["env_steps"])
        self._updates_per_s = (n - start) / max(time.time() - t0, 1e-9)
        self._show_status()

    def _show_status(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"upd/s={self._updates_per_s:.0f} eval={self.last_return:.1f}", refresh=False)

    def _diverged(self, bad: dict) -> None:
        path = self.save_checkpoint(name="diverged.pt")
        msg = (f"non-finite loss at update {self.counters['rl_steps'] + 1} "
               f"(env step {self.counters['env_steps']}): {bad}; checkpoint saved to {path}")
        log.error(msg)
        raise TrainingDiverged(msg)

    # ------------------------------------------------------------------------------------------------
    def evaluate(self, deterministic: bool = True) -> tuple[float, float, float]:
        """Mean return, mean length and success rate over num_eval_tasks episodes (spec 6.5)."""
        returns, lengths, successes = [], [], []
        for _ in range(self.cfg.env.num_eval_tasks):
            obs, _ = self.env.reset()
            prev_action, prev_reward = np.zeros(self.act_dim, np.float32), 0.0
            state, done, ret, steps, success = self.agent.initial_state(1), False, 0.0, 0, False
            while not done:
                action, state = self.agent.act(obs, prev_action, prev_reward, state, deterministic)
                obs, reward, terminated, truncated, info = self.env.step(action)
                done = terminated or truncated
                prev_action, prev_reward = action, float(reward)
                ret += float(reward)
                steps += 1
                success = success or bool(info.get("success", False))
            returns.append(ret), lengths.append(steps), successes.append(success)
        return float(np.mean(returns)), float(np.mean(lengths)), float(np.mean(successes))

    def evaluate_and_log(self) -> float:
        ret, length, success = self.evaluate(deterministic=True)
        now, c = time.time(), self.counters
        row = {"z/env_steps": c["env_steps"], "z/rollouts": c["rollouts"], "z/rl_steps": c["rl_steps"],
               "metrics/total_steps_eval": length, "metrics/return_eval_total": ret,
               "metrics/success_rate_eval": success}
        if self.cfg.eval.eval_stochastic:
            r_s, l_s, s_s = self.evaluate(deterministic=False)
            row.update({"metrics/total_steps_eval_sto": l_s, "metrics/return_eval_total_sto": r_s,
                        "metrics/success_rate_eval_sto": s_s})
        last_t, last_steps = self._last_eval
        row["z/time_cost"] = int(now - self._t0)
        row["z/fps"] = (c["env_steps"] - last_steps) / max(now - last_t, 1e-9)
        self._last_eval = (now, c["env_steps"])
        self.csv.write(row)
        if self.tb is not None:
            for k, v in row.items():
                self.tb.add_scalar(k, v, c["env_steps"])
        self.last_return = ret
        self._show_status()
        log.info("env steps %d  updates %d  eval return %.2f  length %.1f", c["env_steps"], c["rl_steps"], ret,
                 length)
        return ret

    # ------------------------------------------------------------------------------------------------
    def _snapshot(self, perf: float) -> None:
        """The reference's agent snapshot: save/agent_<iters>_perf<return>.pt."""
        iters = self.counters["env_steps"] // self.iter_len
        path = self.run_dir / "save" / f"agent_{iters}_perf{perf:.3f}.pt"
        path.parent.mkdir(exist_ok=True)
        _atomic_save({"agent": self.agent.state_dict()}, path)

    def save_checkpoint(self, name: str | None = None) -> Path:
        path = self.run_dir / (CHECKPOINT if name is None else CHECKPOINT.parent / name)
        path.parent.mkdir(exist_ok=True)
        self.counters["elapsed"] = time.time() - self._t0
        state = {
            "agent": self.agent.state_dict(),
            "optim": self.agent.optimizer_state(),
            "num_updates": self.agent.num_updates,
            "alpha": getattr(self.agent.algo, "alpha", None),
            "counters": dict(self.counters),
            "csv_rows": self.csv.rows,
            "last_eval_env_steps": self._last_eval[1],
            "last_return": self.last_return,
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                    "env": self.env.rng_state()},
            "buffer": self.buffer.state_dict() if self.cfg.checkpoint.save_buffer else None,
        }
        _atomic_save(state, path)
        return path

    def _maybe_resume(self) -> int | None:
        path = self.run_dir / CHECKPOINT
        if not self.cfg.resume:
            if (self.run_dir / "progress.csv").exists():
                raise FileExistsError(f"{self.run_dir} already holds a run; pass resume=true to continue it "
                                      "or choose another run directory")
            return None
        if not path.exists():
            log.info("resume=true but %s does not exist: starting from scratch", path)
            return None
        state = torch.load(path, map_location=self.device, weights_only=False)
        if state["buffer"] is None:
            raise ValueError(f"{path} was saved without its replay buffer (checkpoint.save_buffer=false); "
                             "it cannot be resumed faithfully")
        self.agent.load_state_dict(state["agent"])
        self.agent.load_optimizer_state(state["optim"])
        self.agent.num_updates = state["num_updates"]
        if state["alpha"] is not None:
            self.agent.algo.alpha = state["alpha"]
        self.buffer.load_state_dict(state["buffer"])
        self.counters = {"burst": None, **state["counters"]}
        self.last_return = state["last_return"]
        rng = state["rng"]
        torch.set_rng_state(rng["torch"].cpu())
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        # The env resumes at an episode boundary with its RNG where it was: the next reset matches.
        self.env.set_rng_state(rng["env"])
        log.info("resumed from %s at %d env steps", path, self.counters["env_steps"])
        return state["csv_rows"]

    # ------------------------------------------------------------------------------------------------
    def _setup_logging(self) -> None:
        handler = logging.FileHandler(self.run_dir / "experiment.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        self._log_handler = handler

    def _tensorboard(self):
        if not self.cfg.eval.log_tensorboard:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("eval.log_tensorboard=true needs the tensorboard package: "
                              "pip install 'pomdp-ffm[tensorboard]'") from e
        return SummaryWriter(str(self.run_dir / "tb"))

    def _install_signal_handlers(self) -> dict:
        # SIGTERM/SIGUSR1 (a scheduler's warning) finish the current update or episode, checkpoint and stop.
        def handler(signum, frame):
            self._stop_signal = signum

        old = {}
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            try:
                old[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                pass
        return old

    def close(self) -> None:
        self.env.close()
        if getattr(self, "_log_handler", None) is not None:
            log.removeHandler(self._log_handler)
            self._log_handler.close()


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


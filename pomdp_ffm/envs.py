"""Task registry for the P/V/F occlusion benchmarks (docs/tasks.md): ``<Family>-{F,P,V}-v0`` is a base Gymnasium
env seeing all its observation dims (F), the position-like (P) or the velocity-like ones (V)."""

from __future__ import annotations

import atexit
import difflib
import functools
import multiprocessing
import multiprocessing.util  # noqa: F401  (its exit handler must be registered before this module's)
import os
import signal
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from .run.signals import end_with_parent, env_worker


@dataclass(frozen=True)
class TaskSpec:
    name: str
    base_id: str
    obs_indices: tuple[int, ...]
    max_episode_steps: int
    make_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def id(self) -> str:  # Gymnasium code that receives this object through ``env.spec`` reads ``spec.id``
        return self.name


def _r(start: int, stop: int) -> tuple[int, ...]:
    return tuple(range(start, stop))


# (family, base id, max steps, make kwargs, {variant: indices})
_FAMILIES: list[tuple[str, str, int, dict[str, Any], dict[str, tuple[int, ...]]]] = [
    # The reference's (POMDP-Baselines envs/pomdp) index lists, copied exactly. Its discrete tasks (CartPole,
    # LunarLander) need SAC-discrete, which this project does not implement (patches/009).
    ("Pendulum", "Pendulum-v1", 200, {}, {"F": (0, 1, 2), "P": (0, 1), "V": (2,)}),
    (
        "HopperBLT",
        "HopperBulletEnv-v0",
        1000,
        {},
        {"F": _r(0, 15), "P": (0, 1, 2, 6, 7, 8, 10, 12, 14), "V": (3, 4, 5, 9, 11, 13)},
    ),
    (
        "WalkerBLT",
        "Walker2DBulletEnv-v0",
        1000,
        {},
        {"F": _r(0, 22), "P": (0, 1, 2, 6, 7, 8, 10, 12, 14, 16, 18, 20, 21), "V": (3, 4, 5, 9, 11, 13, 15, 17, 19)},
    ),
    (
        "AntBLT",
        "AntBulletEnv-v0",
        1000,
        {},
        {
            "F": _r(0, 28),
            "P": (0, 1, 2, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25, 26, 27),
            "V": (3, 4, 5, 9, 11, 13, 15, 17, 19, 21, 23),
        },
    ),
    (
        "HalfCheetahBLT",
        "HalfCheetahBulletEnv-v0",
        1000,
        {},
        {
            "F": _r(0, 26),
            "P": (0, 1, 2, 6, 7, 8, 10, 12, 14, 16, 18, 20, 21, 22, 23, 24, 25),
            "V": (3, 4, 5, 9, 11, 13, 15, 17, 19),
        },
    ),
    # MuJoCo v5 (not in the reference): its observations are qpos without the root x (Ant: x and y), then qvel,
    # so P is the leading block and V the rest (nq - 1 + nv: Hopper 5 + 6, Walker2d and HalfCheetah 8 + 9).
    ("HopperMJ", "Hopper-v5", 1000, {}, {"F": _r(0, 11), "P": _r(0, 5), "V": _r(5, 11)}),
    ("Walker2dMJ", "Walker2d-v5", 1000, {}, {"F": _r(0, 17), "P": _r(0, 8), "V": _r(8, 17)}),
    ("HalfCheetahMJ", "HalfCheetah-v5", 1000, {}, {"F": _r(0, 17), "P": _r(0, 8), "V": _r(8, 17)}),
    # Ant: 13 + 14; its 78 contact-force dims are neither positions nor velocities and would leak into F only.
    (
        "AntMJ",
        "Ant-v5",
        1000,
        {"include_cfrc_ext_in_observation": False},
        {"F": _r(0, 27), "P": _r(0, 13), "V": _r(13, 27)},
    ),
]


TASKS: dict[str, TaskSpec] = {
    f"{family}-{v}-v0": TaskSpec(f"{family}-{v}-v0", base_id, tuple(int(i) for i in variants[v]), max_steps, dict(kw))
    for family, base_id, max_steps, kw, variants in _FAMILIES
    for v in ("F", "P", "V")
}


def available_tasks() -> list[str]:
    return list(TASKS)


def get_task(name: str) -> TaskSpec:
    if isinstance(name, str) and name in TASKS:
        return TASKS[name]
    close = difflib.get_close_matches(name, TASKS, n=3) if isinstance(name, str) else []
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(f"Unknown task {name!r}.{hint} Known tasks: {', '.join(available_tasks())}")


class POMDPWrapper(gymnasium.Wrapper):
    """Masks the observation to ``spec.obs_indices``; maps the agent's actions in ``[-1, 1]^A`` onto the base
    action box, clipping before and after, as the reference does. ``action_space`` stays the base env's box: the
    reference draws its initial random actions from it (and stores them unclipped)."""

    def __init__(self, env: gymnasium.Env, spec: TaskSpec, seed: int | None = None):
        super().__init__(env)
        base_obs = env.observation_space
        if not isinstance(base_obs, spaces.Box) or len(base_obs.shape) != 1:
            raise ValueError(f"POMDPWrapper needs a 1-D Box observation space, got {base_obs!r} from {spec.base_id!r}")
        idx = np.asarray(spec.obs_indices, dtype=np.intp)
        n_base = base_obs.shape[0]
        bad = [int(i) for i in idx if not 0 <= i < n_base]
        if bad or idx.size == 0:
            raise ValueError(
                f"Task {spec.name!r}: observation indices {bad or list(idx)} are invalid for base "
                f"{spec.base_id!r} whose observation has {n_base} dims (allowed 0..{n_base - 1})"
            )
        self._idx, self._task_spec, self.max_episode_steps = idx, spec, spec.max_episode_steps
        self.observation_space = spaces.Box(
            base_obs.low[idx].astype(np.float32), base_obs.high[idx].astype(np.float32), dtype=np.float32
        )
        act = env.action_space
        if not isinstance(act, spaces.Box):
            raise ValueError(f"Unsupported action space {act!r} for {spec.base_id!r}; allowed: Box")
        self._act_low, self._act_high = act.low, act.high
        # The reference seeds its one env object with `seed`, then again with `seed + 1` as its evaluation env
        # (policies/learner.py), and its action sampler with `seed`: its episodes start from `seed + 1`'s stream.
        self._pending_seed = None if seed is None else seed + 1
        self._past_first_reset = False  # see set_rng_state
        if seed is not None:
            self.action_space.seed(seed)

    # The task in place of gymnasium's EnvSpec: it has the ``id`` and ``max_episode_steps`` gymnasium's wrappers read.
    @property
    def spec(self) -> TaskSpec:  # type: ignore[override]
        return self._task_spec

    def _observe(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(obs)[self._idx].astype(np.float32)

    def rng_state(self) -> dict:
        """What the env's next reset depends on, for checkpoints: the env's and the action sampler's RNG states, the
        seed of a first reset still to come, and whether the env is past its first reset."""
        return {
            "env": self.unwrapped.np_random.bit_generator.state,
            "action_space": self.action_space.np_random.bit_generator.state,
            "pending_seed": self._pending_seed,
            "past_first_reset": self._past_first_reset,
        }

    def set_rng_state(self, state: dict) -> None:
        """Continue the RNG streams of a checkpoint: the next reset is the one the saved run would have made.

        A PyBullet env's first reset is unlike its later ones: pybullet_envs' WalkerBase adds the floor to the
        robot's parts (whose mean position is the robot's) only after that reset has computed its state, so the first
        episode's first reward (its progress term; AntBLT's reset observation too) differs from that of a later
        episode from the same RNG state. An env restored where the saved one was past its first reset (a resumed
        run's new env) is therefore reset once here first, its RNG states then set over what that reset drew."""
        # A state from before the key (checkpoint format 3): the training env, made with a seed, had been reset
        # once its pending seed was spent.
        if state.get("past_first_reset", state["pending_seed"] is None) and not self._past_first_reset:
            self.reset()
        self.unwrapped.np_random.bit_generator.state = state["env"]
        self.action_space.np_random.bit_generator.state = state["action_space"]
        self._pending_seed = state["pending_seed"]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        # Only the first reset is seeded implicitly; later resets continue the env's RNG stream.
        seed, self._pending_seed = self._pending_seed if seed is None else seed, None
        obs, info = self.env.reset(seed=seed, options=options)
        self._past_first_reset = True
        return self._observe(obs), info

    def _rescale(self, action: Any) -> np.ndarray:
        # In the box's own dtype (float32), as the reference's wrapper computes (envs/pomdp/wrappers.py, step) on
        # the float32 actions its agent and sampler give it: in float64, about half the components round otherwise.
        a = np.asarray(action, dtype=self._act_low.dtype)
        if a.shape != self._act_low.shape:
            raise ValueError(
                f"Action shape {a.shape} does not match {self._task_spec.name!r}, "
                f"which expects shape {self._act_low.shape}"
            )
        a = self._act_low + (np.clip(a, -1, 1) + 1.0) * 0.5 * (self._act_high - self._act_low)
        return np.clip(a, self._act_low, self._act_high)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(self._rescale(action))
        return self._observe(obs), reward, terminated, truncated, info

    # The two halves of ``step``, as an ``EnvInWorker`` has them (there the step runs in between; here in
    # ``step_wait``), so that one rollout loop serves both.
    def step_async(self, action: Any) -> None:
        self._action = action

    def step_wait(self):
        action, self._action = self._action, None
        return self.step(action)

    def reset_from(self, rng: dict) -> tuple[np.ndarray, dict]:
        """(The first observation, the RNG state after) a reset from RNG state ``rng``: an evaluation's RNG chain."""
        self.set_rng_state(rng)
        obs, _ = self.reset()
        return obs, self.rng_state()


class EnvInWorker:
    """A task's env stepped in a worker process while the caller goes on (``eval.workers``): Gymnasium's
    AsyncVectorEnv of one env, autoreset off, seen as one env, with the env's own calls forwarded; observations,
    rewards and RNG streams are those of the same env in this process."""

    runs_elsewhere = True

    def __init__(self, name: str, seed: int | None = None):
        self.venv = gymnasium.vector.AsyncVectorEnv(
            [functools.partial(_make_env_in_worker, name, seed, os.getpid())],
            shared_memory=False,
            context=worker_start_method(),
            autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED,
            worker=env_worker,
        )  # (ends without a word when the run is killed: signals.env_worker)
        _OPEN_WORKERS.add(self)
        self.max_episode_steps = get_task(name).max_episode_steps
        self.observation_space, self.action_space = self.venv.single_observation_space, self.venv.single_action_space

    def reset(self, **kwargs):
        obs, info = self.venv.reset(**kwargs)
        return obs[0], _first(info)

    def step_async(self, action: Any) -> None:
        self.venv.step_async(np.asarray(action)[None])

    def step_ready(self) -> bool:
        """Whether ``step_wait`` would not block: the step's result is waiting in the pipe."""
        return self.venv.parent_pipes[0].poll()

    def step_wait(self):
        obs, reward, terminated, truncated, info = self.venv.step_wait()
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), _first(info)

    def step(self, action: Any):
        self.step_async(action)
        return self.step_wait()

    # The random pool's actions come from this process's copy of the action space: its state is taken from here.
    def rng_state(self) -> dict:
        return {**self.venv.call("rng_state")[0], "action_space": self.action_space.np_random.bit_generator.state}

    def set_rng_state(self, state: dict) -> None:
        self.venv.call("set_rng_state", state)
        self.action_space.np_random.bit_generator.state = state["action_space"]

    def reset_from(self, rng: dict) -> tuple[np.ndarray, dict]:
        return self.venv.call("reset_from", rng)[0]

    def close(self) -> None:
        """Never raises: a worker that died (or a step in flight) cannot keep the run from closing."""
        if self.venv.closed:
            return
        try:
            self.venv.close()
        except Exception:
            # Gymnasium's close waits for a step a dead worker never answers; the worker ignores SIGTERM.
            for process in self.venv.processes:
                if process.exitcode is None:
                    process.kill()
            for pipe in filter(None, self.venv.parent_pipes):
                pipe.close()
            for process in self.venv.processes:
                process.join(timeout=5)
            self.venv.closed = True  # its __del__ would try again


# Closed at exit before multiprocessing's handler (registered earlier, so run later), which would SIGTERM them
# (ignored) and wait forever.
_OPEN_WORKERS: weakref.WeakSet[EnvInWorker] = weakref.WeakSet()


@atexit.register
def _close_open_workers() -> None:
    for env in list(_OPEN_WORKERS):
        env.close()


def check_worker_start_method(current: str | None, whose: str = "this process uses") -> None:
    if current not in (None, "fork", "forkserver", "spawn"):
        raise ValueError(
            f"evaluation envs in worker processes (eval.workers) need one of Python's start "
            f"methods, but {whose} {current!r} (joblib's local launcher runs its jobs in loky's "
            "workers); run them with hydra/launcher=slurm_local or basic, or set eval.workers=false"
        )


def worker_start_method() -> str:
    """Forkserver where there is one, else spawn; never fork (CUDA and OpenMP threads must not be inherited). Under
    one of the project's entry points the forkserver preloads what it imported, but not the entry point itself,
    which the worker runs again as its ``__main__`` (runpy would warn that it is already imported)."""
    check_worker_start_method(multiprocessing.get_start_method(allow_none=True))
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    main = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) or ""
    ours = sorted(m for m in sys.modules if m.startswith("pomdp_ffm.") and m not in (main, __name__))
    preload = [__name__] + (ours if main.startswith("pomdp_ffm.") else [])
    multiprocessing.get_context("forkserver").set_forkserver_preload(preload)
    return "forkserver"


def _make_env_in_worker(name: str, seed: int | None, main_pid: int) -> POMDPWrapper:
    # A job's stop signals reach every process (SLURM, a terminal's Ctrl-C): the main process acts on them; it
    # checkpoints, then closes the workers. (Gymnasium's env built in the main process leaves its handlers alone.)
    if os.getpid() != main_pid:
        end_with_parent(signal.SIGKILL)  # its parent (the forkserver) ends with the main process
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
    return make_env(name, seed)


def _first(info: dict) -> dict:
    """The first env's entries of a vector env's info (keys it set, without their ``_key`` masks)."""
    return {k: v[0] for k, v in info.items() if not k.startswith("_") and info.get(f"_{k}", [True])[0]}


def make_env(name: str, seed: int | None = None) -> POMDPWrapper:
    """The masked environment of task ``name``; with ``seed``, its first ``reset()`` is seeded with ``seed + 1`` and
    its action sampler with ``seed``, as the reference's env of that seed is."""
    spec = get_task(name)
    if spec.base_id.endswith("BulletEnv-v0"):
        import pybullet_envs_gymnasium  # noqa: F401  (registers the BLT ids; only those tasks pay for pybullet)
    base = gymnasium.make(spec.base_id, max_episode_steps=spec.max_episode_steps, **dict(spec.make_kwargs))
    return POMDPWrapper(base, spec, seed=seed)

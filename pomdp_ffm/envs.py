"""Task registry for the P/V/F occlusion benchmarks.

A task id ``<Family>-{F,P,V}-v0`` names a base Gymnasium environment plus the subset of its
observation vector the agent sees: ``F`` all dims (the fully observed MDP), ``P`` position-like
dims only, ``V`` velocity-like dims only. The classic and PyBullet families reproduce the
POMDP-Baselines index lists verbatim; the ``*MJ`` families are MuJoCo (Gymnasium v5)
counterparts the reference never had. See ``docs/tasks.md`` for the table.
"""

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

__all__ = [
    "TaskSpec",
    "TASKS",
    "POMDPWrapper",
    "EnvInWorker",
    "available_tasks",
    "get_task",
    "make_env",
]


@dataclass(frozen=True)
class TaskSpec:
    """Static description of one task id."""

    name: str
    base_id: str
    obs_indices: tuple[int, ...]
    max_episode_steps: int
    # Excluded from hashing because dicts are unhashable; the spec stays usable as a dict key.
    make_kwargs: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def id(self) -> str:
        # Gymnasium code that receives this object through ``env.spec`` reads ``spec.id``.
        return self.name

    @property
    def obs_dim(self) -> int:
        return len(self.obs_indices)

    @property
    def is_bullet(self) -> bool:
        return self.base_id.endswith("BulletEnv-v0")


def _r(start: int, stop: int) -> tuple[int, ...]:
    return tuple(range(start, stop))


# (family, base id, max steps, make kwargs, {variant: indices})
_FAMILIES: list[tuple[str, str, int, dict[str, Any], dict[str, tuple[int, ...]]]] = [
    # --- reference (POMDP-Baselines envs/pomdp), index lists copied exactly ---
    # The reference's discrete tasks (CartPole, LunarLander) are not registered: they need SAC-discrete,
    # which this project does not implement (patches/009-continuous-separate-only.md).
    ("Pendulum", "Pendulum-v1", 200, {}, {"F": (0, 1, 2), "P": (0, 1), "V": (2,)}),
    (
        "HopperBLT", "HopperBulletEnv-v0", 1000, {},
        {
            "F": _r(0, 15),
            "P": (0, 1, 2, 6, 7, 8, 10, 12, 14),
            "V": (3, 4, 5, 9, 11, 13),
        },
    ),
    (
        "WalkerBLT", "Walker2DBulletEnv-v0", 1000, {},
        {
            "F": _r(0, 22),
            "P": (0, 1, 2, 6, 7, 8, 10, 12, 14, 16, 18, 20, 21),
            "V": (3, 4, 5, 9, 11, 13, 15, 17, 19),
        },
    ),
    (
        "AntBLT", "AntBulletEnv-v0", 1000, {},
        {
            "F": _r(0, 28),
            "P": (0, 1, 2, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25, 26, 27),
            "V": (3, 4, 5, 9, 11, 13, 15, 17, 19, 21, 23),
        },
    ),
    (
        "HalfCheetahBLT", "HalfCheetahBulletEnv-v0", 1000, {},
        {
            "F": _r(0, 26),
            "P": (0, 1, 2, 6, 7, 8, 10, 12, 14, 16, 18, 20, 21, 22, 23, 24, 25),
            "V": (3, 4, 5, 9, 11, 13, 15, 17, 19),
        },
    ),
    # --- MuJoCo v5 (not in the reference). Default v5 observations are qpos without the
    # root x (Ant: without x and y) followed by qvel, so P is the leading block and V the rest.
    # Hopper: nq=6, nv=6 -> 5 + 6.
    ("HopperMJ", "Hopper-v5", 1000, {}, {"F": _r(0, 11), "P": _r(0, 5), "V": _r(5, 11)}),
    # Walker2d: nq=9, nv=9 -> 8 + 9.
    ("Walker2dMJ", "Walker2d-v5", 1000, {}, {"F": _r(0, 17), "P": _r(0, 8), "V": _r(8, 17)}),
    # HalfCheetah: nq=9, nv=9 -> 8 + 9.
    (
        "HalfCheetahMJ", "HalfCheetah-v5", 1000, {},
        {"F": _r(0, 17), "P": _r(0, 8), "V": _r(8, 17)},
    ),
    # Ant: nq=15, nv=14 -> 13 + 14. The 78 contact-force dims are switched off because they are
    # neither positions nor velocities and would otherwise leak into F only.
    (
        "AntMJ", "Ant-v5", 1000, {"include_cfrc_ext_in_observation": False},
        {"F": _r(0, 27), "P": _r(0, 13), "V": _r(13, 27)},
    ),
]


def _build_tasks() -> dict[str, TaskSpec]:
    tasks: dict[str, TaskSpec] = {}
    for family, base_id, max_steps, kwargs, variants in _FAMILIES:
        for variant in ("F", "P", "V"):
            name = f"{family}-{variant}-v0"
            tasks[name] = TaskSpec(
                name=name,
                base_id=base_id,
                obs_indices=tuple(int(i) for i in variants[variant]),
                max_episode_steps=max_steps,
                make_kwargs=dict(kwargs),
            )
    return tasks


TASKS: dict[str, TaskSpec] = _build_tasks()


def available_tasks() -> list[str]:
    return list(TASKS)


def get_task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        pass
    hint = ""
    if isinstance(name, str):
        close = difflib.get_close_matches(name, TASKS.keys(), n=3)
        if close:
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?"
    raise ValueError(
        f"Unknown task {name!r}.{hint} Known tasks: {', '.join(available_tasks())}"
    )


class POMDPWrapper(gymnasium.Wrapper):
    """Masks the observation to ``spec.obs_indices`` and rescales continuous actions.

    The agent acts in ``[-1, 1]^A``; the action is clipped, mapped affinely onto the base
    action box and clipped again (floating-point safety), as in the reference. ``action_space``
    is deliberately left as the base env's native box because the reference draws its initial
    random-exploration actions from it (and stores them unclipped).
    """

    def __init__(self, env: gymnasium.Env, spec: TaskSpec, seed: int | None = None):
        super().__init__(env)
        base_obs = env.observation_space
        if not isinstance(base_obs, spaces.Box) or len(base_obs.shape) != 1:
            raise ValueError(
                f"POMDPWrapper needs a 1-D Box observation space, got {base_obs!r} from {spec.base_id!r}"
            )
        idx = np.asarray(spec.obs_indices, dtype=np.intp)
        n_base = base_obs.shape[0]
        bad = [int(i) for i in idx if not 0 <= i < n_base]
        if bad or idx.size == 0:
            raise ValueError(
                f"Task {spec.name!r}: observation indices {bad or list(idx)} are invalid for base "
                f"{spec.base_id!r} whose observation has {n_base} dims (allowed 0..{n_base - 1})"
            )
        self._idx = idx
        self._task_spec = spec
        self.max_episode_steps = spec.max_episode_steps
        self.observation_space = spaces.Box(
            low=base_obs.low[idx].astype(np.float32),
            high=base_obs.high[idx].astype(np.float32),
            dtype=np.float32,
        )

        act = env.action_space
        if not isinstance(act, spaces.Box):
            raise ValueError(f"Unsupported action space {act!r} for {spec.base_id!r}; allowed: Box")
        self._act_low = act.low.astype(np.float64)
        self._act_high = act.high.astype(np.float64)

        self._pending_seed = seed
        if seed is not None:
            self.action_space.seed(seed)

    # Overrides gymnasium's EnvSpec on purpose so callers can read the task description without
    # touching private attributes. TaskSpec carries ``id`` and ``max_episode_steps``, the two
    # fields gymnasium's own wrappers read from ``spec``.
    @property
    def spec(self) -> TaskSpec:  # type: ignore[override]
        return self._task_spec

    def _observe(self, obs: np.ndarray) -> np.ndarray:
        # Fancy indexing already copies; the float32 cast makes dtype uniform across base envs.
        return np.asarray(obs)[self._idx].astype(np.float32)

    def rng_state(self) -> dict:
        """The env's and the action sampler's RNG states, for checkpoints."""
        return {"env": self.unwrapped.np_random.bit_generator.state,
                "action_space": self.action_space.np_random.bit_generator.state,
                "pending_seed": self._pending_seed}

    def set_rng_state(self, state: dict) -> None:
        """Continue the RNG streams of a checkpoint: the next reset is the one the saved run would have made."""
        self.unwrapped.np_random.bit_generator.state = state["env"]
        self.action_space.np_random.bit_generator.state = state["action_space"]
        self._pending_seed = state["pending_seed"]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is None and self._pending_seed is not None:
            seed = self._pending_seed
        # Only the first reset is seeded implicitly; later resets continue the env's RNG stream.
        self._pending_seed = None
        obs, info = self.env.reset(seed=seed, options=options)
        return self._observe(obs), info

    def _rescale(self, action: Any) -> np.ndarray:
        a = np.asarray(action, dtype=np.float64)
        if a.shape != self._act_low.shape:
            raise ValueError(
                f"Action shape {a.shape} does not match {self._task_spec.name!r}, "
                f"which expects shape {self._act_low.shape}"
            )
        a = np.clip(a, -1.0, 1.0)
        a = self._act_low + (a + 1.0) * 0.5 * (self._act_high - self._act_low)
        a = np.clip(a, self._act_low, self._act_high)
        return a.astype(self.env.action_space.dtype)

    def step(self, action: Any):
        action = self._rescale(action)
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._observe(obs), reward, terminated, truncated, info

    # The two halves of ``step``, as an ``EnvInWorker`` has them (there the step runs in between; here in
    # ``step_wait``), so that one rollout loop serves both.
    def step_async(self, action: Any) -> None:
        self._action = action

    def step_wait(self):
        action, self._action = self._action, None
        return self.step(action)

    def reset_from(self, rng: dict) -> tuple[np.ndarray, dict]:
        """Reset from the RNG state ``rng``: (the first observation, the RNG state after the reset), one link
        of the evaluation's RNG chain (``Trainer._episodes_together``)."""
        self.set_rng_state(rng)
        obs, _ = self.reset()
        return obs, self.rng_state()


class EnvInWorker:
    """A task's env in a worker process, stepped there while the caller goes on: several of them step at once on
    as many cores (``eval.workers``). It is Gymnasium's AsyncVectorEnv of one env, with autoreset off (the
    rollout resets an env only when it starts its next episode), seen as one env: ``reset``, ``step`` or
    ``step_async`` and ``step_wait``, and the env's own calls (``rng_state``, ``set_rng_state``,
    ``reset_from``) forwarded to it. Observations, rewards and RNG streams are those of the same env in this
    process (tests/test_envs.py)."""

    runs_elsewhere = True

    def __init__(self, name: str, seed: int | None = None):
        self.venv = gymnasium.vector.AsyncVectorEnv(
            [functools.partial(_make_env_in_worker, name, seed, os.getpid())], shared_memory=False,
            context=worker_start_method(), autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED)
        _OPEN_WORKERS.add(self)
        self.max_episode_steps = get_task(name).max_episode_steps
        self.observation_space = self.venv.single_observation_space
        self.action_space = self.venv.single_action_space

    def reset(self, **kwargs):
        obs, info = self.venv.reset(**kwargs)
        return obs[0], _first(info)

    def step_async(self, action: Any) -> None:
        self.venv.step_async(np.asarray(action)[None])

    def step_ready(self) -> bool:
        """Whether the step sent by ``step_async`` is done (its result waiting in the pipe): ``step_wait`` would
        not block."""
        return self.venv.parent_pipes[0].poll()

    def step_wait(self):
        obs, reward, terminated, truncated, info = self.venv.step_wait()
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), _first(info)

    def step(self, action: Any):
        self.step_async(action)
        return self.step_wait()

    # The action sampler that draws (the random pool's uniform actions) is this process's copy of the space,
    # seeded as the worker's: its state is taken from here, the env's from the worker.
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
            # Gymnasium's close waits for a step in flight first, which a dead worker never answers: end it here,
            # with SIGKILL (the worker ignores SIGTERM, see _make_env_in_worker).
            for process in self.venv.processes:
                if process.exitcode is None:
                    process.kill()
            for pipe in self.venv.parent_pipes:
                if pipe is not None:
                    pipe.close()
            for process in self.venv.processes:
                process.join(timeout=5)
            self.venv.closed = True  # its __del__ would try again


# Workers still open when the interpreter exits are closed before multiprocessing's own exit handler runs:
# that one stops daemon processes with SIGTERM, which these ignore, and would then wait for them forever.
# (Registered after multiprocessing.util, whose import registers that handler: atexit runs the later first.)
_OPEN_WORKERS: "weakref.WeakSet[EnvInWorker]" = weakref.WeakSet()


@atexit.register
def _close_open_workers() -> None:
    for env in list(_OPEN_WORKERS):
        env.close()


WORKER_START_METHODS = ("forkserver", "spawn")


def check_worker_start_method(current: str | None, whose: str = "this process uses") -> None:
    """Refuse to start env workers from a process whose start method is none of Python's: a child of forkserver
    or spawn takes its parent's start method with it, and joblib's loky (the local launcher's workers) sets its
    own, from which a worker cannot start."""
    if current not in (None, "fork", *WORKER_START_METHODS):
        raise ValueError(f"evaluation envs in worker processes (eval.workers) need one of Python's start "
                         f"methods, but {whose} {current!r} (joblib's local launcher runs its jobs in loky's "
                         "workers); run them with hydra/launcher=slurm_local or basic, or set eval.workers=false")


def worker_start_method() -> str:
    """How ``EnvInWorker`` starts its process: forkserver where there is one, else spawn; never fork, since this
    process may hold CUDA and OpenMP threads, which a forked child must not inherit. The forkserver preloads
    this module and, when the entry point is one of the project's (``python -m pomdp_ffm.train``), that one: a
    worker starts with what it would otherwise import again (torch among it), shared with the others."""
    check_worker_start_method(multiprocessing.get_start_method(allow_none=True))
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    main = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) or ""
    preload = [__name__] + ([main] if main.startswith("pomdp_ffm.") else [])
    multiprocessing.get_context("forkserver").set_forkserver_preload(preload)
    return "forkserver"


def _make_env_in_worker(name: str, seed: int | None, main_pid: int) -> "POMDPWrapper":
    # The job's stop signals (SLURM signals every process of the job; a terminal's Ctrl-C the whole group) are
    # the main process's to act on: it checkpoints, then closes the workers. (Gymnasium also builds one env in
    # the main process to read its spaces: that one leaves the handlers alone.)
    if os.getpid() != main_pid:
        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None), getattr(signal, "SIGUSR2", None)):
            if sig is not None:
                signal.signal(sig, signal.SIG_IGN)
    return make_env(name, seed)


def _first(info: dict) -> dict:
    """The first env's entries of a vector env's info (keys it set, without their ``_key`` masks)."""
    return {k: v[0] for k, v in info.items() if not k.startswith("_") and info.get(f"_{k}", [True])[0]}


def make_env(name: str, seed: int | None = None) -> POMDPWrapper:
    """Build the masked environment for task id ``name``.

    With ``seed`` the first ``reset()`` (when called without its own seed) and the action-space
    sampler are seeded with it.
    """
    spec = get_task(name)
    if spec.is_bullet:
        # Imported here because it pulls in pybullet and registers its ids as a side effect;
        # classic and MuJoCo tasks should not pay for that.
        import pybullet_envs_gymnasium  # noqa: F401
    base = gymnasium.make(
        spec.base_id, max_episode_steps=spec.max_episode_steps, **dict(spec.make_kwargs)
    )
    return POMDPWrapper(base, spec, seed=seed)

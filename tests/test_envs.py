import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from hang import HANG_S

from pomdp_ffm.envs import TASKS, POMDPWrapper, TaskSpec, available_tasks, get_task, make_env

FAMILIES = sorted({name.rsplit("-", 2)[0] for name in TASKS})
BLT = ["HopperBLT", "WalkerBLT", "AntBLT", "HalfCheetahBLT"]
MJ = ["HopperMJ", "Walker2dMJ", "HalfCheetahMJ", "AntMJ"]


def _idx(family, variant):
    return TASKS[f"{family}-{variant}-v0"].obs_indices


def _agent_action(env, rng):
    return rng.uniform(-1.0, 1.0, size=env.action_space.shape)


def test_registry_has_all_ids():
    expected = {f"{fam}-{v}-v0" for fam in ["Pendulum"] + BLT + MJ for v in "FPV"}
    assert set(available_tasks()) == expected
    assert all(get_task(n).name == n for n in expected)


@pytest.mark.parametrize("name", available_tasks())
def test_every_task_constructs_and_steps(name):
    spec = get_task(name)
    env = make_env(name, seed=0)
    try:
        assert env.spec is spec
        assert env.max_episode_steps == spec.max_episode_steps
        assert env.observation_space.shape == (len(spec.obs_indices),)
        assert env.observation_space.dtype == np.float32
        assert isinstance(env.action_space, spaces.Box)
        obs, _ = env.reset()
        assert obs.shape == (len(spec.obs_indices),) and obs.dtype == np.float32
        obs, reward, terminated, truncated, _ = env.step(_agent_action(env, np.random.default_rng(0)))
        assert obs.shape == (len(spec.obs_indices),) and obs.dtype == np.float32
        assert np.isfinite(reward)
        # F must expose the base observation in full, so every index list is a subset of it.
        base_dim = env.unwrapped.observation_space.shape[0]
        assert set(spec.obs_indices) <= set(range(base_dim))
        if name.endswith("-F-v0"):
            assert spec.obs_indices == tuple(range(base_dim))
    finally:
        env.close()


@pytest.mark.parametrize(
    "family,p_dim,v_dim",
    [("Pendulum", 2, 1), ("HopperBLT", 9, 6), ("WalkerBLT", 13, 9), ("AntBLT", 17, 11), ("HalfCheetahBLT", 17, 9)],
)
def test_reference_dims(family, p_dim, v_dim):
    assert len(_idx(family, "P")) == p_dim
    assert len(_idx(family, "V")) == v_dim


@pytest.mark.parametrize("family", BLT + MJ)
def test_p_and_v_partition_f(family):
    p, v, f = (set(_idx(family, x)) for x in "PVF")
    assert p | v == f
    assert not p & v
    assert len(p) == len(_idx(family, "P")) and len(v) == len(_idx(family, "V"))


@pytest.mark.parametrize(
    "family,joints,contacts", [("HopperBLT", 3, 1), ("WalkerBLT", 6, 2), ("AntBLT", 8, 4), ("HalfCheetahBLT", 6, 6)]
)
def test_blt_lists_follow_the_documented_layout(family, joints, contacts):
    # Rebuild the lists from the PyBullet layout (8 torso dims, joint pos/speed pairs, contacts)
    # independently of the literal tables in envs.py.
    joint_pos = [8 + 2 * j for j in range(joints)]
    joint_vel = [8 + 2 * j + 1 for j in range(joints)]
    contact = list(range(8 + 2 * joints, 8 + 2 * joints + contacts))
    assert list(_idx(family, "P")) == [0, 1, 2, 6, 7] + joint_pos + contact
    assert list(_idx(family, "V")) == [3, 4, 5] + joint_vel


@pytest.mark.parametrize("family", MJ)
def test_mujoco_lists_match_qpos_qvel(family):
    env = make_env(f"{family}-F-v0", seed=1)
    try:
        obs, _ = env.reset()
        rng = np.random.default_rng(1)
        for _ in range(5):
            obs, *_ = env.step(rng.uniform(-1, 1, size=env.action_space.shape))
        data = env.unwrapped.data
        nq, nv = data.qpos.size, data.qvel.size
        p, v = np.array(_idx(family, "P")), np.array(_idx(family, "V"))
        assert obs.shape == (len(p) + len(v),)
        # P must be exactly the observed qpos tail (root x, and y for Ant, are hidden) and V all
        # of qvel; Hopper/Walker clip velocities at +-10 inside the observation.
        assert len(v) == nv
        assert len(p) == nq - (2 if family == "AntMJ" else 1)
        np.testing.assert_array_equal(obs[p], data.qpos[nq - len(p) :].astype(obs.dtype))
        np.testing.assert_array_equal(obs[v], np.clip(data.qvel, -10, 10).astype(obs.dtype))
    finally:
        env.close()


@pytest.mark.parametrize("family", ["Pendulum", "HopperBLT", "AntMJ"])
@pytest.mark.parametrize("variant", ["P", "V"])
def test_masked_obs_equals_full_obs_at_indices(family, variant):
    full, part = make_env(f"{family}-F-v0", seed=5), make_env(f"{family}-{variant}-v0", seed=5)
    try:
        idx = np.array(_idx(family, variant))
        of, _ = full.reset()
        op, _ = part.reset()
        np.testing.assert_array_equal(op, of[idx])
        rng = np.random.default_rng(0)
        for _ in range(10):
            a = _agent_action(full, rng)
            of, *_ = full.step(a)
            op, *_ = part.step(a)
            np.testing.assert_array_equal(op, of[idx])
    finally:
        full.close()
        part.close()


@pytest.mark.parametrize("agent_a,torque", [(1.0, 2.0), (0.0, 0.0), (5.0, 2.0), (-0.5, -1.0), (-3.0, -2.0)])
def test_pendulum_action_rescaling(agent_a, torque):
    env = make_env("Pendulum-F-v0", seed=7)
    base = gymnasium.make("Pendulum-v1")
    try:
        # The wrapper keeps the native box because random exploration samples from it.
        assert env.action_space == spaces.Box(-2.0, 2.0, (1,), np.float32)
        o_env, _ = env.reset()
        o_base, _ = base.reset(seed=8)  # the reference's env of seed 7 starts from 8 (make_env)
        np.testing.assert_array_equal(o_env, o_base)
        o_env, r_env, *_ = env.step(np.array([agent_a]))
        assert env.unwrapped.last_u == pytest.approx(torque)
        o_base, r_base, *_ = base.step(np.array([torque], dtype=np.float32))
        np.testing.assert_array_equal(o_env, o_base)
        assert r_env == r_base
    finally:
        env.close()
        base.close()


class _RecordingEnv(gymnasium.Env):
    """Minimal env that remembers the last action it was stepped with."""

    def __init__(self, low, high):
        self.observation_space = spaces.Box(-np.ones(4), np.ones(4) * 3.0, dtype=np.float64)
        self.action_space = spaces.Box(np.array(low, np.float32), np.array(high, np.float32))
        self.last_action = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.arange(4, dtype=np.float64), {}

    def step(self, action):
        self.last_action = np.array(action)
        return np.arange(4, dtype=np.float64) + 1, 0.0, False, False, {}


def test_rescaling_uses_affine_map_onto_asymmetric_box():
    spec = TaskSpec("Dummy-P-v0", "dummy", (3, 1), 10)
    env = POMDPWrapper(_RecordingEnv([0.0, -3.0], [10.0, 1.0]), spec)
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs, np.array([3.0, 1.0], np.float32))
    assert obs.dtype == np.float32
    np.testing.assert_array_equal(env.observation_space.low, np.array([-1, -1], np.float32))
    np.testing.assert_array_equal(env.observation_space.high, np.array([3, 3], np.float32))
    for a, expected in [([-1, 1], [0, 1]), ([0, 0], [5, -1]), ([0.5, -0.5], [7.5, -2]), ([2, -7], [10, -3])]:
        env.step(np.array(a, dtype=np.float64))
        np.testing.assert_allclose(env.unwrapped.last_action, expected, atol=1e-6)
        assert env.unwrapped.last_action.dtype == np.float32
    with pytest.raises(ValueError, match=r"\(3,\).*\(2,\)"):
        env.step(np.zeros(3))


def test_wrapper_rejects_out_of_range_indices():
    spec = TaskSpec("Dummy-P-v0", "dummy", (0, 4), 10)
    with pytest.raises(ValueError, match=r"\[4\].*4 dims"):
        POMDPWrapper(_RecordingEnv([0.0], [1.0]), spec)


def test_discrete_tasks_are_not_registered():
    # SAC-discrete is not part of the project, so the reference's CartPole and LunarLander tasks (the
    # latter needs Box2D) are not offered at all, rather than offered and then refused by the trainer.
    with pytest.raises(ValueError, match=r"Unknown task 'CartPole-V-v0'.*Known tasks: Pendulum-F-v0"):
        get_task("CartPole-V-v0")
    with pytest.raises(ValueError, match=r"Unsupported action space Discrete\(2\).*allowed: Box"):
        POMDPWrapper(gymnasium.make("CartPole-v1"), TaskSpec("CartPole-V-v0", "CartPole-v1", (1, 3), 200))


@pytest.mark.parametrize("name", ["Pendulum-V-v0", "Pendulum-P-v0", "HopperMJ-P-v0", "WalkerBLT-V-v0"])
def test_same_seed_same_trajectory(name):
    def rollout(seed):
        env = make_env(name, seed=seed)
        try:
            obs = [env.reset()[0]]
            samples = [np.array(env.action_space.sample()) for _ in range(3)]
            rng = np.random.default_rng(123)
            for _ in range(15):
                o, _, term, trunc, _ = env.step(_agent_action(env, rng))
                obs.append(o)
                if term or trunc:
                    break
            return np.stack(obs), np.stack(samples)
        finally:
            env.close()

    obs_a, act_a = rollout(11)
    obs_b, act_b = rollout(11)
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(act_a, act_b)
    obs_c, act_c = rollout(12)
    # Compare whole trajectories: velocity-only observations can be all-zero at reset.
    n = min(len(obs_a), len(obs_c))
    assert not np.array_equal(obs_a[:n], obs_c[:n])
    assert not np.array_equal(act_a, act_c)


def test_only_first_reset_is_implicitly_seeded():
    env = make_env("Pendulum-F-v0", seed=3)
    first, _ = env.reset()
    second, _ = env.reset()
    assert not np.array_equal(first, second)
    again, _ = env.reset(seed=4)  # seed + 1, as the reference's env of seed 3 (make_env)
    np.testing.assert_array_equal(first, again)


class _ReferenceWrapper:
    """What the reference does to a base env, as docs/reference.md describes it (POMDP-Baselines'
    envs/pomdp/wrappers.py and policies/learner.py): the env seeded with ``seed``, then, being also the evaluation
    env, with ``seed + 1``, its action sampler with ``seed``; observations cut to the task's indices; an action
    clipped to [-1, 1], mapped onto the base box and clipped again, in numpy's arithmetic on the float32 actions
    its agent and sampler give it. gym 0.21's ``env.seed(s)`` set the env's generator to ``seeding.np_random(s)``
    (the PyBullet envs keep that method; Gymnasium's Pendulum has only the generator)."""

    def __init__(self, name, seed):
        spec = get_task(name)
        if spec.base_id.endswith("BulletEnv-v0"):
            import pybullet_envs_gymnasium  # noqa: F401

        self.env = gymnasium.make(spec.base_id, max_episode_steps=spec.max_episode_steps)
        self.idx = list(spec.obs_indices)
        for s in (seed, seed + 1):
            if hasattr(self.env.unwrapped, "seed"):
                self.env.unwrapped.seed(s)
            else:
                self.env.unwrapped.np_random = gymnasium.utils.seeding.np_random(s)[0]
        self.env.action_space.seed(seed)

    def reset(self):
        return self.env.reset()[0][self.idx].copy()

    def step(self, action):
        lb, ub = self.env.action_space.low, self.env.action_space.high
        action = np.clip(action, -1, 1)
        action = lb + (action + 1.0) * 0.5 * (ub - lb)
        action = np.clip(action, lb, ub)
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return obs[self.idx].copy(), reward, terminated or truncated


@pytest.mark.parametrize(
    "name", ["Pendulum-V-v0", "HopperBLT-V-v0", "WalkerBLT-P-v0", "AntBLT-V-v0", "HalfCheetahBLT-P-v0"]
)
def test_first_episodes_equal_the_reference_wrappers(name):
    # The same seed and the same actions (the random pool's, drawn from the action sampler, then an agent's in
    # [-1.2, 1.2], some outside the box): the same observations and rewards, bit for bit, over the first
    # episodes. The reference's agent sees its observations as float32 (its buffer's and networks' dtype).
    ours, ref = make_env(name, seed=3), _ReferenceWrapper(name, seed=3)
    agent = np.random.default_rng(0)
    try:
        for episode in range(3):
            o_ours, o_ref = ours.reset()[0], ref.reset()
            np.testing.assert_array_equal(o_ours, o_ref.astype(np.float32), err_msg=f"episode {episode}, reset")
            for t in range(150):
                if episode == 0:
                    a, a_ref = ours.action_space.sample(), ref.env.action_space.sample()
                    np.testing.assert_array_equal(a, a_ref)
                else:
                    a = agent.uniform(-1.2, 1.2, ours.action_space.shape).astype(np.float32)
                o_ours, r_ours, term, trunc, _ = ours.step(a)
                o_ref, r_ref, done = ref.step(a)
                np.testing.assert_array_equal(o_ours, o_ref.astype(np.float32), err_msg=f"episode {episode}, t={t}")
                assert r_ours == r_ref, (episode, t)
                assert (term or trunc) == done
                if done:
                    break
    finally:
        ours.close()
        ref.env.close()


def test_the_action_mapping_is_the_reference_float32_arithmetic():
    # Where float64 arithmetic rounds otherwise: the action the base env receives is the float32 computation's.
    env = make_env("HopperBLT-V-v0", seed=0)
    base = env.unwrapped
    stepped = []
    original = base.step
    base.step = lambda a: (stepped.append(np.array(a)), original(a))[1]
    try:
        env.reset()
        actions = np.random.default_rng(1).uniform(-1, 1, (200, 3)).astype(np.float32)
        lb, ub = env.action_space.low, env.action_space.high
        for a in actions:
            env.step(a)
        got = np.stack(stepped)
        in_float32 = np.clip(lb + (np.clip(actions, -1, 1) + 1.0) * 0.5 * (ub - lb), lb, ub)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, in_float32)  # (numpy's float32 arithmetic: exactly rounded, any CPU)
    finally:
        env.close()


def _episodes(env, actions):
    """(observations, rewards, flags) of one episode per row of ``actions``, the env reset before each."""
    out = []
    for acts in actions:
        obs, rewards, flags = [env.reset()[0]], [], []
        for a in acts:
            o, r, term, trunc, _ = env.step(a)
            obs.append(o)
            rewards.append(r)
            flags.append((term, trunc))
            if term or trunc:
                break
        out.append((np.stack(obs), np.array(rewards), flags))
    return out


@pytest.mark.parametrize("name", ["HopperBLT-V-v0", "AntBLT-F-v0", "Pendulum-V-v0", "HopperMJ-V-v0"])
@pytest.mark.parametrize("state_from", ["now", "before past_first_reset"])
def test_a_restored_env_replays_the_saved_ones_episodes(name, state_from):
    # What a resumed run does with its new env (Trainer._restore). A PyBullet env's first reset is not like its later
    # ones (pybullet_envs adds the floor to the robot's parts after it: the first episode's first reward differs,
    # AntBLT's first observation too); an env restored at an episode boundary of one past it must be past it too.
    rng = np.random.default_rng(0)
    saved = make_env(name, seed=1)
    try:
        actions = rng.uniform(-1.0, 1.0, size=(4, 40, saved.action_space.shape[0]))
        _episodes(saved, actions[:2])
        state = saved.rng_state()
        assert state["past_first_reset"] and state["pending_seed"] is None
        if state_from != "now":  # a checkpoint written before the key: its spent seed says the same
            del state["past_first_reset"]
        restored = make_env(name, seed=1)
        try:
            restored.set_rng_state(state)
            assert restored.rng_state() == saved.rng_state()
            for (o_want, r_want, f_want), (o_got, r_got, f_got) in zip(
                _episodes(saved, actions[2:]), _episodes(restored, actions[2:])
            ):
                np.testing.assert_array_equal(o_got, o_want)
                np.testing.assert_array_equal(r_got, r_want)
                assert f_got == f_want
        finally:
            restored.close()
    finally:
        saved.close()


def test_a_pybullet_envs_first_reset_is_unlike_its_later_ones():
    # Why a restored env is reset once first (above): without it, the same RNG state, the same actions, the same
    # observations, but another first reward. (If pybullet_envs_gymnasium ever changes this, the warm-up reset in
    # POMDPWrapper.set_rng_state is no longer needed.)
    saved, fresh = make_env("HopperBLT-V-v0", seed=1), make_env("HopperBLT-V-v0", seed=1)
    try:
        saved.reset()
        state = saved.rng_state()
        a = np.full(saved.action_space.shape, 0.5)
        fresh.set_rng_state({**state, "past_first_reset": False})  # as restored without the warm-up
        o_saved, o_fresh = saved.reset()[0], fresh.reset()[0]
        np.testing.assert_array_equal(o_fresh, o_saved)
        (o_saved, r_saved, *_), (o_fresh, r_fresh, *_) = saved.step(a), fresh.step(a)
        np.testing.assert_array_equal(o_fresh, o_saved)
        assert r_fresh != r_saved
    finally:
        saved.close()
        fresh.close()


def test_time_out_is_truncated_not_terminated():
    env = make_env("Pendulum-P-v0", seed=0)
    env.reset()
    for t in range(1, 201):
        _, _, terminated, truncated, _ = env.step(np.array([0.3]))
        assert not terminated
        assert truncated == (t == 200), t
    assert env.max_episode_steps == 200


def test_unknown_task_names_the_value_and_lists_known_ones():
    with pytest.raises(ValueError) as err:
        make_env("HopperBLT-X-v0")
    msg = str(err.value)
    assert "'HopperBLT-X-v0'" in msg
    assert all(name in msg for name in available_tasks())
    assert "HopperBLT-F-v0" in msg.split("Known tasks")[0]  # close-match hint
    with pytest.raises(ValueError, match="Known tasks"):
        get_task(None)


def test_taskspec_is_frozen_and_hashable():
    spec = get_task("AntMJ-V-v0")
    with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
        spec.name = "x"
    assert {spec: 1}[spec] == 1
    assert spec.make_kwargs == {"include_cfrc_ext_in_observation": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert make_env("AntMJ-F-v0").unwrapped.observation_space.shape == (27,)


@pytest.mark.parametrize("name", ["Pendulum-V-v0", "HopperBLT-P-v0", "HopperMJ-V-v0"])
def test_an_env_in_a_worker_is_the_env_here(name):
    # Resets, steps (also split into step_async / step_wait), rewards, flags and RNG streams, through two
    # episodes and a reset from a saved RNG state (the evaluation's chain).
    from pomdp_ffm.envs import EnvInWorker

    here, there = make_env(name, seed=5), EnvInWorker(name, seed=5)
    try:
        assert there.max_episode_steps == here.max_episode_steps
        assert there.observation_space == here.observation_space and there.action_space == here.action_space
        rng = np.random.default_rng(0)
        saved_at_start = here.rng_state()
        for _ in range(2):
            np.testing.assert_array_equal(there.reset()[0], here.reset()[0])
            for t in range(60):
                a = _agent_action(here, rng)
                if t % 2:
                    there.step_async(a)
                    got = there.step_wait()
                else:
                    got = there.step(a)
                want = here.step(a)
                np.testing.assert_array_equal(got[0], want[0])
                assert got[1:4] == (float(want[1]), bool(want[2]), bool(want[3]))
                if want[2] or want[3]:
                    break
            assert there.rng_state() == here.rng_state()
        # the random pool's sampler: this process's copy, seeded as the env's, saved and restored with it
        np.testing.assert_array_equal(there.action_space.sample(), here.action_space.sample())
        assert there.rng_state() == here.rng_state()
        there.set_rng_state(saved_at_start)
        here.set_rng_state(saved_at_start)
        np.testing.assert_array_equal(there.action_space.sample(), here.action_space.sample())
        saved = here.rng_state()
        here.step(_agent_action(here, rng))
        obs, after = there.reset_from(saved)
        want_obs, want_after = here.reset_from(saved)
        np.testing.assert_array_equal(obs, want_obs)
        assert after == want_after
    finally:
        there.close()
        here.close()


def test_a_worker_leaves_the_jobs_stop_signals_to_the_main_process():
    # SLURM signals every process of a job, a terminal's Ctrl-C the whole group: the worker ignores them (the
    # main process checkpoints, then closes it), and building it leaves this process's handlers as they were.
    import os
    import signal
    import time

    from pomdp_ffm.envs import EnvInWorker

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}
    env = EnvInWorker("Pendulum-V-v0", seed=0)
    try:
        assert {s: signal.getsignal(s) for s in before} == before
        env.reset()
        pid = env.venv.processes[0].pid
        for s in before:
            os.kill(pid, s)
        time.sleep(0.2)
        assert env.venv.processes[0].is_alive()
        env.step(np.zeros(1))
    finally:
        env.close()


@pytest.mark.filterwarnings("ignore:.*pending call:UserWarning")
def test_closing_an_env_whose_worker_died_does_not_raise():
    import os
    import signal

    from pomdp_ffm.envs import EnvInWorker

    env = EnvInWorker("Pendulum-V-v0", seed=0)
    env.reset()
    env.step_async(np.zeros(1))  # a step in flight
    os.kill(env.venv.processes[0].pid, signal.SIGKILL)
    env.venv.processes[0].join(HANG_S)
    env.close()
    assert not env.venv.processes[0].is_alive()


def test_workers_under_a_start_method_they_cannot_use_are_refused(monkeypatch):
    import multiprocessing

    from pomdp_ffm.envs import worker_start_method

    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "loky")
    with pytest.raises(ValueError, match=r"this process uses 'loky'.*set eval.workers=false"):
        worker_start_method()


def test_a_process_that_never_closed_its_worker_still_exits():
    # The worker ignores SIGTERM, which multiprocessing's exit handler sends to daemon processes before waiting
    # for them: the project closes its workers first.
    import subprocess
    import sys

    script = (
        "from pomdp_ffm.envs import EnvInWorker\n"
        "if __name__ == '__main__':\n"
        "    env = EnvInWorker('Pendulum-V-v0', seed=0)\n"
        "    env.reset()\n"
        "    env.step_async([0.0])  # even with a step in flight\n"
        "    print('built', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0 and "built" in proc.stdout, proc.stderr[-2000:]


def test_a_trainer_that_fails_to_build_closes_its_env(run_cfg, tmp_path, monkeypatch):
    from pomdp_ffm import trainer as trainer_mod

    made, closed = [], []

    def recorded(*a, **kw):
        env = make_env(*a, **kw)
        close = env.close
        env.close = lambda: closed.append(env) or close()
        made.append(env)
        return env

    def broken(*a, **kw):
        raise RuntimeError("no memory left for the updater")

    monkeypatch.setattr(trainer_mod, "make_env", recorded)
    monkeypatch.setattr(trainer_mod, "UpdateRunner", broken)
    with pytest.raises(RuntimeError, match="no memory left"):
        trainer_mod.Trainer(run_cfg(), tmp_path / "r")
    assert len(made) == 1 and closed == made

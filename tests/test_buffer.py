import numpy as np
import pytest

from pomdp_ffm.buffer import TRANSITIONS, Batch, SeqReplayBuffer
from pomdp_ffm.rollout import Episode


def episode(ep_id, length, obs_dim=2, act_dim=1, terminal=False):
    """Transitions whose obs encode (episode id, step) so sampled windows can be decoded."""
    steps = np.arange(length, dtype=np.float32)
    obs = np.zeros((length, obs_dim), np.float32)
    obs[:, 0] = ep_id
    obs[:, 1] = steps
    next_obs = obs.copy()
    next_obs[:, 1] += 1
    actions = np.repeat((ep_id * 1000 + steps)[:, None], act_dim, axis=1)
    rewards = ep_id + steps / 100.0
    terminals = np.zeros(length, np.float32)
    terminals[-1] = float(terminal)
    return obs, actions, rewards, terminals, next_obs


def as_episode(*arrays) -> Episode:
    return Episode(**dict(zip(TRANSITIONS, arrays)), ret=0.0, length=len(arrays[0]), success=False)


def add(buf, ep_id, length, **kw):
    buf.add_episode(as_episode(*episode(ep_id, length, obs_dim=buf.obs_dim, act_dim=buf.act_dim, **kw)))


def window_of(batch, b):
    """(episode id, first step) of window b."""
    return int(batch.observs[0, b, 0]), int(batch.observs[0, b, 1])


# ---------------------------------------------------------------- weights
@pytest.mark.parametrize(
    "length,beta,expected",
    [
        (3, 0.0, [1, 0, 0]),  # L < T: one legal start
        (5, 0.0, [1, 0, 0, 0, 0]),  # L = T
        (8, 0.0, [1, 1, 1, 1, 0, 0, 0, 0]),  # L > T: n = L - T + 1 = 4
        (8, 2.0, [1.5, 1.5, 1.5, 1.5, 0, 0, 0, 0]),  # (beta + n) / n
        (3, 2.0, [3, 0, 0]),
        (2, 0.5, [1.5, 0]),
    ],
)
def test_start_weights(length, beta, expected):
    buf = SeqReplayBuffer(20, 2, 1, sampled_seq_len=5, sample_weight_baseline=beta)
    add(buf, 0, length)
    np.testing.assert_array_equal(buf.weights[:length], expected)
    assert np.all(buf.weights[length:] == 0)
    assert len(buf) == length and buf.top == length


def test_sequence_length_one_makes_every_step_a_start():
    buf = SeqReplayBuffer(10, 2, 1, sampled_seq_len=1)
    add(buf, 0, 4)
    np.testing.assert_array_equal(buf.weights[:4], 1.0)
    batch = buf.sample(50)
    assert batch.masks.shape == (1, 50, 1) and np.all(batch.masks == 1)


# ---------------------------------------------------------------- batch contents
def test_batch_is_time_major_float32_and_matches_stored_transitions():
    buf = SeqReplayBuffer(200, 3, 2, sampled_seq_len=6, seed=0)
    for i, length in enumerate([9, 4, 15, 2, 30]):
        add(buf, i, length, terminal=(i % 2 == 0))
    batch = buf.sample(32)
    assert isinstance(batch, Batch)
    shapes = {"observs": 3, "actions": 2, "rewards": 1, "terminals": 1, "next_observs": 3, "masks": 1}
    for name, dim in shapes.items():
        arr = getattr(batch, name)
        assert arr.shape == (6, 32, dim), name
        assert arr.dtype == np.float32 and arr.flags.c_contiguous, name  # one copy each into a staging buffer
    assert batch.first_step.shape == (32,) and batch.first_step.dtype == np.int64
    lengths = [9, 4, 15, 2, 30]
    for b in range(32):
        ep, s = window_of(batch, b)
        assert batch.first_step[b] == s  # the window's first step in its episode
        valid = int(batch.masks[:, b, 0].sum())
        for t in range(valid):
            step = s + t
            assert batch.observs[t, b, 0] == ep and batch.observs[t, b, 1] == step
            assert batch.next_observs[t, b, 1] == step + 1
            np.testing.assert_array_equal(batch.actions[t, b], ep * 1000 + step)
            assert batch.rewards[t, b, 0] == pytest.approx(ep + step / 100.0)
            assert batch.terminals[t, b, 0] == float(ep % 2 == 0 and step == lengths[ep] - 1)


def test_windows_never_cross_an_episode_start():
    buf = SeqReplayBuffer(500, 2, 1, sampled_seq_len=8, seed=1)
    lengths = [3, 12, 8, 2, 20, 5, 9]
    for i, length in enumerate(lengths):
        add(buf, i, length)
    batch = buf.sample(2000)
    mask = batch.masks[:, :, 0]
    # The mask is a prefix of ones: once a window leaves its episode it never comes back.
    assert np.all(np.diff(mask, axis=0) <= 0)
    for b in range(mask.shape[1]):
        ep, s = window_of(batch, b)
        valid = int(mask[:, b].sum())
        # Legal starts: the window fits, or it is the single start of a short episode.
        assert s == 0 or s + 8 <= lengths[ep]
        assert valid == min(8, lengths[ep] - s)
        assert np.all(batch.observs[:valid, b, 0] == ep)
        if valid < 8 and ep + 1 < len(lengths):
            # Padding holds the real next episode's data, removed only by the mask.
            assert batch.observs[valid, b, 0] == ep + 1 and batch.observs[valid, b, 1] == 0


# ---------------------------------------------------------------- distribution
def test_sampling_is_uniform_over_legal_starts():
    buf = SeqReplayBuffer(100, 2, 1, sampled_seq_len=5, seed=123)
    add(buf, 0, 10)
    add(buf, 1, 50)
    draws = 52_000
    starts = buf.sample_starts(draws)
    counts = np.bincount(starts, minlength=100)
    legal = np.r_[0:6, 10:56]
    assert counts[np.setdiff1d(np.arange(100), legal)].sum() == 0
    expected = draws / legal.size
    chi2 = ((counts[legal] - expected) ** 2 / expected).sum()
    # 99.9% quantile of chi-square with 51 degrees of freedom is ~87.97.
    assert chi2 < 88.0
    # Episode shares follow the number of legal starts, 6 : 46.
    assert counts[:6].sum() / draws == pytest.approx(6 / 52, abs=0.005)


def test_sample_weight_baseline_upweights_short_episodes():
    buf = SeqReplayBuffer(100, 2, 1, sampled_seq_len=5, sample_weight_baseline=10.0, seed=4)
    add(buf, 0, 10)
    add(buf, 1, 50)
    starts = buf.sample_starts(40_000)
    # Episode totals are beta + n: 16 and 56.
    assert np.mean(starts < 10) == pytest.approx(16 / 72, abs=0.007)


def test_sample_distribution_matches_weights_after_rewrite():
    # The cached cumulative weights must be refreshed after every write.
    buf = SeqReplayBuffer(30, 2, 1, sampled_seq_len=3, seed=2)
    add(buf, 0, 20)
    first = buf.sample_starts(5)
    assert np.all(first < 18)
    add(buf, 1, 20)  # overwrites slots 20..29 and 0..9; top = 10
    starts = buf.sample_starts(5000)
    assert set(np.unique(starts)) == set(range(20, 30)) | set(range(0, 8)) | set(range(10, 18))


# ---------------------------------------------------------------- wrap-around and top
def test_wrap_around_with_partial_overwrite():
    buf = SeqReplayBuffer(20, 2, 1, sampled_seq_len=4, seed=0)
    add(buf, 0, 8)  # slots 0..7
    add(buf, 1, 8)  # slots 8..15
    add(buf, 2, 7)  # slots 16..19, 0..2
    assert len(buf) == 20 and buf.top == 3
    state = buf.state_dict()
    np.testing.assert_array_equal(state["observs"][[16, 19, 0, 2], 0], [2, 2, 2, 2])
    np.testing.assert_array_equal(state["observs"][[0, 1, 2], 1], [4, 5, 6])
    # Episode 0 keeps its surviving tail (steps 3..7) and that tail's weights (starts 0..4).
    np.testing.assert_array_equal(state["observs"][3:8, 0], 0)
    np.testing.assert_array_equal(state["observs"][3:8, 1], [3, 4, 5, 6, 7])
    np.testing.assert_allclose(buf.weights, [0, 0, 0, 1, 1, 0, 0, 0] + [1] * 5 + [0] * 3 + [1] * 4)
    batch = buf.sample(3000)
    seen = set()
    for b in range(3000):
        ep, s = window_of(batch, b)
        seen.add((ep, s))
        assert batch.first_step[b] == s  # episode 0's too, whose first three steps are overwritten
        valid = int(batch.masks[:, b, 0].sum())
        if (ep, s) == (0, 3):
            assert valid == 0  # its first slot is the write head
        else:
            assert valid == 4
            assert np.all(batch.observs[:, b, 0] == ep)
            np.testing.assert_array_equal(batch.observs[:, b, 1], np.arange(s, s + 4))
    assert seen == {(0, 3), (0, 4), *((1, s) for s in range(5)), *((2, s) for s in range(4))}


def test_write_head_masks_short_newest_episode_before_wrap():
    # Behind the newest short episode lie empty zero-weight slots: no 0 -> positive switch
    # exists there, so only the write-head rule can end the window.
    buf = SeqReplayBuffer(100, 2, 1, sampled_seq_len=8, seed=0)
    add(buf, 0, 10)
    add(buf, 1, 3)
    batch = buf.sample(500)
    newest = batch.observs[0, :, 0] == 1
    assert newest.any()
    np.testing.assert_array_equal(batch.masks[:, newest, 0].sum(axis=0), 3)


def test_write_head_masks_stale_data_after_wrap():
    buf = SeqReplayBuffer(20, 2, 1, sampled_seq_len=6, seed=0)
    add(buf, 0, 20)  # slots 15..19 keep weight 0
    add(buf, 1, 16)  # slots 0..15, top 16; slots 16..19 are episode 0's stale tail
    add(buf, 2, 2)  # slots 16, 17, top 18
    assert buf.top == 18
    batch = buf.sample(2000)
    newest = batch.observs[0, :, 0] == 2
    assert newest.any()
    # Weights along slots 16,17,18,19,0,1 are [1,0,0,0,1,1]: the next 0 -> positive switch is at
    # position 4, but the write head at position 2 must already end the window.
    np.testing.assert_array_equal(batch.masks[:, newest, 0].T, np.tile([1, 1, 0, 0, 0, 0], (newest.sum(), 1)))
    # Padding keeps whatever is stored (episode 0's stale steps 18, 19), not zeros.
    np.testing.assert_array_equal(batch.observs[2:4, newest, 1].T, np.tile([18, 19], (newest.sum(), 1)))


# ---------------------------------------------------------------- checkpointing
@pytest.mark.parametrize("lengths", [[7, 3, 12], [30, 25, 9, 40, 4]])
def test_state_dict_round_trip(lengths):
    buf = SeqReplayBuffer(64, 2, 2, sampled_seq_len=5, sample_weight_baseline=0.5, seed=9)
    for i, length in enumerate(lengths):
        add(buf, i, length)
    buf.sample(16)  # advance the RNG so its state, not the seed, is what gets restored
    state = buf.state_dict()
    assert state["observs"].shape[0] == len(buf) == min(64, sum(lengths))
    clone = SeqReplayBuffer(64, 2, 2, sampled_seq_len=5, sample_weight_baseline=0.5, seed=0)
    clone.load_state_dict(state)
    assert len(clone) == len(buf) and clone.top == buf.top
    for _ in range(3):
        a, b = buf.sample(32), clone.sample(32)
        for name in Batch._fields:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    # Writes after a resume continue identically too.
    add(buf, 99, 11)
    add(clone, 99, 11)
    for name in Batch._fields:
        np.testing.assert_array_equal(getattr(buf.sample(8), name), getattr(clone.sample(8), name))


def test_load_state_dict_rejects_other_configuration():
    buf = SeqReplayBuffer(64, 2, 1, sampled_seq_len=5)
    add(buf, 0, 10)
    other = SeqReplayBuffer(64, 2, 1, sampled_seq_len=6)
    with pytest.raises(ValueError, match="sampled_seq_len=5.*sampled_seq_len=6"):
        other.load_state_dict(buf.state_dict())


# ---------------------------------------------------------------- bad input
def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="capacity.*0"):
        SeqReplayBuffer(0, 2, 1, 5)
    with pytest.raises(ValueError, match="sampled_seq_len.*-1"):
        SeqReplayBuffer(10, 2, 1, -1)
    with pytest.raises(ValueError, match="sample_weight_baseline.*-1"):
        SeqReplayBuffer(10, 2, 1, 5, sample_weight_baseline=-1.0)
    buf = SeqReplayBuffer(10, 2, 1, 5)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4)
    with pytest.raises(ValueError, match="length must be >= 2, got 1"):
        add(buf, 0, 1)
    with pytest.raises(ValueError, match="exceeds capacity"):
        add(buf, 0, 11)
    obs, act, rew, term, obs2 = episode(0, 4)
    with pytest.raises(ValueError, match=r"actions has shape \(4, 3\), expected \(4, 1\)"):
        buf.add_episode(as_episode(obs, np.zeros((4, 3)), rew, term, obs2))
    with pytest.raises(ValueError, match="terminals must be 0/1"):
        buf.add_episode(as_episode(obs, act, rew, np.full(4, 2.0), obs2))
    assert len(buf) == 0  # rejected episodes leave no trace
    add(buf, 0, 4)
    with pytest.raises(ValueError, match="batch_size.*0"):
        buf.sample(0)

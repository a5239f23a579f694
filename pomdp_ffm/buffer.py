"""Sequence replay buffer: POMDP-Baselines' vanilla buffer (whole episodes, windows of T steps).

Storage is a flat circular array of transitions. Each slot carries a start weight: an episode of
length L gets ``n = max(1, L - T + 1)`` legal starts (every window that fits inside it, or just
its first step when L <= T), each weighted ``(beta + n) / n`` so the episode's total is
``beta + n``. With ``beta = 0`` windows are uniform over legal starts in the whole buffer.
Windows that run past their episode are padded with whatever is stored next and removed only
through the mask, exactly like the reference. Each window also carries its first step's index in its episode
(``first_step``), where a time-embedded memory starts it (patches/023).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class Batch(NamedTuple):
    """The batch's one vocabulary, from the collected episode (``rollout.Episode`` has the same per-step fields,
    ``TRANSITIONS``) through the buffer to the update (``update.Aligned``). Time-major float32 arrays ``[T, B, dim]``
    (or tensors); ``rewards``, ``terminals`` and ``masks`` have dim 1; ``first_step`` is int64 ``[B]``."""

    observs: Any  # o_t
    actions: Any  # a_t
    rewards: Any  # r_t
    terminals: Any  # 1 where the env ended the episode itself (a time-out bootstraps)
    next_observs: Any  # o_{t+1}
    masks: Any  # 1 on the steps of the window's own episode, 0 on the padding after it
    first_step: Any  # the index in its episode of the window's first step (what a time-embedded memory reads)


# What an episode stores, per step; a window's masks and first step are the buffer's.
TRANSITIONS = tuple(f for f in Batch._fields if f not in ("masks", "first_step"))


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class SeqReplayBuffer:
    _CONFIG_KEYS = ("capacity", "obs_dim", "act_dim", "sampled_seq_len", "sample_weight_baseline")

    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        act_dim: int,
        sampled_seq_len: int,
        sample_weight_baseline: float = 0.0,
        seed: int | None = None,
    ):
        self.capacity = _positive_int("capacity", capacity)
        self.obs_dim = _positive_int("obs_dim", obs_dim)
        self.act_dim = _positive_int("act_dim", act_dim)
        # The reference's -1 ("whole episodes") must be resolved by the caller to the env's max
        # episode length, so only concrete lengths are accepted here.
        self.sampled_seq_len = _positive_int("sampled_seq_len", sampled_seq_len)
        if self.sampled_seq_len > self.capacity:
            raise ValueError(
                f"sampled_seq_len={self.sampled_seq_len} exceeds capacity={self.capacity}; "
                "a window would overlap itself"
            )
        beta = float(sample_weight_baseline)
        if not np.isfinite(beta) or beta < 0:
            raise ValueError(f"sample_weight_baseline must be finite and >= 0, got {sample_weight_baseline!r}")
        self.sample_weight_baseline = beta
        self._rng = np.random.default_rng(seed)
        # np.zeros maps untouched pages lazily, so a 1e6 buffer costs memory only as it fills.
        dims = {
            "observs": self.obs_dim,
            "actions": self.act_dim,
            "rewards": 1,
            "terminals": 1,
            "next_observs": self.obs_dim,
        }
        self._data = {
            k: np.zeros((self.capacity, dims[k]), dtype=np.uint8 if k == "terminals" else np.float32)
            for k in TRANSITIONS
        }
        self._weights = np.zeros((self.capacity,), dtype=np.float32)
        # Each slot's step index in its episode: kept per slot, so a window starting in an episode whose first
        # slots a newer one has overwritten still knows its time.
        self._steps = np.zeros((self.capacity,), dtype=np.int64)
        self._top = 0
        self._size = 0
        # Cumulative weights for O(log N) inverse-CDF sampling; recomputed only after a write.
        self._cdf: np.ndarray | None = None
        self._last_positive = -1

    def __len__(self) -> int:
        return self._size

    @property
    def top(self) -> int:
        """Write head: the slot the next episode's first transition goes to."""
        return self._top

    @property
    def weights(self) -> np.ndarray:
        """Read-only view of the per-slot start weights."""
        view = self._weights.view()
        view.flags.writeable = False
        return view

    @staticmethod
    def _as_2d(name: str, value: Any, length: int, dim: int) -> np.ndarray:
        arr = np.asarray(value, dtype=np.float32)
        if arr.ndim == 1 and dim == 1:
            arr = arr.reshape(-1, 1)
        if arr.shape != (length, dim):
            raise ValueError(
                f"{name} has shape {np.shape(value)}, expected ({length}, {dim})"
                + (f" or ({length},)" if dim == 1 else "")
            )
        return arr

    def add_episode(self, episode) -> None:
        """Store one whole episode: anything with the ``TRANSITIONS`` attributes (``rollout.Episode``), each with
        leading length L (L >= 2)."""
        arrays = {k: np.asarray(getattr(episode, k)) for k in TRANSITIONS}
        length = arrays["observs"].shape[0]
        # L = 1 would leave the episode with no zero-weight slot, so the next episode's start
        # could not be detected as a boundary when building masks.
        if length < 2:
            raise ValueError(f"episode length must be >= 2, got {length}")
        if length > self.capacity:
            raise ValueError(f"episode length {length} exceeds capacity {self.capacity}; it would overwrite itself")
        rows = {k: self._as_2d(k, v, length, self._data[k].shape[1]) for k, v in arrays.items()}
        d = rows["terminals"]
        if not np.all((d == 0) | (d == 1)):
            raise ValueError(f"terminals must be 0/1 (or bool), got values {np.unique(d)[:5]}")
        n = max(1, length - self.sampled_seq_len + 1)
        w = np.zeros(length, dtype=np.float32)
        w[:n] = (self.sample_weight_baseline + n) / n
        steps = np.arange(length, dtype=np.int64)
        # Slice writes (split in two at the wrap) instead of fancy indexing keep this cheap.
        first = min(length, self.capacity - self._top)
        for src, dst in (
            (slice(0, first), slice(self._top, self._top + first)),
            (slice(first, length), slice(0, length - first)),
        ):
            for k, x in rows.items():
                self._data[k][dst] = x[src]  # terminals cast to uint8 by the assignment
            self._weights[dst] = w[src]
            self._steps[dst] = steps[src]
        self._top = (self._top + length) % self.capacity
        self._size = min(self.capacity, self._size + length)
        self._cdf = None

    def _ensure_cdf(self) -> np.ndarray:
        if self._cdf is None:
            # float64 so that slots near the end of a 1e6 buffer keep distinguishable mass.
            self._cdf = np.cumsum(self._weights, dtype=np.float64)
            total = self._cdf[-1]
            # The first slot at which the running sum reaches the total is the last positive one.
            self._last_positive = int(np.searchsorted(self._cdf, total, side="left")) if total > 0 else -1
        return self._cdf

    def sample_starts(self, batch_size: int) -> np.ndarray:
        """Draw window start slots i.i.d. with replacement, probability proportional to weight."""
        batch_size = _positive_int("batch_size", batch_size)
        cdf = self._ensure_cdf()
        if self._last_positive < 0:
            raise ValueError("cannot sample from an empty buffer; add an episode first")
        u = self._rng.random(batch_size) * cdf[-1]
        starts = np.searchsorted(cdf, u, side="right")
        # u * total can round up to total itself; such a draw belongs to the last positive slot.
        return np.minimum(starts, self._last_positive)

    def sample(self, batch_size: int) -> Batch:
        starts = self.sample_starts(batch_size)
        idx = (starts[None, :] + np.arange(self.sampled_seq_len)[:, None]) % self.capacity  # (T, B)
        has_weight = self._weights[idx] > 0
        boundary = np.zeros_like(has_weight)
        # A new episode starts where weight switches from 0 to positive (not at position 0) ...
        boundary[1:] = ~has_weight[:-1] & has_weight[1:]
        # ... and everything from the write head on is older than, not part of, the newest episode.
        boundary |= idx == self._top
        mask = np.cumsum(boundary, axis=0) == 0
        # np.take along the first axis gathers the rows that a[idx] does at about half the cost (a 64 x 64 batch
        # of HopperBLT-V's arrays: 123 against 288 us), which is host time a GPU's update waits on per seed.
        out = {k: np.take(v, idx, axis=0) for k, v in self._data.items()}
        out["terminals"] = out["terminals"].astype(np.float32)
        return Batch(**out, masks=mask[:, :, None].astype(np.float32), first_step=self._steps[starts])

    def blank_batch(self, batch_size: int) -> Batch:
        """A batch of ``sample``'s layout (shapes and dtypes) drawing nothing: zeros, every step masked in. What a
        compiled update is compiled on before the run acts (cuda_graph.UpdateRunner.warm_up)."""
        shape = (self.sampled_seq_len, _positive_int("batch_size", batch_size))
        out = {k: np.zeros((*shape, v.shape[1]), v.dtype) for k, v in self._data.items()}
        out["terminals"] = out["terminals"].astype(np.float32)
        return Batch(**out, masks=np.ones((*shape, 1), np.float32), first_step=np.zeros(shape[1], np.int64))

    def state_dict(self) -> dict[str, Any]:
        # Slots fill from 0 and only wrap once full, so the filled part is always [0, size).
        s = self._size
        return {
            **{k: getattr(self, k) for k in self._CONFIG_KEYS},
            "top": self._top,
            "size": s,
            **{k: v[:s].copy() for k, v in self._data.items()},
            "weights": self._weights[:s].copy(),
            "steps": self._steps[:s].copy(),
            "rng_state": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [k for k in self.state_dict() if k not in state]
        if missing:
            raise ValueError(f"state dict lacks keys {missing}")
        for key in self._CONFIG_KEYS:
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"state dict has {key}={state[key]!r} but this buffer was built with {key}={getattr(self, key)!r}"
                )
        size, top = int(state["size"]), int(state["top"])
        if not 0 <= size <= self.capacity or not 0 <= top < self.capacity:
            raise ValueError(f"state dict has invalid size={size} / top={top} for capacity {self.capacity}")
        if size < self.capacity and top != size:
            raise ValueError(f"state dict has top={top} but a buffer that never wrapped has top == size ({size})")
        arrays = {**self._data, "weights": self._weights, "steps": self._steps}
        for key, dst in arrays.items():
            src = np.asarray(state[key])
            if src.shape != (size,) + dst.shape[1:]:
                raise ValueError(f"state dict {key!r} has shape {src.shape}, expected {(size,) + dst.shape[1:]}")
        for key, dst in arrays.items():
            dst[:size] = state[key]
            dst[size:] = 0
        self._size, self._top = size, top
        self._cdf = None
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng_state"]
        self._rng = rng

"""The sequence-model registry, the only code that knows model names: ``build("ffm", input_size=64, hidden_size=128)``
maps ``x[T, B, 64], state`` (None: zeros) to ``y[T, B, 128], state``."""
from __future__ import annotations

import inspect

from .base import SeqModel, State
from .ffm import ABLATIONS, FFM
from .rnn import GRU, LSTM, MLP

_REGISTRY: dict[str, type[SeqModel]] = {"lstm": LSTM, "gru": GRU, "ffm": FFM, "mlp": MLP}


def available() -> list[str]:
    return list(_REGISTRY)


def options(name: str) -> list[str]:
    """The keyword options model `name` accepts besides input_size and hidden_size."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown seq model {name!r}; available: {available()}")
    params = inspect.signature(_REGISTRY[name].__init__).parameters
    return [p for p in params if p not in ("self", "input_size", "hidden_size")]


def build(name: str, *, input_size: int, hidden_size: int, **opts) -> SeqModel:
    allowed = options(name)
    unknown = sorted(set(opts) - set(allowed))
    if unknown:
        raise TypeError(f"seq model {name!r} got unknown option(s) {unknown}; allowed: {allowed}")
    return _REGISTRY[name](input_size=input_size, hidden_size=hidden_size, **opts)


__all__ = ["ABLATIONS", "FFM", "GRU", "LSTM", "MLP", "SeqModel", "State", "available", "build", "options"]

"""The sequence-model registry, the only code that knows model names: ``build("ffm", input_size=64, hidden_size=128)``
maps ``x[T, B, 64], state`` (None: zeros) to ``y[T, B, 128], state``. A model declares what others need of it on its
class (base.SeqModel); ``register`` adds one from outside the package, before pomdp_ffm.config is imported where it
has an option section."""

from __future__ import annotations

import inspect

from torch import nn

from .base import SeqModel, State
from .ffm import ABLATIONS, FFM
from .rnn import GRU, LSTM, MLP

_REGISTRY: dict[str, type[SeqModel]] = {}


def register(cls: type[SeqModel]) -> type[SeqModel]:
    """Make ``cls`` buildable as ``cls.name`` (usable as a class decorator)."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"seq model {cls.name!r} is already registered, by {_REGISTRY[cls.name].__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    del _REGISTRY[name]


for _cls in (LSTM, GRU, FFM, MLP):  # (the order errors list them in)
    register(_cls)


def available() -> list[str]:
    return list(_REGISTRY)


def get(name: str) -> type[SeqModel]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown seq model {name!r}; available: {available()}")
    return _REGISTRY[name]


def options(name: str) -> list[str]:
    """The keyword options model `name` accepts besides input_size and hidden_size."""
    params = inspect.signature(get(name).__init__).parameters
    return [p for p in params if p not in ("self", "input_size", "hidden_size")]


def build(name: str, *, input_size: int, hidden_size: int, **opts) -> SeqModel:
    allowed = options(name)
    unknown = sorted(set(opts) - set(allowed))
    if unknown:
        raise TypeError(f"seq model {name!r} got unknown option(s) {unknown}; allowed: {allowed}")
    return _REGISTRY[name](input_size=input_size, hidden_size=hidden_size, **opts)


def drop_caches(*modules: nn.Module) -> None:
    """Every contained memory's ``drop_caches``: before a CUDA-graph capture, after a weight copy."""
    for m in {m for module in modules for m in module.modules() if isinstance(m, SeqModel)}:
        m.drop_caches()


__all__ = [
    "ABLATIONS",
    "FFM",
    "GRU",
    "LSTM",
    "MLP",
    "SeqModel",
    "State",
    "available",
    "build",
    "drop_caches",
    "get",
    "options",
    "register",
    "unregister",
]

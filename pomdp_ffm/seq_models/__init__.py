"""The sequence-model registry: ``build("ffm", input_size=64, hidden_size=128)`` maps ``x[T, B, 64], state`` (None:
zeros) to ``y[T, B, 128], state``. The names, and where each class lives, are pomdp_ffm.catalog's (built-in models
and plug-ins' entry points); a model declares what others need of it on its class (base.SeqModel)."""

from __future__ import annotations

import inspect

from torch import nn

from .. import catalog
from .base import SeqModel, State
from .ffm import ABLATIONS, FFM


def available() -> list[str]:
    return list(catalog.memories())


def get(name: str) -> type[SeqModel]:
    memory = catalog.memories().get(name)
    if memory is None:
        raise ValueError(f"unknown seq model {name!r}; available: {available()}")
    cls = catalog.load(memory.target)
    if not (isinstance(cls, type) and issubclass(cls, SeqModel)):
        raise ValueError(f"seq model {name!r}: {memory.target} is not a pomdp_ffm.seq_models.SeqModel subclass")
    return cls


def keywords(name: str) -> list[str]:
    """The keyword arguments model `name` takes besides input_size and hidden_size (its config section's fields,
    or ``num_layers``)."""
    params = inspect.signature(get(name).__init__).parameters
    return [p for p in params if p not in ("self", "input_size", "hidden_size")]


def build(name: str, *, input_size: int, hidden_size: int, **opts) -> SeqModel:
    allowed = keywords(name)
    unknown = sorted(set(opts) - set(allowed))
    if unknown:
        raise TypeError(f"seq model {name!r} got unknown keyword argument(s) {unknown}; allowed: {allowed}")
    return get(name)(input_size=input_size, hidden_size=hidden_size, **opts)


def drop_caches(*modules: nn.Module) -> None:
    """Every contained memory's ``drop_caches``: before a CUDA-graph capture, after a weight copy."""
    for m in {m for module in modules for m in module.modules() if isinstance(m, SeqModel)}:
        m.drop_caches()


__all__ = ["ABLATIONS", "FFM", "SeqModel", "State", "available", "build", "drop_caches", "get", "keywords"]

"""The sequence-model registry: ``build("ffm", input_size=64, hidden_size=128)`` maps ``x[T, B, 64], state`` (None:
zeros) to ``y[T, B, 128], state``. The names, and where each class lives, are pomdp_ffm.catalog's (built-in models
and plug-ins' entry points); a model declares what others need of it on its class (base.SeqModel)."""

from __future__ import annotations

import dataclasses
import inspect

import torch
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
    try:
        cls = catalog.load(memory.target)
    except Exception as e:  # a plug-in's module missing, or failing as it imports: named, with its entry point
        raise ValueError(
            f"{catalog.named(name)}: its class {memory.target} does not load: {catalog.one_line(e)}"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, SeqModel)):
        raise ValueError(f"{catalog.named(name)}: {memory.target} is not a pomdp_ffm.seq_models.SeqModel subclass")
    return cls


def keywords(name: str) -> list[str]:
    """The keyword arguments model `name` takes besides input_size and hidden_size: its options dataclass's fields
    (its config section's), or those its constructor names (``num_layers``)."""
    options = catalog.memories()[name].options if name in catalog.memories() else None
    if options is not None:
        return [f.name for f in dataclasses.fields(options)]
    params = inspect.signature(get(name).__init__).parameters
    return [p for p, v in params.items() if p not in ("self", "input_size", "hidden_size") and v.kind != v.VAR_KEYWORD]


def build(name: str, *, input_size: int, hidden_size: int, **opts) -> SeqModel:
    allowed = keywords(name)
    unknown = sorted(set(opts) - set(allowed))
    if unknown:
        raise TypeError(f"seq model {name!r} got unknown keyword argument(s) {unknown}; allowed: {allowed}")
    model = get(name)(input_size=input_size, hidden_size=hidden_size, **opts)
    if not catalog.built_in(name):
        _check_shapes(name, model, input_size, hidden_size)
    return model


def _check_shapes(name: str, model: SeqModel, input_size: int, hidden_size: int) -> None:
    """A plug-in's forward, once as it is built: a window from no state, then a step from the state it left, must
    give ``y[T, B, hidden_size]`` and a state of initial_state's shapes; else a ValueError naming the memory and the
    shapes expected, here, not a matmul's error deep in the nets at the first update. Once, not per update (whose
    path reads nothing back to the host); on a copy of the generator (the probe moves no seed's draws), in eval mode
    (no running statistics move), its caches dropped after."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    B, state, call = 2, None, f"initial_state(2, {device})"
    training = model.training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model.eval()
            expected = _shapes(model, model.initial_state(B, device))
            for T in (3, 1):
                call = f"forward(x[{T}, {B}, {input_size}], {'None' if state is None else 'the state it returned'})"
                out = model(torch.zeros(T, B, input_size, device=device), state)
                if not (isinstance(out, tuple) and len(out) == 2 and torch.is_tensor(out[0])):
                    raise _Wrong(f"must return (y, state), not a {type(out).__name__}")
                y, state = out
                if list(y.shape) != [T, B, hidden_size]:
                    raise _Wrong(
                        f"must return y of shape {[T, B, hidden_size]} (T, B, hidden_size), not {list(y.shape)}"
                    )
                shapes = _shapes(model, state)
                if shapes != expected:
                    raise _Wrong(f"must return a state of initial_state({B})'s shapes {expected}, not {shapes}")
    except _Wrong as e:
        raise ValueError(f"{catalog.named(name)}: {call} {e}") from None
    except Exception as e:  # the plug-in's own error, at these sizes
        raise ValueError(f"{catalog.named(name)}: {call} fails: {catalog.one_line(e)}") from None
    finally:
        model.train(training)
        model.drop_caches()


class _Wrong(Exception):
    """What _check_shapes found wrong (apart from the plug-in's own errors)."""


def _shapes(model: SeqModel, state: State) -> list[list[int]]:
    return [list(t.shape) for t in model.state_tensors(state)]


def drop_caches(*modules: nn.Module) -> None:
    """Every contained memory's ``drop_caches``: before a CUDA-graph capture, after a weight copy."""
    for m in {m for module in modules for m in module.modules() if isinstance(m, SeqModel)}:
        m.drop_caches()


__all__ = ["ABLATIONS", "FFM", "SeqModel", "State", "available", "build", "drop_caches", "get", "keywords"]

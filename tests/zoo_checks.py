"""What the memory zoo's tests (tests/test_zoo_*.py) check alike, whatever the model or its reference: the outputs,
final state and every gradient of a loss on a window (``outputs_and_grads``), their comparison with a scaled
tolerance (``assert_close_scaled``), acting one step at a time against the window (``acting_steps``,
``assert_steps_equal_window``), and the options' defaults, the constructor's only ones (``option_defaults``). The
one-thread fixture they ask for is tests/conftest.py's ``one_thread``."""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Iterable, Mapping

import pytest
import torch

from pomdp_ffm import catalog


def leaves(state) -> list[torch.Tensor]:
    """A state's tensors (a tensor, or tuples and lists of them, nested), in order."""
    if isinstance(state, torch.Tensor):
        return [state]
    return [t for part in state for t in leaves(part)]


def _rebuilt(state, fn):
    """The state with ``fn`` applied to each of its tensors, its structure kept."""
    if isinstance(state, torch.Tensor):
        return fn(state)
    return type(state)(_rebuilt(part, fn) for part in state)


def _weighable(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def outputs_and_grads(
    run: Callable, x: torch.Tensor, state, weights: list[torch.Tensor], params: Mapping | Iterable = ()
) -> tuple[dict[str, torch.Tensor], object]:
    """``y, final = run(x, state)`` with x and the carried-in state's float (or complex) tensors fresh leaves, and
    loss = sum(y w_y) + the sum over the final state's float tensors of sum(s_k w_k), ``weights`` = [w_y, w_1, ...]
    (each cast to its tensor's dtype; a complex tensor weighed as its real view, [..., 2]). Returns a dict of
    "y", "final k" (the final state's float tensors), "grad x", "grad state k" (the carried-in state's float
    tensors) and "grad <name>" for each (name, parameter) of ``params`` (their .grad, set afresh by the backward),
    all detached, and the whole final state (its integer tensors too, step counters)."""
    params = dict(params)
    for p in params.values():
        p.grad = None
    x = x.clone().requires_grad_()
    state = _rebuilt(state, lambda t: t.clone().requires_grad_() if _weighable(t) else t.clone())
    y, final = run(x, state)
    parts = [s for s in leaves(final) if _weighable(s)]
    assert len(weights) == 1 + len(parts), f"{len(weights)} weights for y and {len(parts)} final state tensors"
    loss = (y * weights[0].to(y.dtype)).sum()
    for s, w in zip(parts, weights[1:]):
        s = torch.view_as_real(s) if s.is_complex() else s
        loss = loss + (s * w.to(s.dtype)).sum()
    loss.backward()
    out = {"y": y.detach()} | {f"final {k}": s.detach() for k, s in enumerate(parts)} | {"grad x": x.grad}
    out |= {f"grad state {k}": s.grad for k, s in enumerate(t for t in leaves(state) if _weighable(t))}
    for name, p in params.items():
        assert p.grad is not None, f"{name}: no gradient"
        out[f"grad {name}"] = p.grad
    return out, _rebuilt(final, torch.Tensor.detach)


def per_window(tol: float, steps: int) -> float:
    """A float32 tolerance stated for windows of up to 64 steps, grown in proportion beyond: a recurrence's rounding
    accumulates over its steps (measured over conftest.ZOO_CASES: LRU's final state 1.7e-5 and LMU's carried-in
    state gradient 1.5e-5 of their largest entries at 160 steps, where 64 give at most 3.0e-6 and 2.1e-6)."""
    return tol * max(1.0, steps / 64)


def assert_close_scaled(
    got: Mapping[str, torch.Tensor],
    want: Mapping[str, torch.Tensor],
    of_largest: float = 0.0,
    *,
    floor: float = 0.0,
    atol: float = 0.0,
    rtol: float = 0.0,
) -> dict[str, float]:
    """The same names on both sides, and for each tensor the same shape and, elementwise (got in want's dtype;
    complex ones by modulus), |got - want| <= of_largest max(floor, max |want|) + atol + rtol |want|: float32
    rounding of a sum over many steps (a gradient's over the batch too) scales with its largest terms, not with each
    entry. A failure names the worst tensor (the largest share of its bound reached), its largest difference and
    entry. Returns each tensor's largest difference over max(floor, max |want|)."""
    only_got, only_want = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    assert not only_got and not only_want, f"only ours: {only_got}, only theirs: {only_want}"
    scaled, worst = {}, (0.0, "", 0.0, 0.0)
    for name, b in want.items():
        a = got[name]
        assert a.shape == b.shape, f"{name}: shape {tuple(a.shape)}, want {tuple(b.shape)}"
        diff, mag = (a.to(b.dtype) - b).abs(), b.abs()
        scale = max(floor, mag.max().item()) if b.numel() else floor
        bound = of_largest * scale + atol + rtol * mag
        if not b.numel():
            scaled[name] = 0.0
            continue
        share = torch.where(diff <= bound, torch.where(diff == 0, 0.0, diff / bound), torch.inf).max().item()
        largest = diff.max().item()
        scaled[name] = largest / scale if scale else largest
        if share >= worst[0]:
            worst = (share, name, largest, mag.max().item())
    share, name, largest, entry = worst
    if os.environ.get("ZOO_MEASURED"):  # (docs/memory_models.md's measured column: the test, its largest scaled
        with open(os.environ["ZOO_MEASURED"], "a", encoding="utf-8") as f:  # difference, the share of its bound)
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}\t{max(scaled.values())}\t{share}\n")
    assert share <= 1, f"{name}: largest difference {largest:.3g}, largest entry {entry:.3g} (scaled: {scaled})"
    return scaled


def acting_steps(model: torch.nn.Module, x: torch.Tensor, state) -> tuple:
    """The model on the window x [T, ...] from ``state``, and acting: T = 1 calls with the state carried, without
    gradient; (window outputs, window final state, the steps' outputs concatenated, the steps' final state)."""
    with torch.no_grad():
        y, last = model(x, state)
        steps, s = [], state
        for t in range(x.shape[0]):
            y_t, s = model(x[t : t + 1], s)
            steps.append(y_t)
    return y, last, torch.cat(steps), s


def assert_steps_equal_window(model: torch.nn.Module, x: torch.Tensor, state, **tol):
    """Acting (``acting_steps``) gives the window's outputs and every tensor of its final state within ``tol``
    (``assert_close_scaled``'s); returns the steps' final state."""
    y, last, y_steps, s = acting_steps(model, x, state)
    got = {"y": y_steps} | {f"final {k}": t for k, t in enumerate(leaves(s))}
    assert_close_scaled(got, {"y": y} | {f"final {k}": t for k, t in enumerate(leaves(last))}, **tol)
    return s


def section_of(cls: type) -> type:
    """The options dataclass of the catalog record that names model class ``cls``."""
    (section,) = [m.options for m in catalog.memories().values() if catalog.load(m.target) is cls]
    return section


def option_defaults(cls: type) -> dict:
    """The defaults of ``cls``'s option section's fields (its catalog record's), asserted to be the only ones: the
    constructor names no option of its own, every option comes through ``**options`` (rules.options_of)."""
    defaults = {f.name: f.default for f in dataclasses.fields(section_of(cls))}
    init = inspect.signature(cls.__init__).parameters
    assert [n for n, p in init.items() if p.kind != p.VAR_KEYWORD] == ["self", "input_size", "hidden_size"]
    return defaults


def assert_strength_used_clamped(model: torch.nn.Module, input_size: int) -> None:
    """The shared sine embedding's strength (time_embedding.py) out of [0, 1]: a call uses it clamped and writes
    nothing, ``bound_`` (the agent's update, after each optimiser write) clamps it."""
    x = torch.randn(4, 2, input_size)
    with torch.no_grad():
        model.embedding.strength.fill_(1.7)
    y = model(x)[0]
    assert model.embedding.strength.item() == pytest.approx(1.7)  # a call writes nothing
    model.bound_()
    assert model.embedding.strength.item() == 1.0
    torch.testing.assert_close(model(x)[0], y, rtol=0, atol=0)  # the call had used it clamped

"""DNC against POPGym's DiffNC (popgym.baselines.ray_models.ray_diffnc, the ``dnc`` package's DNC), weights copied:
a [T=64, B=8] window with a carried-in state, outputs, final state and every gradient; the acting step against the
window; the sort-free allocation against the package's sort.

The reference is POPGym stepped one step per call, as it acts: its window (one call of T steps) feeds every step
the read vectors carried in at the window's start (the dnc package builds the controller's inputs before its time
loop), which ``test_popgym_window_feeds_every_step_the_carried_in_reads`` shows; ours is the paper's, each step
reading the last step's reads (pomdp_ffm/seq_models/dnc.py's docstring)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from popgym_reference import copy_weights, ray_model
from zoo_checks import assert_close_scaled, assert_steps_equal_window, option_defaults, outputs_and_grads

from pomdp_ffm.options import DNCConfig
from pomdp_ffm.seq_models.dnc import DNC, allocation

dnc_package = pytest.importorskip("dnc", reason="the dnc package (POPGym's DiffNC's core) is the reference")

I, H, T, B = 12, 32, 64, 8
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)
DNC_DELTA = dnc_package.util.δ  # (1e-6) the package's epsilon


# (one thread: this file took ~90 s on two busy cores with two threads)
pytestmark = pytest.mark.usefixtures("one_thread")


def _pair(seed: int = 0, hidden: int | None = None, **cfg):
    """POPGym's DiffNC (its core built, as POPGym builds it, by a first call) and ours with its weights."""
    hidden = H if hidden is None else hidden
    torch.manual_seed(SEED + seed)
    ref = ray_model("ray_diffnc", "DiffNC", I, hidden, **cfg)
    with torch.no_grad():
        ref.forward_memory(torch.zeros(1, 1, I), [s.unsqueeze(0) for s in ref.initial_state()], None, None)
    ours = DNC(I, hidden, **cfg)
    lstm = {f"controller.{n}": f"lstm_layer_0.{n}" for n, _ in ours.controller.named_parameters()}
    names = lstm | {
        "interface.weight": "rnn_layer_memory_shared.interface_weights.weight",
        "interface.bias": "rnn_layer_memory_shared.interface_weights.bias",
        "output.weight": "output.weight",
        "output.bias": "output.bias",
    }
    copy_weights(ours, ref.core, names)  # each used once
    return ref, ours, names


def _to_popgym(state):
    """Our state -> POPGym's packed list (h, c, reads [B, R W], memory, links [B, 1, N, N], precedence [B, 1, N],
    read weights, write weights [B, 1, N], usage)."""
    h, c, r, m, links, p, rw, ww, u = state
    return [h, c, r.flatten(1), m, links.unsqueeze(1), p.unsqueeze(1), rw, ww.unsqueeze(1), u]


def _from_popgym(state, read_heads: int):
    h, c, r, m, links, p, rw, ww, u = state
    return (h, c, r.unflatten(1, (read_heads, -1)), m, links.squeeze(1), p.squeeze(1), rw, ww.squeeze(1), u)


def _popgym_steps(ref, x, state):
    """POPGym acting: one forward_memory call per step, x [T, B, I] (ours) -> y [T, B, H], its packed state."""
    ys = []
    for t in range(x.shape[0]):
        y, state = ref.forward_memory(x[t].unsqueeze(1), state, None, None)
        ys.append(y.squeeze(1))
    return torch.stack(ys), state


def _carried_state(ref, read_heads, batch, generator, steps=None):
    """POPGym's state after a first random window from zeros (one call), in our layout."""
    zeros = [torch.zeros(batch, *s.shape, dtype=s.dtype) for s in ref.initial_state()]
    steps = T if steps is None else steps
    with torch.no_grad():
        _, state = ref.forward_memory(torch.randn(batch, steps, I, generator=generator), zeros, None, None)
    return _from_popgym([s.detach() for s in state], read_heads)


def _compare(ref, ours, names, x, state0, generator, read_heads, fresh=False):
    """Run both on x from state0 (our layout); loss = sum(y * w_y) + sum over the final state's parts of
    (part * w_part); asserts them equal within float32 rounding at each tensor's scale, |a - b| <= 1e-6 max(1,
    max |b|) + 1e-6 |b| (the weights' gradients sum T B terms, up to ~40 here; from zeros, the memory's, through the
    cosine's 1 / (|M| |k| + 1e-6), reach ~1e6), and returns the largest differences of the outputs, final states
    and gradients, each over its tensor's scale max(1, max |.|)."""
    weights = [torch.randn(x.shape[0], x.shape[1], ours.hidden_size, generator=generator)]
    weights += [torch.randn(s.shape, generator=generator) for s in state0]

    def popgym(x, state):
        y, last = _popgym_steps(ref, x, _to_popgym(state))
        return y, _from_popgym(last, read_heads)

    params = dict(ref.core.named_parameters())
    theirs, _ = outputs_and_grads(popgym, x, tuple(state0), weights, {n: params[names[n]] for n in names})
    mine, _ = outputs_and_grads(ours, x, tuple(state0), weights, ours.named_parameters())
    for n in names:
        assert theirs[f"grad {n}"].abs().max() > 0, n
    for part in range(len(state0)):
        # (from zeros, links and usage zero the reads' weights' grads)
        assert fresh or theirs[f"grad state {part}"].abs().max() > 0, part
    return assert_close_scaled(mine, theirs, 1e-6, floor=1.0, rtol=1e-6)


def _distinct_usages(state) -> bool:
    u = state[-1]
    return bool((u.sort(-1).values.diff(dim=-1) > 0).all())


def test_window_with_carried_state_matches_popgym(zoo_case):
    ref, ours, names = _pair()
    g = torch.Generator().manual_seed(SEED + 1)
    state0 = _carried_state(ref, 4, B, g)
    assert _distinct_usages(state0)  # (no ties: the package's topk orders the cells as ours does)
    x = torch.randn(T, B, I, generator=g)
    # measured (over each tensor's scale, _compare): y 7.5e-8, final state 1.4e-7, weights' grads 4.7e-7, x's grad
    # 1.4e-7, carried-in state's grads 1.2e-7
    _compare(ref, ours, names, x, state0, g, 4)


def test_stacked_controller_and_eight_cells_match_popgym():
    """Two controller layers, 8 cells of 8, 2 heads: the allocation's order over more cells."""
    cfg = {"num_hidden_layers": 2, "cell_size": 8, "read_heads": 2}
    ref, ours, names = _pair(2, hidden=64, **cfg)
    assert ours.nr_cells == ref.cfg["nr_cells"] == 8
    g = torch.Generator().manual_seed(SEED + 3)
    state0 = _carried_state(ref, 2, 4, g, steps=32)
    assert _distinct_usages(state0)
    x = torch.randn(32, 4, I, generator=g)
    # measured (scaled): y 4.5e-8, final state 1.2e-7, weights' grads 4.7e-7, x's grad 2.4e-7, state's grads 2.1e-7
    _compare(ref, ours, names, x, state0, g, 2)


def _stable_topk(input, k, dim=-1, largest=True, sorted=True):
    values, indices = torch.sort(input, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


def test_zero_state_matches_popgym_with_ties_in_cell_order(monkeypatch):
    """From a fresh state every usage ties at the first step: the package's CPU topk then orders the cells its own
    way (measured: [4, 7, 6, 5, 2, 1, 0, 3] for 8 equal usages), ours in cell order. With the package's topk made
    stable (cell order among ties: ``torch.topk`` swapped for a stable sort for this test only; the package itself
    is unchanged), everything matches, the memory's zero rows (the cosine's norms at 0) included."""
    ref, ours, names = _pair(4)
    with torch.no_grad():
        u = torch.full((1, 8), DNC_DELTA)
        assert not torch.equal(torch.topk(u, 8, dim=1, largest=False).indices, torch.arange(8).unsqueeze(0))
    monkeypatch.setattr(torch, "topk", _stable_topk)
    g = torch.Generator().manual_seed(SEED + 5)
    state0 = ours.initial_state(B)
    x = torch.randn(16, B, I, generator=g)
    # measured (scaled): y 6.0e-8, final state 1.8e-7, weights' grads 3.7e-7, x's grad 3.0e-7, state's grads 2.0e-7
    _compare(ref, ours, names, x, state0, g, 4, fresh=True)


def test_popgym_window_feeds_every_step_the_carried_in_reads():
    """The deliberate difference: POPGym's window (one call of 16 steps) is its acting (one call per step) with the
    read vectors put back to the carried-in ones before every step; ours is its acting as it is."""
    ref, ours, _ = _pair(6)
    g = torch.Generator().manual_seed(SEED + 7)
    state0 = _carried_state(ref, 4, B, g)
    x = torch.randn(16, B, I, generator=g)
    with torch.no_grad():
        y_window, s_window = ref.forward_memory(x.transpose(0, 1), _to_popgym(state0), None, None)
        y_window = y_window.transpose(0, 1)
        y_steps, s_steps = _popgym_steps(ref, x, _to_popgym(state0))
        state, stale = _to_popgym(state0), []
        for t in range(16):
            state[2] = _to_popgym(state0)[2]  # the reads carried in
            y, state = ref.forward_memory(x[t].unsqueeze(1), state, None, None)
            stale.append(y.squeeze(1))
        y_ours, s_ours = ours(x, state0)
    torch.testing.assert_close(y_window, torch.stack(stale), rtol=1e-5, atol=1e-6)
    for a, b in zip(s_window, state):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert (y_window[1:] - y_steps[1:]).abs().max() > 1e-3  # (the first step alike)
    torch.testing.assert_close(y_ours, y_steps, rtol=1e-5, atol=1e-6)
    for a, b in zip(s_ours, _from_popgym(s_steps, 4)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_acting_step_equals_window():
    torch.manual_seed(SEED + 8)
    model = DNC(I, H)
    g = torch.Generator().manual_seed(SEED + 9)
    with torch.no_grad():
        _, state0 = model(torch.randn(T, B, I, generator=g))
    x = torch.randn(T, B, I, generator=g)
    # As LMU's (tests/test_zoo_lmu.py): T steps' roundings of the state's scale at most (measured: 0, bitwise)
    state = assert_steps_equal_window(model, x, state0, of_largest=T * 2.0**-23)
    assert all(a.shape == b.shape for a, b in zip(state, model.initial_state(B)))  # fixed shapes


def _sorted_allocation(usage):
    """The package's allocation (a sort, an exclusive cumulative product, the sort undone), stable among ties."""
    u = DNC_DELTA + (1 - DNC_DELTA) * usage
    sorted_u, order = torch.sort(u, dim=-1, stable=True)
    ones = torch.ones_like(sorted_u[..., :1])
    exclusive = torch.cumprod(torch.cat((ones, sorted_u[..., :-1]), dim=-1), dim=-1)
    return torch.empty_like(u).scatter(-1, order, (1 - sorted_u) * exclusive)


def test_allocation_without_a_sort_equals_the_sort():
    g = torch.Generator().manual_seed(SEED + 10)
    usage = torch.rand(64, 8, generator=g, dtype=torch.float64)
    usage[:8] = 0  # a fresh state: all tied
    usage[8:16, 2:5] = usage[8:16, 6:7]  # some tied
    usage[16:24, :3] = 1.0
    u1, u2 = usage.clone().requires_grad_(), usage.clone().requires_grad_()
    a1, a2 = allocation(u1), _sorted_allocation(u2)
    torch.testing.assert_close(a1, a2, rtol=1e-14, atol=0)
    w = torch.randn(64, 8, generator=g, dtype=torch.float64)
    (a1 * w).sum().backward()
    (a2 * w).sum().backward()
    torch.testing.assert_close(u1.grad, u2.grad, rtol=1e-12, atol=0)
    assert torch.equal(a1[0].argsort(descending=True), torch.arange(8))  # ties: the first cell first
    # the package's own allocation, where no usage ties (float32; it returns [B, 1, N])
    memory = dnc_package.Memory(H, mem_size=8, cell_size=16, read_heads=4, independent_linears=False)
    distinct = torch.rand(64, 8, generator=g)
    theirs, _ = memory.allocate(distinct, None)
    # measured: 3.7e-9 (the products taken in another order)
    torch.testing.assert_close(allocation(distinct), theirs.squeeze(1), rtol=1e-6, atol=1e-7)


def test_config_defaults_are_popgyms():
    popgym_cfg = type(ray_model("ray_diffnc", "DiffNC", I, H)).MODEL_CONFIG
    cfg = DNCConfig()
    assert dataclasses.asdict(cfg) == option_defaults(DNC)
    for name in ("cell_size", "read_heads", "num_hidden_layers"):
        assert getattr(cfg, name) == popgym_cfg[name]
    assert popgym_cfg["num_layers"] == 1 and popgym_cfg["nonlinearity"] == "tanh"  # (not options here: the docstring)
    assert DNC(I, 128).nr_cells == 128 // 16  # POPGym's nr_cells = hidden_size // cell_size
    ref = ray_model("ray_diffnc", "DiffNC", I, H)
    with torch.no_grad():
        ref.forward_memory(torch.zeros(1, 1, I), [s.unsqueeze(0) for s in ref.initial_state()], None, None)
    assert sum(p.numel() for p in DNC(I, H).parameters()) == sum(p.numel() for p in ref.core.parameters())
    with pytest.raises(ValueError, match="nr_cells=0 must be >= 1"):
        DNC(I, 8)  # 8 // 16 = 0 cells
    assert DNC(I, 8, nr_cells=3).initial_state(2)[3].shape == (2, 3, 16)

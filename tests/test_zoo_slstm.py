"""sLSTM (pomdp_ffm/seq_models/slstm.py) against the package xlstm 2.0.6: its xLSTMBlockStack of sLSTM blocks, the
cell on the "vanilla" (PyTorch) backend, so that nothing is compiled, on the model's weights copied in, after the
model's input embedding (written out here: the package has none for vectors). Over a window from a fresh state and
from a carried one (the package's sLSTMLayer forward with its conv_state and slstm_state; the block's residual and
norms around it as its xLSTMBlock.forward, which cannot return the layer's state, has them); acting one step at a time
against the package's step() with its states carried, and against the window; then the choices the package does not
pin (a fresh unit beside carried ones, a very negative input gate), the initialisation and the options."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch.nn import functional as F
from xlstm.blocks.slstm.block import sLSTMBlockConfig
from xlstm.blocks.slstm.layer import sLSTMLayerConfig
from xlstm.components.feedforward import FeedForwardConfig
from xlstm.xlstm_block_stack import xLSTMBlockStack, xLSTMBlockStackConfig
from zoo_checks import assert_close_scaled, assert_steps_equal_window, option_defaults, outputs_and_grads

from pomdp_ffm.options import SLSTMConfig
from pomdp_ffm.seq_models.slstm import SLSTM

T, B, IN, H = 64, 8, 12, 32
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)

pytestmark = pytest.mark.usefixtures("one_thread")

# The options the package's code is run with: its defaults (one block, 4 heads, kernel 4, the feed-forward), two
# blocks (the forget bias by depth, each block's state) with a kernel of 2 and a wider feed-forward, and a block with
# neither convolution nor feed-forward.
VARIANTS = {
    "defaults": {},
    "two-blocks": {"layers": 2, "heads": 2, "conv_kernel": 2, "proj_factor": 2.0},
    "bare": {"conv_kernel": 0, "feedforward": False},
}


def _model(**options) -> SLSTM:
    """The model, its weights drawn off their init: the package's init has R = 0, b_i = b_z = b_o = 0 and the norms
    at 1, under which the recurrent path and those weights would not show in y."""
    torch.manual_seed(SEED + 0)
    model = SLSTM(IN, H, **options)
    g = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("recurrent"):
                p.copy_(noise / math.sqrt(p.shape[-1]))
            elif name.endswith("bias") and p.dim() == 3:
                p.add_(noise)
            elif "norm" in name:
                p.add_(0.2 * noise)
    return model


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(SEED + 1)
    x0, x = (torch.randn(T, B, IN, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    return x0, x, g


def _weights(model: SLSTM, g: torch.Generator) -> list[torch.Tensor]:
    """The loss's weights on y and on the final state's cells and conv buffer."""
    cells, conv = model.initial_state(B)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in ((T, B, H), cells.shape, conv.shape)]


def reference(model: SLSTM, options: dict, dtype: torch.dtype):
    """The package's block stack (vanilla backend) on ``model``'s weights, the embedding on a copy of ours; its
    window run from a state (() for a fresh one) and its parameters by our names, for the gradients."""
    o = SLSTMConfig(**options)
    layer = sLSTMLayerConfig(backend="vanilla", num_heads=o.heads, conv1d_kernel_size=o.conv_kernel)
    ff = FeedForwardConfig(proj_factor=o.proj_factor) if o.feedforward else None
    block = sLSTMBlockConfig(slstm=layer, feedforward=ff)
    stack = xLSTMBlockStack(xLSTMBlockStackConfig(slstm_block=block, num_blocks=o.layers, embedding_dim=H)).to(dtype)
    assert all(type(b.xlstm.slstm_cell).__name__ == "sLSTMCell_vanilla" for b in stack.blocks)
    embed = torch.nn.Linear(IN, H, dtype=dtype)
    # ours -> (theirs, our value in their form); the package stores each norm's weight as its offset from 1, the
    # cell's bias gate-major over heads, and names the weights that make the input gate `fgate` and the forget
    # gate's `igate` (sLSTMLayer.forward: i, f = fgate(x_conv), igate(x_conv))
    same, offset = (lambda v: v), (lambda v: v - 1)
    theirs = {"embed.weight": (embed.weight, same), "embed.bias": (embed.bias, same)}
    theirs["post_norm.weight"] = (stack.post_blocks_norm.weight, offset)
    for n, block in enumerate(stack.blocks):
        cell, b = block.xlstm.slstm_cell, f"blocks.{n}."
        theirs |= {
            b + "norm.weight": (block.xlstm_norm.weight, offset),
            b + "igate": (block.xlstm.fgate.weight, same),
            b + "fgate": (block.xlstm.igate.weight, same),
            b + "zgate": (block.xlstm.zgate.weight, same),
            b + "ogate": (block.xlstm.ogate.weight, same),
            b + "recurrent": (cell._recurrent_kernel_, same),
            b + "bias": (cell._bias_, lambda v: v.transpose(0, 1).reshape(-1)),
            b + "group_norm": (block.xlstm.group_norm.weight, offset),
        }
        if o.conv_kernel:
            theirs |= {b + f"conv.{k}": (getattr(block.xlstm.conv1d.conv, k), same) for k in ("weight", "bias")}
        if o.feedforward:
            theirs |= {
                b + "ffn_norm.weight": (block.ffn_norm.weight, offset),
                b + "proj_up.weight": (block.ffn.proj_up.weight, same),
                b + "proj_down.weight": (block.ffn.proj_down.weight, same),
            }
    ours = dict(model.named_parameters())
    assert set(theirs) == set(ours), sorted(set(theirs) ^ set(ours))
    with torch.no_grad():
        for name, (p, form) in theirs.items():
            p.copy_(form(ours[name].to(dtype)))

    def run(x: torch.Tensor, state):
        e = embed(x).transpose(0, 1)  # the package is batch first
        cells, convs = [], []
        for n, block in enumerate(stack.blocks):
            carried = {"conv_state": state[1][n], "slstm_state": state[0][n]} if state else {}
            out, last = block.xlstm(block.xlstm_norm(e), return_last_state=True, **carried)
            e = e + out
            if block.ffn is not None:
                e = e + block.ffn(block.ffn_norm(e))
            cells.append(last["slstm_state"])
            convs.append(e.new_zeros(B, 0, H) if last["conv_state"] is None else last["conv_state"])
        return stack.post_blocks_norm(e).transpose(0, 1), (torch.stack(cells), torch.stack(convs))

    return run, stack, embed, {name: p for name, (p, _) in theirs.items()}


def _ours(model: SLSTM):
    return lambda x, state: model(x, state if state else None)


def _compare(options: dict, dtype: torch.dtype, carried: bool, of_largest: float) -> dict:
    """The model (in ``dtype``) against the package in float64 on the same weights: y, the final state and the
    gradients of x, of every parameter and of a carried-in state of a loss on y and the final state."""
    x0, x, g = _inputs()
    model = _model(**options)
    weights = _weights(model, g)
    model = model.to(dtype)
    run, _, _, theirs = reference(model, options, torch.float64)
    state = ()
    if carried:
        with torch.no_grad():
            state = model(x0.to(dtype), None)[1]
    mine, _ = outputs_and_grads(_ours(model), x.to(dtype), state, weights, model.named_parameters())
    exact, _ = outputs_and_grads(run, x.double(), tuple(s.double() for s in state), weights, theirs)
    assert len(exact) == 3 + 1 + 2 * bool(carried) + len(theirs)  # y, final states, x's, state's, parameters'
    # (the package's gradient of its gate-major bias, in our [heads, gates, DH] form)
    for name, p in model.named_parameters():
        if name.endswith(".bias") and p.dim() == 3:
            exact[f"grad {name}"] = exact[f"grad {name}"].view(p.shape[1], p.shape[0], -1).transpose(0, 1)
    return assert_close_scaled(mine, exact, of_largest)


@pytest.mark.parametrize("carried", [False, True], ids=["fresh", "carried"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_float64_model_equals_the_package(variant, carried):
    # Largest measured (each result's largest difference over its largest magnitude): 9.4e-15 (defaults, carried).
    _compare(VARIANTS[variant], torch.float64, carried, 1e-12)


def test_float32_model_within_rounding_of_the_package(zoo_case):
    # Largest measured over conftest.ZOO_CASES: 2.5e-6 (seed 2); the float32 epsilon is 1.2e-7.
    _compare({}, torch.float32, False, 1e-5)


def test_the_reference_is_the_packages_block_stack():
    # The reference's composition of the package's modules (its run) is the package's own xLSTMBlockStack.forward.
    _, x, _ = _inputs(torch.float64)
    model = _model(**VARIANTS["two-blocks"]).double()
    run, stack, embed, _ = reference(model, VARIANTS["two-blocks"], torch.float64)
    with torch.no_grad():
        whole = stack(embed(x).transpose(0, 1)).transpose(0, 1)
        assert torch.equal(run(x, ())[0], whole)


def _their_state(cells: torch.Tensor, conv: torch.Tensor) -> dict:
    """Our state as the package's step() takes it: its conv_state holds the last k inputs, the oldest of which the
    step drops before it reads them (so any row goes first)."""
    return {
        f"block_{n}": {"slstm_state": cells[n].clone(), "conv_state": (F.pad(conv[n], (0, 0, 1, 0)),)}
        for n in range(cells.shape[0])
    }


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_acting_equals_the_packages_step(variant):
    # From a fresh state and from a carried one, every step's output and the state after it, in float64. Largest
    # measured: 9.4e-16 of the largest entry.
    options = VARIANTS[variant]
    model = _model(**options).double()
    x0, x, _ = _inputs(torch.float64)
    _, stack, embed, _ = reference(model, options, torch.float64)
    with torch.no_grad():
        for state in (None, model(x0, None)[1]):
            theirs = None if state is None else _their_state(*state)
            for t in range(T):
                y, state = model(x[t : t + 1], state)
                want, theirs = stack.step(embed(x[t : t + 1]).transpose(0, 1), theirs)
                blocks = [theirs[f"block_{n}"] for n in range(model.layers)]
                cells = torch.stack([b["slstm_state"] for b in blocks])
                conv = [b["conv_state"] for b in blocks]
                conv = state[1] if conv[0] is None else torch.stack([c[0][:, 1:] for c in conv])
                got = {"y": y[0], "cells": state[0], "conv": state[1]}
                assert_close_scaled(got, {"y": want[:, 0], "cells": cells, "conv": conv}, 1e-12)


@pytest.mark.parametrize("variant", ["defaults", "two-blocks", "kernel-1"])
def test_acting_steps_equal_the_window(variant):
    # From a fresh state and from one carried in, in float32; also a convolution of kernel 1 (an empty buffer), which
    # the package's forward cannot run (its slice [:-0] of the padded convolution is empty). Measured: bitwise equal
    # (the bound leaves room for kernels that round a one-step product differently from a window's).
    model = _model(**VARIANTS.get(variant, {"conv_kernel": 1}))
    x0, x, _ = _inputs()
    for state in (None, model(x0, None)[1]):
        assert_steps_equal_window(model, x, state, of_largest=5e-6)


def test_a_fresh_row_beside_carried_ones_is_as_alone():
    # A state is fresh per unit (n = 0, as the package's CUDA kernel decides), not per batch: rows reset to a fresh
    # state beside carried ones give what a batch of fresh rows gives, the carried ones what they give carried.
    model = _model().double()
    x0, x, _ = _inputs(torch.float64)
    with torch.no_grad():
        _, (cells, conv) = model(x0, None)
        fresh = torch.arange(B) % 2 == 0
        mixed = (cells.masked_fill(fresh.view(1, 1, B, 1), 0), conv.masked_fill(fresh.view(1, B, 1, 1), 0))
        y, (c, v) = model(x, mixed)
        y_fresh, (c_fresh, v_fresh) = model(x, None)
        y_carried, (c_carried, v_carried) = model(x, (cells, conv))
    for got, a, b, row in ((y, y_fresh, y_carried, 1), (c, c_fresh, c_carried, 2), (v, v_fresh, v_carried, 1)):
        want = torch.where(fresh.view([B if d == row else 1 for d in range(got.dim())]), a, b)
        assert_close_scaled({"got": got}, {"got": want}, 1e-13)


def test_a_very_negative_input_gate_from_a_fresh_state_has_finite_gradients():
    # i~ = -100: exp(log sigmoid(f~) - i~) at the first step would overflow float32 (the package clamps it to 1 and
    # its gradient is 0 * inf); here f' = 0 there.
    model = _model()
    with torch.no_grad():
        model.blocks[0].bias[:, 0] = -100.0
    _, x, _ = _inputs()
    y, (cells, _) = model(x, None)
    (y.sum() + cells.sum()).backward()
    assert torch.isfinite(y).all() and torch.isfinite(cells).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("bias_init", ["powerlaw_blockdependent", "small_init"])
def test_the_initialisation_is_the_packages(bias_init):
    # The gate biases to the bit (the forget gate's power law by block depth), R = 0, every norm at 1, and the
    # weights' standard deviations: sqrt(2 / (5 h)) for the gates' and the up-projection's, 2 / (layers sqrt(h)) for
    # the down-projection's (h = 128, so that the samples' are within 10% of them).
    h, layers = 128, 3
    model = SLSTM(IN, h, layers=layers, bias_init=bias_init)
    layer = sLSTMLayerConfig(backend="vanilla", bias_init=bias_init)
    config = xLSTMBlockStackConfig(
        slstm_block=sLSTMBlockConfig(slstm=layer, feedforward=FeedForwardConfig()), num_blocks=layers, embedding_dim=h
    )
    stack = xLSTMBlockStack(config)
    for ours, theirs in zip(model.blocks, stack.blocks):
        assert torch.equal(ours.bias, theirs.xlstm.slstm_cell.bias.clone())
        assert not ours.recurrent.any()
        for w, std in ((ours.igate, 2 / (5 * h)), (ours.proj_up.weight, 2 / (5 * h))):
            assert w.std().item() == pytest.approx(math.sqrt(std), rel=0.1)
        assert ours.proj_down.weight.std().item() == pytest.approx(2 / layers / math.sqrt(h), rel=0.1)
        assert ours.proj_down.weight.shape == theirs.ffn.proj_down.weight.shape == (h, 192)
    for name, p in model.named_parameters():
        if "norm" in name:
            assert torch.equal(p, torch.ones(h)), name


def test_options():
    cfg = SLSTMConfig()
    assert option_defaults(SLSTM) == {
        "layers": 1,
        "heads": 4,
        "conv_kernel": 4,
        "feedforward": True,
        "proj_factor": 1.3,
        "bias_init": "powerlaw_blockdependent",
        "recurrent_init": "zeros",
    }
    assert (cfg.layers, cfg.heads, cfg.conv_kernel) == (1, 4, 4)
    with pytest.raises(ValueError, match="policy.slstm.conv_kernel=-1 must be >= 0"):
        SLSTM(IN, H, conv_kernel=-1)
    with pytest.raises(ValueError, match="policy.slstm.bias_init='zeros' is not one of"):
        SLSTM(IN, H, bias_init="zeros")
    with pytest.raises(ValueError, match="hidden_size=30 must be a multiple of heads=4"):
        SLSTM(IN, 30)
    with pytest.raises(ValueError, match=r"policy.rnn_hidden_size=30 must be a multiple of policy.slstm.heads=4 with"):
        cfg.check_chosen("policy.slstm", SimpleNamespace(rnn_hidden_size=30))
    model = SLSTM(IN, H, recurrent_init="standard", bias_init="standard")
    assert model.blocks[0].recurrent.abs().max() <= 1 / math.sqrt(H) and model.blocks[0].recurrent.any()


def test_a_head_of_one_unit_gets_the_slowest_forget_bias():
    # The power law's j / (DH - 1) at DH = 1 is 0/0 (NaN in the package): taken as 0, b_f = 5.
    model = SLSTM(IN, 4, heads=4)
    assert torch.equal(model.blocks[0].bias[:, 1], torch.full((4, 1), 5.0))

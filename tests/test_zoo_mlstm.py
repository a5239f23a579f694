"""The mLSTM (pomdp_ffm/seq_models/mlstm.py) against the package xlstm 2.0.6: its xLSTMBlockStack of mLSTM blocks
(xlstm/xlstm_block_stack.py; each block xlstm/blocks/xlstm_block.py around the mLSTMLayer of
xlstm/blocks/mlstm/layer.py, whose cell, blocks/mlstm/cell.py, runs the vanilla PyTorch backends of
blocks/mlstm/backends.py) on the model's weights copied in, behind the model's input embedding (an nn.Linear here).
The window against the package's parallel form (parallel_stabilized_simple) from a fresh state, in float64 and
float32; acting against the package's recurrent step (mLSTMLayer.step, recurrent_step_stabilized_simple) with its
states carried, in float64, from a fresh state and from one carried in. The package's step starts a fresh state at
m = 0, the model at m = -inf (the module docstring says why), so its step is started from the model's fresh state.
Then acting one step at a time against the window, a window carried in from a state against the same steps inside
one window, the stabilised cell against the paper's unstabilised recurrence, gates whose exponentials overflow
float32, the initialisation against the package's and the options.

The weights compared are the model's initialisation perturbed (``_model``): at init the gates' weights are 0, so
every step's gates would be the same and the stabiliser's maximum would pick the same step in every row."""

import math
import types

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from xlstm import mLSTMBlockConfig, mLSTMLayerConfig, xLSTMBlockStack, xLSTMBlockStackConfig
from zoo_checks import assert_close_scaled, assert_steps_equal_window, option_defaults, outputs_and_grads, per_window

from pomdp_ffm.options import MLSTMConfig
from pomdp_ffm.seq_models.mlstm import MLSTM, _step, _window

T, B, IN, H = 64, 8, 12, 32
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(layers: int = 1, perturb: bool = True, **options) -> MLSTM:
    torch.manual_seed(SEED + 0)
    model = MLSTM(IN, H, layers=layers, **options)
    if perturb:  # gates that differ between steps (input gates e^-4.3 .. e^4.6), norms and skips off their init
        g = torch.Generator().manual_seed(SEED + 2)
        with torch.no_grad():
            for name, p in model.named_parameters():
                scale = 1.0 if name.endswith(("gate.weight", "gate.bias")) else 0.2
                if name.endswith(("norm", "skip")) or "gate" in name:
                    p.add_(scale * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return model


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(SEED + 1)
    x0, x = (torch.randn(T, B, IN, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    R_y = torch.randn(T, B, H, generator=g, dtype=torch.float64)
    return x0, x, R_y


def package_stack(model: MLSTM, dtype: torch.dtype) -> xLSTMBlockStack:
    """The package's xLSTMBlockStack at the model's sizes and options, its own initialisation."""
    layer = mLSTMLayerConfig(
        conv1d_kernel_size=model.kernel,
        qkv_proj_blocksize=model.blocks[0].q.shape[-1],
        num_heads=model.heads,
        proj_factor=model.inner / model.hidden_size,  # (D, a multiple of 64 already: the package keeps it)
    )
    cfg = xLSTMBlockStackConfig(
        mlstm_block=mLSTMBlockConfig(mlstm=layer),
        context_length=T,
        num_blocks=model.layers,
        embedding_dim=model.hidden_size,
    )
    stack = xLSTMBlockStack(cfg).to(dtype)
    assert stack.blocks[0].xlstm.config._inner_embedding_dim == model.inner
    return stack


# Our parameter names in a block and the package's, there (an mLSTMBlock: xlstm_norm, and xlstm the mLSTMLayer).
BLOCK_NAMES = {
    "norm": "xlstm_norm.weight",
    "up.weight": "xlstm.proj_up.weight",
    "q": "xlstm.q_proj.weight",
    "k": "xlstm.k_proj.weight",
    "v": "xlstm.v_proj.weight",
    "conv.weight": "xlstm.conv1d.conv.weight",
    "conv.bias": "xlstm.conv1d.conv.bias",
    "igate.weight": "xlstm.mlstm_cell.igate.weight",
    "igate.bias": "xlstm.mlstm_cell.igate.bias",
    "fgate.weight": "xlstm.mlstm_cell.fgate.weight",
    "fgate.bias": "xlstm.mlstm_cell.fgate.bias",
    "outnorm": "xlstm.mlstm_cell.outnorm.weight",
    "skip": "xlstm.learnable_skip",
    "down.weight": "xlstm.proj_down.weight",
}


def reference(model: MLSTM, dtype: torch.dtype):
    """The package's stack (``package_stack``) with ``model``'s weights copied in, and the model's embedding as an
    nn.Linear: (the stack, the embedding, {our parameter name: theirs})."""
    stack = package_stack(model, dtype)
    embed = nn.Linear(model.input_size, model.hidden_size, dtype=dtype)
    named = dict(stack.named_parameters())
    theirs = {"embed.weight": embed.weight, "embed.bias": embed.bias, "norm": named.pop("post_blocks_norm.weight")}
    for n in range(model.layers):
        theirs |= {f"blocks.{n}.{ours}": named.pop(f"blocks.{n}.{name}") for ours, name in BLOCK_NAMES.items()}
    ours = dict(model.named_parameters())
    assert not named, f"the package's parameters not mapped: {sorted(named)}"
    assert set(theirs) == set(ours), sorted(set(theirs) ^ set(ours))
    with torch.no_grad():
        for name, p in theirs.items():
            p.copy_(ours[name])
    return stack, embed, theirs


def _compare(model: MLSTM, dtype: torch.dtype, of_largest: float) -> dict:
    """The model (in ``dtype``) against the package's stack in float64 on the same weights, from a fresh state: y and
    the gradients of x and every parameter of a loss on y."""
    _, x, R_y = _inputs()
    model = model.to(dtype)
    stack, embed, theirs = reference(model, torch.float64)
    run = lambda x, s: (stack(embed(x).transpose(0, 1)).transpose(0, 1), ())  # noqa: E731
    mine, _ = outputs_and_grads(lambda x, s: (model(x)[0], ()), x.to(dtype), (), [R_y], model.named_parameters())
    exact, _ = outputs_and_grads(run, x.double(), (), [R_y], theirs)
    assert len(exact) == 2 + len(theirs)  # y, x's gradient, every parameter's
    return assert_close_scaled(mine, exact, of_largest)


OTHER = {"heads": 2, "conv1d_kernel_size": 2, "qkv_proj_blocksize": 8}  # (D = 64: 2 heads of 32)


@pytest.mark.parametrize(
    "layers, perturb, options",
    [(1, False, {}), (1, True, {}), (2, True, {}), (1, True, OTHER)],
    ids=["init", "1-block", "2-blocks", "other-options"],
)
def test_float64_model_equals_the_packages_stack(layers, perturb, options):
    # Largest measured (each result's largest difference over its largest magnitude): 2.8e-15 / 3.4e-15 / 5.0e-15 /
    # 2.9e-14 (init / 1 block / 2 blocks / other options).
    _compare(_model(layers, perturb, **options), torch.float64, of_largest=1e-12)


@pytest.mark.parametrize("layers", [1, 2], ids=["1-block", "2-blocks"])
def test_float32_model_within_rounding_of_the_packages_stack(zoo_case, layers):
    # Largest measured over conftest.ZOO_CASES: 8.7e-6 (seed 0, 2 blocks: W_up's gradient in the second block; x's
    # 8.3e-6), the other cases 1.2e-6 to 4.0e-6 (long: 2.9e-6); the float32 epsilon is 1.2e-7.
    _compare(_model(layers), torch.float32, of_largest=per_window(3e-5, T))


def _their_state(state, layer: int) -> dict:
    """The model's state of one block in the package's step's form (its conv buffer one older row longer, unused)."""
    C, n, m, conv = (s[layer] for s in state)
    conv = torch.cat((torch.zeros_like(conv[:, :1]), conv), dim=1)
    return {"mlstm_state": (C.clone(), n.unsqueeze(-1), m[..., None, None]), "conv_state": (conv,)}


def _flat(y: torch.Tensor, states: list[dict]) -> dict:
    """y and the package's step's states by name (its conv buffer's oldest row, never read again, left out)."""
    out = {"y": y}
    for n, s in enumerate(states):
        out |= {f"block {n} {k}": t for k, t in enumerate([*s["mlstm_state"], s["conv_state"][0][:, 1:]])}
    return out


@pytest.mark.parametrize("carried", [False, True], ids=["fresh", "carried"])
def test_acting_equals_the_packages_recurrent_step(carried):
    # Both from the same state (the model's fresh one, or one the model carries out of a first window), step by step
    # with their states carried: each step's y, and the final states.
    model = _model(layers=2).double()
    stack, embed, _ = reference(model, torch.float64)
    x0, x, _ = _inputs(torch.float64)
    with torch.no_grad():
        state = model(x0)[1] if carried else model.initial_state(B)
        theirs = {f"block_{n}": _their_state(state, n) for n in range(model.layers)}
        ys, want = [], []
        for t in range(T):
            y, theirs = stack.step(embed(x[t]).unsqueeze(1), theirs)
            want.append(y.squeeze(1))
            y, state = model(x[t : t + 1], state)
            ys.append(y[0])
    # Largest measured: 2.8e-15 (fresh) and 1.4e-15 (carried) of the largest entry.
    assert_close_scaled(
        _flat(torch.stack(ys), [_their_state(state, n) for n in range(model.layers)]),
        _flat(torch.stack(want), [theirs[f"block_{n}"] for n in range(model.layers)]),
        of_largest=1e-12,
    )


@pytest.mark.parametrize("dtype, bound", [(torch.float64, 1e-12), (torch.float32, 5e-6)], ids=["float64", "float32"])
def test_acting_steps_equal_the_window(dtype, bound):
    # From a fresh state and from one carried in. Largest measured, of the largest entry: float64 2.2e-15 / 1.5e-15,
    # float32 9.8e-7 / 5.4e-7 (fresh / carried).
    model = _model(layers=2).to(dtype)
    x0, x, _ = _inputs(dtype)
    for state in (model.initial_state(B), model(x0)[1]):
        C, n, m, conv = assert_steps_equal_window(model, x, state, of_largest=bound)
        assert C.shape == (2, B, 4, 16, 16) and n.shape == (2, B, 4, 16) and m.shape == (2, B, 4)
        assert conv.shape == (2, B, 3, 64) and C.dtype == dtype


def test_a_window_from_a_state_is_the_same_steps_inside_one_window():
    model = _model(layers=2).double()
    x0, x, _ = _inputs(torch.float64)
    with torch.no_grad():
        whole, end = model(torch.cat((x0, x)))
        second, state = model(x, model(x0)[1])
    # Largest measured: 1.4e-15 of the largest entry.
    assert_close_scaled(
        {"y": second} | {f"state {i}": s for i, s in enumerate(state)},
        {"y": whole[T:]} | {f"state {i}": s for i, s in enumerate(end)},
        of_largest=1e-12,
    )


def _unstabilised(q, k, v, i, log_f, C, n, m):
    """The paper's mLSTM recurrence without the stabiliser, in float64, one step at a time, from the stabilised
    state (C~, n~, m) carried in as C = e^m C~, n = e^m n~. m_t = max(log f_t + m_{t-1}, log i_t) is kept for eps
    alone: the package adds eps to the stabilised denominator, which is eps e^{m_t} on the unstabilised one."""
    DH = q.shape[-1]
    C, n = C * m.exp()[..., None, None], n * m.exp()[..., None]
    hs = []
    for t in range(q.shape[-2]):
        f_t, i_t = log_f[..., t].exp(), i[..., t].exp()
        k_t = k[..., t, :] / math.sqrt(DH)
        C = f_t[..., None, None] * C + i_t[..., None, None] * k_t.unsqueeze(-1) * v[..., t, :].unsqueeze(-2)
        n = f_t[..., None] * n + i_t[..., None] * k_t
        m = torch.maximum(log_f[..., t] + m, i[..., t])
        q_t = q[..., t, :]
        qn = (q_t * n).sum(-1)
        den = torch.maximum(qn.abs(), torch.ones_like(qn)) + 1e-6 * m.exp()
        hs.append((q_t.unsqueeze(-2) @ C).squeeze(-2) / den.unsqueeze(-1))
    return torch.stack(hs, dim=-2), C, n, m


def test_the_stabilised_cell_is_the_papers_unstabilised_recurrence():
    # The window's parallel form and the acting step, from a carried state (m = 2, its C, n on that scale), against
    # the unstabilised recurrence (gates within e^+-6, where it needs no stabiliser in float64): h, and the state
    # times e^m. The closed form m_T = F_T + max(m_0, max_s (log i_s - F_s)) is the recurrence's m.
    g = torch.Generator().manual_seed(SEED + 3)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    NH, DH, n_steps = 3, 5, 20
    q, k, v = r(B, NH, n_steps, DH), r(B, NH, n_steps, DH), r(B, NH, n_steps, DH)
    i, log_f = 3 * r(B, NH, n_steps), F.logsigmoid(r(B, NH, n_steps) + 2)
    state = (r(B, NH, DH, DH), r(B, NH, DH), torch.full((B, NH), 2.0, dtype=torch.float64))
    h, C, n, m = _unstabilised(q, k, v, i, log_f, *state)
    F_ = log_f.cumsum(-1)
    closed = F_[..., -1] + torch.maximum(state[2], (i - F_).amax(-1))
    assert_close_scaled({"m": m}, {"m": closed}, of_largest=1e-14)
    window = _window(q, k, v, i, log_f, *state)
    acted, s = [], state
    for t in range(n_steps):
        h_t, *s = _step(q[..., t, :], k[..., t, :], v[..., t, :], i[..., t], log_f[..., t], *s)
        acted.append(h_t)
    want = {"h": h, "C": C, "n": n, "m": m}
    for h_got, C_got, n_got, m_got in (window, (torch.stack(acted, dim=-2), *s)):
        scale = m_got.exp()
        got = {"h": h_got, "C": C_got * scale[..., None, None], "n": n_got * scale[..., None], "m": m_got}
        # Largest measured: 3.7e-14 (the window) and 5.0e-15 (acting) of the largest entry.
        assert_close_scaled(got, want, of_largest=1e-12)


def test_gates_whose_exponentials_overflow_float32_stay_finite():
    # Input gates near e^100 (float32 overflows past e^88.7) on every head, forget gates near 1 and near 0: the
    # stabilised window and acting are finite in float32 and within rounding of the model in float64, from a fresh
    # state and one carried in whose m is about 100. Largest measured, of the largest entry: 6.1e-6 (the window
    # against float64) and 7.6e-6 (acting against the window).
    model = _model(layers=2)
    with torch.no_grad():
        for block in model.blocks:
            block.igate.bias.add_(100.0)
            block.fgate.bias.copy_(torch.tensor([-8.0, 0.0, 8.0, 30.0]))
    exact = _model(layers=2).double()
    exact.load_state_dict(model.state_dict())
    x0, x, _ = _inputs()
    with torch.no_grad():
        for s32, s64 in ((None, None), (model(x0)[1], exact(x0.double())[1])):
            assert s32 is None or s32[2].min() > 90  # m, carried in
            y, state = model(x, s32)
            want, end = exact(x.double(), s64)
            assert torch.isfinite(y).all() and all(torch.isfinite(t).all() for t in state)
            assert_close_scaled(
                {"y": y} | {f"state {i}": t for i, t in enumerate(state)},
                {"y": want} | {f"state {i}": t for i, t in enumerate(end)},
                of_largest=3e-5,
            )
            assert_steps_equal_window(model, x, s32 if s32 is not None else model.initial_state(B), of_largest=3e-5)


def test_input_gates_below_float32s_exponent_range_leave_finite_gradients():
    # Input gates near e^-100 make exp(-m) overflow float32 (m ~ -100): the package's denominator is then inf and its
    # backward NaN (two of three learning-check seeds diverged on it). The capped floor (mlstm._floor) leaves y within
    # rounding of the float64 model and every gradient finite, window and acting.
    model = _model()
    with torch.no_grad():
        for block in model.blocks:
            block.igate.bias.sub_(100.0)
    exact = _model().double()
    exact.load_state_dict(model.state_dict())
    _, x, R_y = _inputs()
    for T in (x.shape[0], 1):
        mine, _ = outputs_and_grads(lambda x, s: (model(x)[0], ()), x[:T], (), [R_y[:T]], model.named_parameters())
        assert all(torch.isfinite(t).all() for t in mine.values()), [
            k for k, t in mine.items() if not t.isfinite().all()
        ]
        want, _ = outputs_and_grads(
            lambda x, s: (exact(x)[0], ()), x[:T].double(), (), [R_y[:T]], exact.named_parameters()
        )
        assert_close_scaled({"y": mine["y"]}, {"y": want["y"]}, of_largest=3e-5)


def test_initialisation_is_the_packages():
    # At H = 128 (D = 256, 4 heads of 64), two blocks: the fixed values equal the package's, the drawn ones of its
    # spread (standard deviations within 15% of each other, over 256 to 65536 entries; means about 0).
    torch.manual_seed(SEED + 0)
    model = MLSTM(IN, 128, layers=2)
    torch.manual_seed(SEED + 5)
    theirs = {k: p.detach() for k, p in package_stack(model, torch.float32).named_parameters()}
    assert torch.equal(model.norm.detach(), theirs["post_blocks_norm.weight"])
    for n, block in enumerate(model.blocks):
        mine = {k: p.detach() for k, p in block.named_parameters()}
        for ours, name in BLOCK_NAMES.items():
            a, b = mine[ours], theirs[f"blocks.{n}.{name}"]
            assert a.shape == b.shape, ours
            if ours == "igate.bias":  # N(0, 0.1^2), one per head: too few to compare spreads
                assert a.abs().max() < 0.4 and b.abs().max() < 0.4
            elif ours in ("norm", "igate.weight", "fgate.weight", "fgate.bias", "outnorm", "skip"):
                # fixed: zeros, ones, the forget gates' biases linspace(3, 6)
                assert torch.equal(a, b), ours
            else:
                spread = b.std().item()  # and a mean within 4 standard errors of 0
                assert abs(a.std() / spread - 1) < 0.15 and abs(a.mean()) < 4 * spread / math.sqrt(a.numel()), ours


def test_options():
    assert option_defaults(MLSTM) == {
        "layers": 1,
        "heads": 4,
        "proj_factor": 2.0,
        "conv1d_kernel_size": 4,
        "qkv_proj_blocksize": 4,
    }
    layer = mLSTMLayerConfig()  # the package's defaults
    assert (layer.num_heads, layer.proj_factor, layer.conv1d_kernel_size, layer.qkv_proj_blocksize) == (4, 2.0, 4, 4)
    model = MLSTM(IN, 128)
    assert (model.inner, model.heads, model.layers) == (256, 4, 1)
    C, n, m, conv = model.initial_state(3)
    assert C.shape == (1, 3, 4, 64, 64) and n.shape == (1, 3, 4, 64) and conv.shape == (1, 3, 3, 256)
    assert torch.equal(m, torch.full((1, 3, 4), -math.inf))  # the max over no steps
    assert sum(t[:, 0].numel() for t in (C, n, m, conv)) == 17412  # floats per row (the module docstring's)
    assert MLSTM(IN, 30).inner == 64  # 2 x 30 rounded up to a multiple of 64, as the package's
    with pytest.raises(ValueError, match=r"^policy.mlstm.heads=0 must be >= 1$"):
        MLSTM(IN, H, heads=0)
    with pytest.raises(ValueError, match=r"^MLSTM's hidden_size=32: its up-projection's width 64 must be a multiple"):
        MLSTM(IN, H, heads=3)
    policy = types.SimpleNamespace(rnn_hidden_size=128)
    with pytest.raises(ValueError, match=r"width 256 must be a multiple of policy.mlstm.qkv_proj_blocksize=3$"):
        MLSTMConfig(qkv_proj_blocksize=3).check_chosen("policy.mlstm", policy)

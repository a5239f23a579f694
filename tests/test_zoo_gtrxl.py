"""GTrXL (pomdp_ffm/seq_models/gtrxl.py) against its paper's equations (Parisotto et al. 2020, with Transformer-XL's
relative attention, Dai et al. 2019) written out here in float64, each step's attention on its own keys: the layer
inputs of the last ``memory`` steps and its own, the empty slots of a carried-in state left out, Transformer-XL's four
score terms (a) to (d) summed as the paper writes them, the gate as the paper writes it. The reference package,
gtrxl-torch 0.1.7, implements no memory, absolute positions and a torch GRU for each gate run over the batch axis
(the module's docstring; its GTrXL.forward does not run on torch 2.13 either: torch's TransformerEncoder passes
``is_causal``, which its TEL.forward does not take); it holds the gate alone, where its nn.GRU and the paper's gate
coincide. Then acting one
step at a time against the window, a window carried in from a state against the same steps inside one window, and
the options."""

import math
from types import SimpleNamespace

import pytest
import torch
from gtrxl_torch.gtrxl_torch import TEL
from zoo_checks import assert_close_scaled, assert_steps_equal_window, option_defaults, outputs_and_grads

from pomdp_ffm.options import GTrXLConfig
from pomdp_ffm.seq_models.gtrxl import Gate, GTrXL

T, B, IN, H = 64, 8, 12, 32
SEED = 0  # added to every generator seed here (conftest.ZOO_CASES sets it, and the sizes above)
HEADS, LAYERS = 4, 2
FIRST = 20  # the steps of the window a state is carried in from: a full memory of 16, a partly empty one of 64

pytestmark = pytest.mark.usefixtures("one_thread")


def _memory(span: str) -> int:
    return {"whole-window": T, "last-16": 16}[span]


def _model(memory: int) -> GTrXL:
    torch.manual_seed(SEED + 0)
    return GTrXL(IN, H, layers=LAYERS, heads=HEADS, memory=memory)


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(SEED + 1)
    x0 = torch.randn(FIRST, B, IN, generator=g, dtype=torch.float64).to(dtype)
    x = torch.randn(T, B, IN, generator=g, dtype=torch.float64).to(dtype)
    return x0, x, g


class Reads(dict):
    """The weights by name, remembering which names were read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, name):
        self.read.add(name)
        return super().__getitem__(name)


def layer_norm(z, p, name):
    mean = z.mean(-1, keepdim=True)
    var = ((z - mean) ** 2).mean(-1, keepdim=True)
    return (z - mean) / torch.sqrt(var + 1e-5) * p[name + ".weight"] + p[name + ".bias"]


def gate(p, name, x, y):
    """The paper's GRU-type gating g(x, y), b_g subtracted in the update gate."""
    W_r, W_z, W_g = p[name + ".w.weight"].chunk(3)
    U_r, U_z = p[name + ".u.weight"].chunk(2)
    r = torch.sigmoid(y @ W_r.T + x @ U_r.T)
    z = torch.sigmoid(y @ W_z.T + x @ U_z.T - p[name + ".b_g"])
    h = torch.tanh(y @ W_g.T + (r * x) @ p[name + ".u_g.weight"].T)
    return (1 - z) * x + z * h


def sinusoid(d: int, width: int) -> torch.Tensor:
    """Transformer-XL's R_d: the sines, then the cosines, of d 10000^(-2i/width), in float64."""
    angle = d * torch.exp(-torch.arange(0, width, 2, dtype=torch.float64) * math.log(10000) / width)
    return torch.cat((angle.sin(), angle.cos()))[:width]


def reference(p, memory: int, x, state):
    """The paper's GTrXL on weights ``p`` (by our names) from ``state`` (the carried layer inputs and which slots hold
    a step), in float64, layer by layer, each step's attention on its own keys; returns y and the state after."""
    carried, valid = state
    rows, steps, d = x.shape[1], x.shape[0], H // HEADS
    held = torch.cat((valid, torch.ones(rows, steps, dtype=torch.float64)), 1)  # [B, M + T]
    R = torch.stack([sinusoid(memory - k, H) for k in range(memory + 1)])  # a step's key k of M + 1: M - k back
    E = (x @ p["embed.weight"].T + p["embed.bias"]).transpose(0, 1)  # [B, T, H]
    final = []
    for l in range(LAYERS):
        b = f"blocks.{l}."
        seq = torch.cat((carried[l], E), 1)  # the layer's inputs, the M carried slots' then the window's
        final.append(seq[:, steps:])
        n = layer_norm(seq, p, b + "ln_1")
        W_k, W_v = p[b + "key_value.weight"].chunk(2)
        k, v = ((n @ W.T).view(rows, -1, HEADS, d) for W in (W_k, W_v))
        q = (n[:, memory:] @ p[b + "query.weight"].T).view(rows, steps, HEADS, d)
        r = (R @ p[b + "pos.weight"].T).view(-1, HEADS, d)
        attended = []
        for t in range(steps):  # step t is sequence entry M + t: its keys are entries t .. M + t
            k_t, v_t, q_t = k[:, t : memory + t + 1], v[:, t : memory + t + 1], q[:, t]
            score = (
                torch.einsum("bhd,bkhd->bhk", q_t, k_t)  # (a) content
                + torch.einsum("bhd,khd->bhk", q_t, r)  # (b) content-dependent position
                + torch.einsum("hd,bkhd->bhk", p[b + "u"], k_t)  # (c) global content bias
                + torch.einsum("hd,khd->hk", p[b + "v"], r)  # (d) global position bias
            ) / math.sqrt(d)
            score = score.masked_fill((held[:, t : memory + t + 1] == 0).unsqueeze(1), float("-inf"))
            attended.append(torch.einsum("bhk,bkhd->bhd", torch.softmax(score, -1), v_t).reshape(rows, H))
        Y = gate(p, b + "gate_attn", E, torch.relu(torch.stack(attended, 1) @ p[b + "out.weight"].T))
        f = torch.relu(layer_norm(Y, p, b + "ln_2") @ p[b + "fc.weight"].T + p[b + "fc.bias"])
        E = gate(p, b + "gate_mlp", Y, torch.relu(f @ p[b + "fc_out.weight"].T + p[b + "fc_out.bias"]))
    return E.transpose(0, 1), (torch.stack(final), held[:, steps:])


def _compare(model: GTrXL, dtype: torch.dtype, of_largest: float) -> dict:
    """The model (in ``dtype``) against the paper's equations in float64 on the same weights: y, the final state,
    and the gradients of x, of the carried-in layer inputs and of every parameter of a loss on y and the state, from
    a state carried in from a first window (FIRST steps: a full memory of 16, a partly empty one of T)."""
    x0, x, g = _inputs()
    shapes = [(T, B, H), (LAYERS, B, model.memory, H), (B, model.memory)]  # y's, the final state's
    weights = [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
    with torch.no_grad():
        carried = tuple(s.to(dtype) for s in model.double()(x0.double(), None)[1])
    model = model.to(dtype)
    theirs = Reads({n: p.detach().double().clone().requires_grad_() for n, p in model.named_parameters()})
    run = lambda x, s: reference(theirs, model.memory, x, s)  # noqa: E731
    mine, _ = outputs_and_grads(model, x.to(dtype), carried, weights, model.named_parameters())
    exact, _ = outputs_and_grads(run, x.double(), tuple(s.double() for s in carried), weights, theirs)
    assert theirs.read == set(theirs)  # the reference reads every parameter of ours
    # y, the final state's two, the gradients of x and of the carried state's two (the 0/1 flags' only through the
    # final flags, zero where the window pushes them all out) and of every parameter
    assert len(exact) == 6 + len(theirs)
    return assert_close_scaled(mine, exact, of_largest)


@pytest.mark.parametrize("span", ["whole-window", "last-16"])
def test_float64_model_equals_the_papers_equations(span):
    # Largest measured (each result's largest difference over its largest magnitude): 2.0e-15 (last 16).
    _compare(_model(_memory(span)), torch.float64, of_largest=1e-12)


@pytest.mark.parametrize("span", ["whole-window", "last-16"])
def test_float32_model_within_rounding_of_the_papers_equations(zoo_case, span):
    # Largest measured over conftest.ZOO_CASES: 1.3e-6 (long, whole window; 9.6e-7 at most in the others); the
    # float32 epsilon is 1.2e-7.
    _compare(_model(_memory(span)), torch.float32, of_largest=5e-6)


def test_the_gate_is_the_packages_gru_where_their_forms_meet():
    # gtrxl-torch's TEL gates with nn.GRU(input=the sublayer's output y, hidden=the stream x), run over the batch
    # axis: with a batch of one, each step is one GRU step, which the test calls as TEL.forward does. torch's GRU
    # updates as z' x + (1 - z') n, so z' = 1 - z: its rows take -W_z, -U_z and bias +b_g; its candidate resets
    # after U_g, r * (U_g x), the paper's before, U_g (r * x): equal where U_g is diagonal, as here.
    torch.manual_seed(SEED)
    ours = Gate(H, 2.0).double()
    with torch.no_grad():
        ours.u_g.weight.copy_(torch.diag(torch.randn(H, dtype=torch.float64)))
        ours.b_g.normal_(2.0, 0.5)
    gru = TEL(H, HEADS).double().gru_1
    W_r, W_z, W_g = ours.w.weight.detach().chunk(3)
    U_r, U_z = ours.u.weight.detach().chunk(2)
    zero = torch.zeros(H, dtype=torch.float64)
    with torch.no_grad():
        gru.weight_ih_l0.copy_(torch.cat((W_r, -W_z, W_g)))
        gru.weight_hh_l0.copy_(torch.cat((U_r, -U_z, ours.u_g.weight)))
        gru.bias_ih_l0.copy_(torch.cat((zero, ours.b_g, zero)))
        gru.bias_hh_l0.zero_()
    g = torch.Generator().manual_seed(SEED + 1)
    x, y, w = (torch.randn(T * B, H, generator=g, dtype=torch.float64) for _ in range(3))
    theirs = lambda x, s: (gru(s[0].unsqueeze(1), x.unsqueeze(0))[0].squeeze(1), ())  # noqa: E731
    mine, _ = outputs_and_grads(lambda x, s: (ours(x, s[0]), ()), x, (y,), [w])
    exact, _ = outputs_and_grads(theirs, x, (y,), [w])
    assert_close_scaled(mine, exact, of_largest=1e-14)  # y and the gradients of x and y


@pytest.mark.parametrize("span", ["whole-window", "last-16", "itself-and-one"])
def test_acting_steps_equal_the_window(span):
    # From a fresh state and from one carried in (a first window's layer inputs, FIRST steps), past ``memory``
    # steps: acting attends to what the window does. Largest measured: 6.4e-8 of the largest entry.
    model = _model({"itself-and-one": 1}.get(span) or _memory(span))
    x0, x, _ = _inputs()
    for state in (model.initial_state(B), model(x0, None)[1]):
        layer_inputs, valid = assert_steps_equal_window(model, x, state, of_largest=1e-6)
        assert layer_inputs.shape == (LAYERS, B, model.memory, H)
        assert torch.equal(valid, torch.ones(B, model.memory))


def test_a_window_from_a_state_is_the_same_steps_inside_one_window():
    # The second half of one long window, and the same steps as a window carried in from the first half's state.
    model = _model(16)
    x0, x, _ = _inputs()
    with torch.no_grad():
        whole, _ = model(torch.cat((x0, x)), None)
        _, state = model(x0, None)
        second, _ = model(x, state)
    assert_close_scaled({"y": second}, {"y": whole[FIRST:]}, of_largest=5e-6)


def test_options():
    cfg = GTrXLConfig()
    assert option_defaults(GTrXL) == {"layers": 2, "heads": 4, "memory": 64, "gate_bias": 2.0}
    assert (cfg.layers, cfg.heads, cfg.memory, cfg.gate_bias) == (2, 4, 64, 2.0)
    model = GTrXL(IN, H, layers=3, memory=5, gate_bias=0.5)
    assert len(model.blocks) == 3 and model.memory == 5
    assert all(torch.equal(p, torch.full((H,), 0.5)) for n, p in model.named_parameters() if n.endswith("b_g"))
    with pytest.raises(ValueError, match=r"^policy.gtrxl.memory=0 must be >= 1$"):
        GTrXL(IN, H, memory=0)
    with pytest.raises(ValueError, match=r"^policy.gtrxl.gate_bias=-1 must be >= 0$"):
        GTrXL(IN, H, gate_bias=-1)
    with pytest.raises(ValueError, match="hidden_size=30 must be a multiple of heads=4"):
        GTrXL(IN, 30)
    with pytest.raises(ValueError, match=r"^policy.rnn_hidden_size=30 must be a multiple of policy.gtrxl.heads=4 "):
        cfg.check_chosen("policy.gtrxl", SimpleNamespace(rnn_hidden_size=30))  # the config's check, before a build

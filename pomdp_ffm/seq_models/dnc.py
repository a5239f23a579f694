"""Differentiable Neural Computer (Graves et al., 2016, "Hybrid computing using neural networks with dynamic
external memory", Nature 538), as POPGym's ``DiffNC`` runs it: the ``dnc`` package (pytorch-dnc) with an LSTM
controller, one memory of N cells of width W read by R heads, and an output layer of width hidden_size.

Per step t, with x_t the input, h the controller's top-layer output, r_{t-1} the last step's R read vectors:

    h_t, (h, c)_t = LSTM([x_t; r_{t-1}], (h, c)_{t-1})                          controller [H]
    xi_t = W_xi h_t + b_xi                                                        interface  [R W + 3 W + 5 R + 3]
      = read keys k^r (tanh, R x W), read strengths b^r (softplus, R), write key k^w (tanh, W), write strength
        b^w (softplus), erase e (sigmoid, W), write vector v (tanh, W), free gates f (sigmoid, R), allocation gate
        g^a (sigmoid), write gate g^w (sigmoid), read modes pi (softmax over backward/forward/content, R x 3)
    C(M, k, b)[i] = softmax_i(b * M[i].k / (|M[i]| |k| + 1e-6))                  content weighting
    u_t = (u_{t-1} + w^w_{t-1} - u_{t-1} w^w_{t-1}) * prod_j (1 - f_j w^r_{t-1,j})  usage
    a_t[i] = (1 - u'[i]) prod_{k before i} u'[k],  u' = 1e-6 + (1 - 1e-6) u_t     allocation (k before i: u'[k] < u'[i],
                                                                                  ties in index order)
    w^w_t = g^w (g^a a_t + (1 - g^a) C(M_{t-1}, k^w, b^w))                        write weighting [N]
    M_t = M_{t-1} * (1 - w^w_t e^T) + w^w_t v^T                                   memory [N, W]
    L_t[i, j] = ((1 - w^w_t[i] - w^w_t[j]) L_{t-1}[i, j] + w^w_t[i] p_{t-1}[j]) (i != j; 0 on the diagonal)   links
    p_t = (1 - sum w^w_t) p_{t-1} + w^w_t                                         precedence [N]
    w^r_t,j = pi_j[0] (w^r_{t-1,j} L_t) + pi_j[2] C(M_t, k^r_j, b^r_j) + pi_j[1] (L_t w^r_{t-1,j})   read weightings
    r_t,j = M_t^T w^r_t,j                                                         read vectors [R, W]
    y_t = W_y [h_t; r_t] + b_y                                                    output [hidden_size]

The allocation's "k before i" is the package's sort of the usage (torch.topk) then an exclusive cumulative product,
written here without a sort: a pairwise comparison of the N usages and a masked product, O(N^2) per step, the same
values (tests/test_zoo_dnc.py holds it to the sort) with no data-dependent branch or shape. A window is a loop over
time (each step needs the last step's reads); acting (T = 1) is one step, O(1).

State, a tuple of fixed-shape tensors, batch first, in POPGym's order (its packed state, less its singleton dims):
``(h [B, L, H], c [B, L, H], r [B, R, W], M [B, N, W], L [B, N, N], p [B, N], w^r [B, R, N], w^w [B, N],
u [B, N])``: 2 L H + R W + N W + N^2 + 3 N + R N floats a row (L = num_hidden_layers, the controller's stacked
LSTM layers). hidden_size is POPGym's hidden_size: the controller's width H and the output's; N = hidden_size //
cell_size by default (POPGym's nr_cells), so 8 cells of 16 at hidden_size 128.

The interface follows the package, not the paper, where they differ: strengths are softplus (the paper's
oneplus is 1 + softplus), keys tanh, the read modes' order (backward, forward, content), the 1e-6 in the cosine's
denominator and the allocation's usage floor. Deliberate differences from POPGym's code:

- POPGym's ``DiffNC`` window (the dnc package's forward) feeds every step of a window the read vectors carried in
  at its start (it builds the controller inputs [x_t; r_in] before its time loop), so a window of T steps differs
  from the same steps taken one at a time, as POPGym acts. Here each step gets the last step's reads (the paper's
  controller input, and POPGym's acting): a window equals its steps, and the test holds it to POPGym stepped.
- Ties in the usage (every cell of a fresh state, at the first step) are broken in cell order; the package's
  torch.topk leaves their order to the kernel (on a CPU, not cell order; on a GPU, another), which permutes the
  cells but changes no output.
- The package clamps the controller's output to [-20, 20], which an LSTM's output (|h| < 1) never reaches: left
  out. POPGym's options ``num_layers`` (DNC layers sharing the memory; its state holds one controller, so only 1
  runs) and ``nonlinearity`` (a plain-RNN controller's; the DNC's is an LSTM) are not options here.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..options import DNCConfig
from ..rules import options_of
from .base import SeqModel, State

DELTA = 1e-6  # the package's epsilon: the cosine's denominator and the allocation's usage floor


def allocation(usage: torch.Tensor, earlier: torch.Tensor | None = None) -> torch.Tensor:
    """The allocation weighting [..., N] of a usage [..., N]: a free cell (low usage) gets most, in the order of
    the usage (ties: cell order), without a sort. ``earlier`` [N, N]: ``cell_order(N)``, made once per window."""
    u = DELTA + (1 - DELTA) * usage
    earlier = cell_order(u.shape[-1], u.device) if earlier is None else earlier
    # before[..., i, k]: cell k comes before cell i in ascending usage
    ui, uk = u.unsqueeze(-1), u.unsqueeze(-2)
    before = (uk < ui) | ((uk == ui) & earlier)
    return (1 - u) * torch.where(before, uk, 1.0).prod(-1)


def cell_order(n: int, device=None) -> torch.Tensor:
    """[n, n] bool: entry [i, k] is k < i (the allocation's order among equal usages)."""
    idx = torch.arange(n, device=device)
    return idx.unsqueeze(0) < idx.unsqueeze(1)


def _cosine(memory: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Cosine similarity [B, K, N] of keys [B, K, W] with the memory's rows [B, N, W] (the package's epsilon)."""
    dot = torch.bmm(keys, memory.transpose(1, 2))
    norms = torch.linalg.vector_norm(keys, dim=2).unsqueeze(2) * torch.linalg.vector_norm(memory, dim=2).unsqueeze(1)
    return dot / (norms + DELTA)


class _LSTMWeights(nn.Module):
    """The controller's weights, named and initialised as torch.nn.LSTM's (uniform in +-1 / sqrt(H), in its
    order), without its module: torch.compile (dynamo) refuses to trace an nn.LSTM, even one only read."""

    NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")

    def __init__(self, input_size: int, hidden_size: int, num_layers: int):
        super().__init__()
        bound, H4 = hidden_size**-0.5, 4 * hidden_size
        for layer in range(num_layers):
            shapes = ((H4, input_size if layer == 0 else hidden_size), (H4, hidden_size), (H4,), (H4,))
            for name, shape in zip(self.NAMES, shapes):
                self.register_parameter(f"{name}_l{layer}", nn.Parameter(torch.empty(shape).uniform_(-bound, bound)))


class DNC(SeqModel):
    """The DNC with an LSTM controller (module docstring); state: the tuple ``initial_state`` gives."""

    def __init__(self, input_size: int, hidden_size: int, **options):
        """``options``: policy.dnc's (options.DNCConfig: their defaults, POPGym's, and rules)."""
        super().__init__()
        o = options_of(DNCConfig, options, "policy.dnc")
        cell_size, read_heads, num_hidden_layers = o.cell_size, o.read_heads, o.num_hidden_layers
        nr_cells = hidden_size // cell_size if o.nr_cells is None else o.nr_cells
        if nr_cells < 1:
            raise ValueError(
                f"DNC's nr_cells={nr_cells} must be >= 1 (hidden_size // cell_size: pass nr_cells or a smaller "
                "cell_size)"
            )
        self.input_size, self.hidden_size = input_size, hidden_size
        self.cell_size, self.read_heads, self.nr_cells = cell_size, read_heads, nr_cells
        self.num_hidden_layers, W, R = num_hidden_layers, cell_size, read_heads
        # (the package's default initialisations: torch's for the LSTM and both Linears; POPGym replaces the
        # package's orthogonal output layer, of the input's width, by a default one of hidden_size)
        self.controller = _LSTMWeights(input_size + R * W, hidden_size, num_hidden_layers)
        self._interface_split = (R * W, R, W, 1, W, W, R, 1, 1, 3 * R)
        self.interface = nn.Linear(hidden_size, sum(self._interface_split))
        self.output = nn.Linear(hidden_size + R * W, hidden_size)

    def initial_state(self, batch_size: int, device=None) -> State:
        B, L, H = batch_size, self.num_hidden_layers, self.hidden_size
        N, W, R = self.nr_cells, self.cell_size, self.read_heads
        shapes = ((B, L, H), (B, L, H), (B, R, W), (B, N, W), (B, N, N), (B, N), (B, R, N), (B, N), (B, N))
        return tuple(torch.zeros(s, dtype=self.output.weight.dtype, device=device) for s in shapes)

    def activation_floats(self) -> int:
        H, L, N, W, R = self.hidden_size, self.num_hidden_layers, self.nr_cells, self.cell_size, self.read_heads
        controller = L * (4 * H + 2 * H) + H  # gates, (h, c), the input's reads
        interface = 2 * sum(self._interface_split)  # before and after its activations
        memory = 4 * N * W + 4 * N * N + 2 * N * N  # memory and links (erase, write), the allocation's pairs
        weightings = 6 * (R + 1) * N + 4 * N + R * N  # content (cosine, softmax), usage, allocation, reads
        return controller + interface + memory + weightings + 2 * R * W + H  # reads, output

    def _weights(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each controller layer's [W_ih | W_hh] (layer 0: its reads' columns only) and summed bias."""
        weights, biases = [], []
        for layer in range(self.num_hidden_layers):
            w_ih, w_hh, b_ih, b_hh = (getattr(self.controller, f"{n}_l{layer}") for n in _LSTMWeights.NAMES)
            weights.append(torch.cat((w_ih[:, self.input_size :] if layer == 0 else w_ih, w_hh), dim=1))
            biases.append(b_ih + b_hh)
        return weights, biases

    def forward(self, x: torch.Tensor, state: State = None) -> tuple[torch.Tensor, State]:
        self._check_input(x)
        T, B, _ = x.shape
        if state is None:
            state = self.initial_state(B, x.device)
        h, c, reads, memory, links, precedence, read_w, write_w, usage = state
        N = self.nr_cells
        weights, biases = self._weights()
        # the controller's first layer, its input's columns: one product for the whole window
        gates_x = F.linear(x, self.controller.weight_ih_l0[:, : self.input_size], biases[0])
        off_diagonal, earlier = 1 - torch.eye(N, dtype=x.dtype, device=x.device), cell_order(N, x.device)
        hs, ctrl_h, ctrl_c = [], list(h.unbind(1)), list(c.unbind(1))
        all_reads = []
        for t in range(T):
            inp = reads.flatten(1)
            for layer in range(self.num_hidden_layers):
                z = torch.cat((inp, ctrl_h[layer]), dim=1)
                # (layer 0's bias is in gates_x)
                gates = (
                    gates_x[t] + F.linear(z, weights[0]) if layer == 0 else F.linear(z, weights[layer], biases[layer])
                )
                i, f, g, o = gates.chunk(4, dim=1)
                ctrl_c[layer] = torch.sigmoid(f) * ctrl_c[layer] + torch.sigmoid(i) * torch.tanh(g)
                ctrl_h[layer] = inp = torch.sigmoid(o) * torch.tanh(ctrl_c[layer])
            hs.append(inp)
            memory, links, precedence, read_w, write_w, usage, reads = self._memory_step(
                inp, memory, links, precedence, read_w, write_w, usage, off_diagonal, earlier
            )
            all_reads.append(reads.flatten(1))
        y = self.output(torch.cat((torch.stack(hs), torch.stack(all_reads)), dim=-1))
        h, c = torch.stack(ctrl_h, 1), torch.stack(ctrl_c, 1)
        return y, (h, c, reads, memory, links, precedence, read_w, write_w, usage)

    def _memory_step(self, h, memory, links, precedence, read_w, write_w, usage, off_diagonal, earlier):
        B, R, W = h.shape[0], self.read_heads, self.cell_size
        k_r, b_r, k_w, b_w, erase, vec, free, g_a, g_w, modes = self.interface(h).split(self._interface_split, dim=1)
        k_r, k_w = torch.tanh(k_r).view(B, R, W), torch.tanh(k_w).view(B, 1, W)
        b_r, b_w = F.softplus(b_r), F.softplus(b_w)
        erase, vec, free = torch.sigmoid(erase), torch.tanh(vec), torch.sigmoid(free)
        g_a, g_w = torch.sigmoid(g_a), torch.sigmoid(g_w)
        modes = torch.softmax(modes.view(B, R, 3), dim=-1)
        # write: usage from the last step's weightings, then where to write, then the memory and its links
        usage = (usage + (1 - usage) * write_w) * torch.prod(1 - free.unsqueeze(2) * read_w, dim=1)
        content_w = torch.softmax(_cosine(memory, k_w).squeeze(1) * b_w, dim=-1)
        write_w = g_w * (g_a * allocation(usage, earlier) + (1 - g_a) * content_w)
        ww = write_w.unsqueeze(2)
        memory = memory * (1 - ww * erase.unsqueeze(1)) + ww * vec.unsqueeze(1)
        links = ((1 - ww - write_w.unsqueeze(1)) * links + ww * precedence.unsqueeze(1)) * off_diagonal
        precedence = (1 - write_w.sum(1, keepdim=True)) * precedence + write_w
        # read: the last step's read weightings moved backward and forward along the links, or by content
        backward, forward = torch.bmm(read_w, links), torch.bmm(read_w, links.transpose(1, 2))
        content_r = torch.softmax(_cosine(memory, k_r) * b_r.unsqueeze(2), dim=-1)
        read_w = modes[..., 0:1] * backward + modes[..., 2:3] * content_r + modes[..., 1:2] * forward
        return memory, links, precedence, read_w, write_w, usage, torch.bmm(read_w, memory)

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, nr_cells={self.nr_cells}, "
            f"cell_size={self.cell_size}, read_heads={self.read_heads}, num_hidden_layers={self.num_hidden_layers}"
        )

"""Memory-model benchmark: FFM vs nn.GRU vs nn.LSTM vs a Python-loop GRUCell (the paper's comparison).

All variants run in one process, warmed up, then timed in interleaved rounds so that machine noise hits
every variant alike; medians are reported with ratios to nn.GRU (docs/benchmarks.md, "Memory models").
"""

from __future__ import annotations

import torch
from torch import nn

from ..catalog import BASELINES, COMPARED
from ..seq_models import FFM, build
from .common import Row, interleaved_medians, saved_tensor_bytes

SHAPES = {
    # name: (T, B, input, hidden)
    "rl": (64, 64, 64, 128),  # the recurrent SAC/TD3 training window on the BLT tasks
    "paper": (1024, 8, 128, 256),  # the paper's long-sequence efficiency shape
}


class LoopGRU(nn.Module):
    """A GRUCell stepped in Python: what a recurrent model costs without a fused kernel."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.cell = nn.GRUCell(input_size, hidden_size)
        self.hidden_size = hidden_size

    def forward(self, x, state=None):
        h = x.new_zeros(x.shape[1], self.hidden_size) if state is None else state
        ys = []
        for xt in x:
            h = self.cell(xt, h)
            ys.append(h)
        return torch.stack(ys), h


class FFMDenseFloor(FFM):
    """FFM with its aggregator replaced by a broadcast of the gated input: every dense layer, gate and norm
    of the cell, no recurrence. What an FFM cell cannot go below without faster dense kernels."""

    def _aggregate(self, u, state):
        S = torch.complex(u, torch.zeros_like(u)).unsqueeze(-1).expand(*u.shape, self.context_size)
        return torch.view_as_real(S), S[-1]


def variants(input_size: int, hidden_size: int, device: torch.device, only=None) -> dict[str, nn.Module]:
    """All variants, or ``only`` these (an unknown name is a ValueError), on ``device``."""
    size = {"input_size": input_size, "hidden_size": hidden_size}
    models = {
        "ffm": build("ffm", **size),
        "ffm-scan": build("ffm", aggregator="scan", **size),
        "ffm-loop": build("ffm", aggregator="loop", **size),
        "ffm-closed": build("ffm", aggregator="closed", **size),
        # the associative scan in real arithmetic, eager: whether one CUDA form can serve eager and compiled runs
        "ffm-assoc": build("ffm", aggregator="assoc", **size),
        "ffm-dense": FFMDenseFloor(input_size, hidden_size),
        **{name: build(name, **size) for name in BASELINES},
        "gru-loop": LoopGRU(input_size, hidden_size),
    }
    models.pop(f"ffm-{models['ffm'].resolved_aggregator(device)}")  # already timed as "ffm" (auto)
    unknown = sorted(set(only or ()) - set(models))
    if unknown:
        raise ValueError(f"unknown {unknown}; on {device.type} they are {sorted(models)}")
    return {k: m.to(device) for k, m in models.items() if not only or k in only}


def run(shape_names, repeats: int, device: torch.device, only: list[str] | None = None) -> list[Row]:
    rows: list[Row] = []
    for shape_name in shape_names:
        T, B, I, H = SHAPES[shape_name]
        shape = f"T{T}_B{B}_in{I}_h{H}"
        models = variants(I, H, device, only)
        x = torch.randn(T, B, I, device=device)
        out_grad = torch.randn(T, B, H, device=device)

        def fwd_bwd(model):
            xg = x.detach().requires_grad_()
            y, _ = model(xg)
            y.backward(out_grad)

        def fwd(model):
            with torch.no_grad():
                model(x)

        # The loop GRU at T=1024 takes seconds per call: fewer rounds keep the benchmark short.
        reps = max(3, repeats // 4) if T >= 512 else repeats
        for metric, fn in (("fwd_bwd_ms", fwd_bwd), ("fwd_ms", fwd)):
            med = interleaved_medians({k: (lambda m=m: fn(m)) for k, m in models.items()}, reps, device)
            rows += [Row("memory", shape, k, metric, v * 1e3, "ms") for k, v in med.items()]
        for k, m in models.items():
            mb = saved_tensor_bytes(lambda: m(x.detach().requires_grad_())[0].sum(), device) / 2**20
            rows.append(Row("memory", shape, k, "peak_mem_mb", mb, "MB"))

        # Acting: batch 1, one step, state carried, no autograd.
        act = {k: m for k, m in models.items() if k in COMPARED}
        xs = torch.randn(1, 1, I, device=device)
        states = {k: m.initial_state(1, device) for k, m in act.items()}

        def step(k):
            with torch.no_grad():
                _, states[k] = act[k](xs, states[k])

        med = interleaved_medians({k: (lambda k=k: step(k)) for k in act}, 400, device, inner=25)
        rows += [Row("memory", shape, k, "act_us", v * 1e6, "us") for k, v in med.items()]
    return rows

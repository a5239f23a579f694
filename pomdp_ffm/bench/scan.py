"""The shared linear recurrence (seq_models/recurrence.py): its two forms, ``loop`` (sqrt(T) chunks) and ``scan``
(log-depth), and the step-by-step definition, forward and backward, at the state shapes the memories give it at
hidden size 128 over the training window (docs/benchmarks.md, "The shared recurrence")."""

from __future__ import annotations

import torch

from ..seq_models.recurrence import linear_scan, linear_scan_loop
from .common import Row, interleaved_medians

T, B = 64, 64  # the BLT tasks' training window and a batch of windows

# name: (decay a, input x), each a function of the device. Complex states are complex64, as the models keep them.
SHAPES = {
    "ffm [m32, c4] constant": (lambda d: _polar(1, 1, 32, 4, d=d), lambda d: torch.randn(T, B, 32, 1, device=d)),
    "lru [128] constant": (lambda d: _polar(1, 1, 128, d=d), lambda d: _complex(T, B, 128, d=d)),
    "s4d [128, 6] constant": (lambda d: _polar(1, 1, 128, 6, d=d), lambda d: _complex(T, B, 128, 6, d=d)),
    "mingru [128] per step": (lambda d: torch.rand(T, B, 128, device=d), lambda d: torch.randn(T, B, 128, device=d)),
    "fart [10, 10] summed": (lambda d: torch.ones(1, 1, 1, 1, device=d), lambda d: torch.randn(T, B, 10, 10, device=d)),
}


def _polar(*shape, d):
    return torch.polar(torch.rand(*shape, device=d) * 0.5 + 0.5, torch.randn(*shape, device=d))


def _complex(*shape, d):
    return torch.randn(*shape, dtype=torch.complex64, device=d)


def run(repeats: int, device: torch.device) -> list[Row]:
    forms = {
        "loop": lambda a, x: linear_scan(a, x, None, "loop"),
        "scan": lambda a, x: linear_scan(a, x, None, "scan"),
        "step-by-step": linear_scan_loop,
    }
    rows = []
    for shape, (decay, inputs) in SHAPES.items():
        a0, x0 = decay(device), inputs(device)

        def fwd_bwd(form):
            a, x = a0.detach().requires_grad_(), x0.detach().requires_grad_()
            S = form(a, x)
            (torch.view_as_real(S) if S.is_complex() else S).sum().backward()

        med = interleaved_medians({k: (lambda f=f: fwd_bwd(f)) for k, f in forms.items()}, repeats, device)
        rows += [Row("scan", shape, k, "fwd_bwd_ms", v * 1e3, "ms") for k, v in med.items()]
    return rows

"""The FFM paper's efficiency figure ("Training statistics"), for every registered memory, by its protocol (its
appendix "Efficiency Statistic Details"):

- train time: forward and backward passes over one PPO epoch of POPGym, 30 minibatches of 64 episodes of 1024 steps
  (65,536 transitions; the paper prints 65,336), the memory's input 128 wide ("hidden dimension") and its state 256
  ("recurrent dimension"), a trial being one epoch;
- inference latency: autograd off, 1024 steps one at a time (batch 1, the state carried), the mean time of a step;
- memory: the peak memory of a minibatch's forward and backward (constant between trials), beyond what was
  allocated before it: torch's peak on a GPU; on a CPU, where torch keeps no peak, the profiler's count of what each
  operator allocates and frees, summed in order (``common.peak_bytes``).

Trials interleave the models, each trial in a rotated order. GRU, LSTM and Elman run twice where they differ: as
the library gives them (cuDNN on a GPU, oneDNN / MKL kernels on a CPU: ``gru``, ``lstm``, ``elman``) and as the
paper timed them, cells written out in Python in a loop over time (``gru+cells``, ``lstm+cells``, ``elman+cells``:
analysis reads ``<memory>+<tag>`` as a variant of the memory), like the memories written in plain torch. On a CPU
the epoch is cut to ``CPU_EPOCH`` (one minibatch of 8 episodes, 1/240 of the paper's), so that a 2-core machine
finishes in minutes; train time scales with it."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from ..seq_models import build
from ..seq_models.rnn import TorchRNN
from .common import Row, peak_bytes, write_csv


@dataclass(frozen=True)
class Epoch:
    minibatches: int
    episodes: int  # per minibatch
    steps: int = 1024  # episode length, and the inference run's
    input_size: int = 128
    hidden_size: int = 256

    @property
    def shape(self) -> str:  # the CSV's shape column: what one trial is
        return f"{self.minibatches}x[T{self.steps},B{self.episodes}]_in{self.input_size}_h{self.hidden_size}"

    @property
    def fraction(self) -> float:  # of the paper's epoch
        return self.minibatches * self.episodes / (PAPER_EPOCH.minibatches * PAPER_EPOCH.episodes)


PAPER_EPOCH = Epoch(minibatches=30, episodes=64)
CPU_EPOCH = Epoch(minibatches=1, episodes=8)
METRICS = {"train_s": "s", "latency_ms": "ms", "peak_mem_mb": "MB"}


class CellLoop(nn.Module):
    """A registered torch RNN's single layer (GRU, LSTM, Elman) stepped in Python, its gates written out with its
    own weights: the paper's fair comparison, without the library's fused kernels."""

    def __init__(self, model: TorchRNN):
        super().__init__()
        self.rnn = model.rnn
        self.kind = type(self.rnn).__name__  # GRU, LSTM or RNN

    def initial_state(self, batch_size: int, device=None):
        zeros = lambda: torch.zeros(batch_size, self.rnn.hidden_size, device=device)
        return (zeros(), zeros()) if self.kind == "LSTM" else zeros()

    def forward(self, x: torch.Tensor, state=None):
        r = self.rnn
        state = self.initial_state(x.shape[1], x.device) if state is None else state
        gates_in = torch.nn.functional.linear(x, r.weight_ih_l0, r.bias_ih_l0)  # every step's input at once
        ys = []
        for g_in in gates_in:
            if self.kind == "LSTM":
                h, c = state
                i, f, g, o = (g_in + torch.nn.functional.linear(h, r.weight_hh_l0, r.bias_hh_l0)).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                state = (h, c)
            elif self.kind == "GRU":
                h = state
                ir, iz, i_n = g_in.chunk(3, dim=-1)
                hr, hz, hn = torch.nn.functional.linear(h, r.weight_hh_l0, r.bias_hh_l0).chunk(3, dim=-1)
                z = torch.sigmoid(iz + hz)
                h = (1 - z) * torch.tanh(i_n + torch.sigmoid(ir + hr) * hn) + z * h
                state = h
            else:
                h = state = torch.tanh(g_in + torch.nn.functional.linear(state, r.weight_hh_l0, r.bias_hh_l0))
            ys.append(h)
        return torch.stack(ys), state


def variants(names: list[str], epoch: Epoch, device: torch.device) -> dict[str, nn.Module]:
    """The models timed, by row name: each memory of ``names``, and the Python-cell form of those that run
    torch's fused RNN kernel (TorchRNN)."""
    models = {}
    for name in names:
        model = build(name, input_size=epoch.input_size, hidden_size=epoch.hidden_size).to(device)
        models[name] = model
        if isinstance(model, TorchRNN):
            models[f"{name}+cells"] = CellLoop(model)
    return models


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train_seconds(model: nn.Module, x: torch.Tensor, grad: torch.Tensor, minibatches: int, device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(minibatches):  # (the same data each time: the time depends on shapes, not values)
        y, _ = model(x)
        y.backward(grad)
    _sync(device)
    return time.perf_counter() - start


@torch.no_grad()
def _latency_ms(model: nn.Module, xs: torch.Tensor, device) -> float:
    state = model.initial_state(1, device)
    times = []
    for x in xs:
        _sync(device)
        start = time.perf_counter()
        _, state = model(x.view(1, 1, -1), state)
        _sync(device)
        times.append(time.perf_counter() - start)
    return 1e3 * sum(times) / len(times)


def run(names: list[str], trials: int, device: torch.device, epoch: Epoch, csv_path: str | None = None) -> list[Row]:
    """Every row of the benchmark, one per model, metric and trial (memory: one per model); each trial's rows are
    added to ``csv_path`` as it ends (``common.write_csv``: after the rows it held, in whole rows whenever the run is
    stopped), so a run cut short keeps what it measured and what the file held before."""
    models = variants(names, epoch, device)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(epoch.steps, epoch.episodes, epoch.input_size, generator=gen).to(device)
    grad = torch.randn(epoch.steps, epoch.episodes, epoch.hidden_size, generator=gen).to(device)
    xs = torch.randn(epoch.steps, epoch.input_size, generator=gen).to(device)
    rows: list[Row] = []

    def add(new: list[Row]) -> None:
        rows.extend(new)
        if csv_path is not None:
            write_csv(new, csv_path)

    # (closed, so cleared, when a write fails too: the error's line is then a line of its own)
    with tqdm(total=len(models) * (trials + 1), desc="efficiency", unit="model", leave=False) as bar:
        for name, model in models.items():  # untimed warm-up (first-call allocations), and the memory, once
            bar.set_postfix_str(f"{name}: memory")
            mb = peak_bytes(lambda m=model: m(x.detach().requires_grad_())[0].backward(grad), device) / 2**20
            add([Row("efficiency", epoch.shape, name, "peak_mem_mb", mb, METRICS["peak_mem_mb"])])
            _latency_ms(model, xs[:2], device)
            bar.update()
        order = list(models)
        for trial in range(trials):
            random.Random(trial).shuffle(order)  # a new order each trial: drift and warmth hit every model alike
            new = []
            for name in order:
                bar.set_postfix_str(f"trial {trial + 1}/{trials}: {name}")
                model = models[name]
                train_s = _train_seconds(model, x, grad, epoch.minibatches, device)
                new.append(Row("efficiency", epoch.shape, name, "train_s", train_s, METRICS["train_s"]))
                latency = _latency_ms(model, xs, device)
                new.append(Row("efficiency", epoch.shape, name, "latency_ms", latency, METRICS["latency_ms"]))
                bar.update()
            add(new)
    return rows


def summary(rows: list[Row]) -> list[Row]:
    """Each model's mean over its trials, per metric (what the benchmark prints; analysis draws the CIs)."""
    out = []
    for model, metric in dict.fromkeys((r.model, r.metric) for r in rows):
        values = [r.value for r in rows if r.model == model and r.metric == metric]
        out.append(Row("efficiency", rows[0].shape, model, metric, sum(values) / len(values), METRICS[metric]))
    order = list(dict.fromkeys(r.model for r in rows))  # (the memory rows come first, in the registry's order)
    return sorted(out, key=lambda r: (list(METRICS).index(r.metric), order.index(r.model)))

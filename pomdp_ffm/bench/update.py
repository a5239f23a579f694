"""Full-update benchmark: one gradient step (critic, actor, targets, temperature) at the BLT shape.

HopperBLT-V dimensions (obs 6, act 3), batch 64, sampled sequence 64, hidden 128, layers 256x256, for SAC
and TD3 with FFM, GRU and LSTM memories. Reports the median seconds per update (interleaved rounds),
matmul FLOPs per update (torch.utils.flop_counter) and the achieved rate beside this machine's plain
matmul rate at a comparable size.

On CUDA each agent also runs as CUDA-graph replays (``<algo>_<model>+graph``: pomdp_ffm/graph.py, the trainer's
``train.cuda_graph``), from the same weights, with numpy batches as the buffer samples them; the eager and graph
variants are timed in the same interleaved rounds, and ``graph_speedup`` is eager ms / graph ms.

``--seeds 1 5 10 20`` adds the seed axis (pomdp_ffm/seeds.py): for each S, S SAC+FFM agents updated as S separate
runners in turn (each its own graph on CUDA: what S separate runs cost on one GPU) against one runner that
updates the S agents together (``UpdateRunner.update_all``: on CUDA one graph with a branch per seed, on a CPU
the same updates in turn), and on CUDA with TF32 matmuls (captured with TF32 on). Reported as seed-updates/s and
the ratio to the separate runners, with the operators a round dispatches outside the optimisers' steps
(``ops_per_round``, counted on an eager round: on a GPU each is a kernel launch, which bounds an update of this
size). The optimisers are left out of the count as they run per tensor on a CPU and as multi-tensor calls on
CUDA.
"""
from __future__ import annotations

import contextlib
import copy

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from ..agent import RecurrentAgent
from ..buffer import Batch
from ..config import PolicyConfig
from ..graph import WARMUP_UPDATES, UpdateRunner
from .common import DispatchedOps, Row, interleaved_medians

OBS, ACT, BATCH, SEQ = 6, 3, 64, 64
SHAPE = f"HopperBLT-V_B{BATCH}_T{SEQ}_h128"


def random_batch(rng: np.random.Generator) -> Batch:
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    return Batch(observs=f(SEQ, BATCH, OBS), actions=np.tanh(f(SEQ, BATCH, ACT)), rewards=f(SEQ, BATCH, 1),
                 terminals=np.zeros((SEQ, BATCH, 1), np.float32), next_observs=f(SEQ, BATCH, OBS),
                 masks=np.ones((SEQ, BATCH, 1), np.float32))


def matmul_gflops(device: torch.device, repeats: int = 20) -> float:
    """Plain fp32 matmul rate at the update's typical size: [B*(T+1), 256] @ [256, 256]."""
    a = torch.randn(BATCH * (SEQ + 1), 256, device=device)
    w = torch.randn(256, 256, device=device)
    med = interleaved_medians({"mm": lambda: a @ w}, repeats, device, inner=10)["mm"]
    return 2 * a.shape[0] * 256 * 256 / med / 1e9


def run(repeats: int, device: torch.device) -> list[Row]:
    rng = np.random.default_rng(0)
    batches = [random_batch(rng) for _ in range(4)]
    agents = {}
    for algo in ("sac", "td3"):
        for model in ("ffm", "gru", "lstm"):
            torch.manual_seed(0)
            agents[f"{algo}_{model}"] = RecurrentAgent(OBS, ACT, PolicyConfig(seq_model=model, algo_name=algo)).to(device)
    rows: list[Row] = []
    for name, agent in agents.items():
        # Counted on a CPU copy: on CUDA, nn.GRU/nn.LSTM run as one cuDNN op that the counter has no
        # formula for, so their recurrent matmuls would silently drop out of the total.
        with FlopCounterMode(display=False) as counter:
            copy.deepcopy(agent).cpu().update(batches[0])
        rows.append(Row("update", SHAPE, name, "gflop", counter.get_total_flops() / 1e9, "GFLOP"))
    updates = {k: agent.update for k, agent in agents.items()}
    if device.type == "cuda":
        for k in list(agents):
            runner = UpdateRunner(copy.deepcopy(agents[k]), cuda_graph=True)
            for i in range(runner.warmup + 2):  # eager warm-up, the capture and a first replay
                runner(batches[i % len(batches)])
            assert runner.replays > 0 and runner.captured_paths == {(False, True)}, k
            updates[f"{k}+graph"] = runner
    counter_i = {k: 0 for k in updates}

    def step(k):
        updates[k](batches[counter_i[k] % len(batches)])
        counter_i[k] += 1

    med = interleaved_medians({k: (lambda k=k: step(k)) for k in updates}, repeats, device, warmup=3)
    flops = {r.model: r.value for r in rows}
    for k, v in med.items():
        rows.append(Row("update", SHAPE, k, "update_ms", v * 1e3, "ms"))
        rows.append(Row("update", SHAPE, k, "updates_per_s", 1.0 / v, "1/s"))
        rows.append(Row("update", SHAPE, k, "achieved_gflop_s", flops[k.removesuffix("+graph")] / v, "GFLOP/s"))
    for k in agents:
        if f"{k}+graph" in med:
            rows.append(Row("update", SHAPE, k, "graph_speedup", med[k] / med[f"{k}+graph"], "x"))
    rows.append(Row("update", "matmul_4160x256x256", "torch", "matmul_gflop_s", matmul_gflops(device), "GFLOP/s"))
    return rows



def run_seeds(seed_counts: list[int], repeats: int, device: torch.device, model: str = "ffm") -> list[Row]:
    """Seed-updates/s of S agents updated separately (in turn) and together (one runner), for each S."""
    rng = np.random.default_rng(0)
    batches = [random_batch(rng) for _ in range(4)]
    graph = device.type == "cuda"
    rows: list[Row] = []
    for S in seed_counts:
        def agents():
            out = []
            for k in range(S):
                torch.manual_seed(k)
                out.append(RecurrentAgent(OBS, ACT, PolicyConfig(seq_model=model, algo_name="sac")).to(device))
            return out

        separate = [UpdateRunner(a, cuda_graph=graph) for a in agents()]
        kinds = ["together", "together+tf32"] if graph else ["together"]
        joint = {k: UpdateRunner(agents(), cuda_graph=graph) for k in kinds}
        variants = {"separate": lambda i: [r(batches[(i + k) % 4]) for k, r in enumerate(separate)]}
        variants.update({name: (lambda i, r=r: r.update_all([batches[(i + k) % 4] for k in range(S)]))
                         for name, r in joint.items()})
        calls = {k: 0 for k in variants}

        def step(k):
            variants[k](calls[k])
            calls[k] += 1

        # Warm up every runner to its replays; the TF32 runner captures with TF32 matmuls on.
        for k in variants:
            with _tf32(k.endswith("+tf32")):
                for _ in range(WARMUP_UPDATES + 2):
                    step(k)
        med = interleaved_medians({k: (lambda k=k: step(k)) for k in variants}, repeats, device, warmup=1)
        shape = f"{SHAPE}_sac_{model}_S{S}"
        for k, v in med.items():
            rows.append(Row("seed-axis", shape, k, "round_ms", v * 1e3, "ms"))
            rows.append(Row("seed-axis", shape, k, "seed_updates_per_s", S / v, "1/s"))
        rows.append(Row("seed-axis", shape, "separate", "ops_per_round", ops_per_round(agents(), batches[:1] * S),
                        "ops"))
        del separate, joint, variants
        if graph:
            torch.cuda.empty_cache()
    return rows


def ops_per_round(agents: list[RecurrentAgent], batches: list) -> int:
    """The operators one eager round of these agents' updates dispatches outside the optimisers' steps (a graph
    replay dispatches none)."""
    runner = UpdateRunner(agents, cuda_graph=False)
    runner.update_all(batches)  # the optimisers' state is made at a first step
    with DispatchedOps(optimisers=False) as counted:
        runner.update_all(batches)
    return counted.total


@contextlib.contextmanager
def _tf32(on: bool):
    """TF32 matmuls on (PyTorch's default, and the reference's, is off) for what runs inside; cuDNN keeps its own
    default."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = saved or on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved

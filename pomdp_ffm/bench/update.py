"""Full-update benchmark: one gradient step (critic, actor, targets, temperature) at the BLT shape.

HopperBLT-V dimensions (obs 6, act 3), batch 64, sampled sequence 64, hidden 128, layers 256x256, for SAC
and TD3 with FFM, GRU and LSTM memories. Reports the median seconds per update (interleaved rounds),
matmul FLOPs per update (torch.utils.flop_counter) and the achieved rate beside this machine's plain
matmul rate at a comparable size.

On CUDA each agent also runs as CUDA-graph replays (``<algo>_<model>+graph``: pomdp_ffm/cuda_graph.py, the trainer's
``train.cuda_graph``), from the same weights, with numpy batches as the buffer samples them; the eager and graph
variants are timed in the same interleaved rounds, and ``graph_speedup`` is eager ms / graph ms.

``--seeds 1 5 10 20`` adds the seed axis (pomdp_ffm/jobs/seeds.py): for each S, S SAC+FFM agents updated as S separate
runners in turn (each its own graph on CUDA: what S separate runs cost on one GPU) against one runner that
updates the S agents together (``UpdateRunner.update_all``: on CUDA one graph with a branch per seed, on a CPU
the same updates in turn), and on CUDA with TF32 matmuls (captured with TF32 on). Reported as seed-updates/s and
the ratio to the separate runners, with the operators a round dispatches outside the optimisers' steps
(``ops_per_round``, counted on an eager round: on a GPU each is a kernel launch, which bounds an update of this
size). The optimisers are left out of the count as they run per tensor on a CPU and as multi-tensor calls on
CUDA.

``--compile``: eager against torch.compile (``run_compiled``). docs/benchmarks.md has the measurements ("One full
update", "Several seeds in one process").
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from .. import seq_models
from ..agent import RecurrentAgent
from ..buffer import Batch
from ..catalog import BASELINES, CHALLENGER, COMPARED
from ..config import FFMConfig, PolicyConfig
from ..cuda_graph import WARMUP_UPDATES, CaptureError, UpdateRunner
from ..optim import AdamForm
from .common import DispatchedOps, Row, interleaved_medians

OBS, ACT, BATCH, SEQ = 6, 3, 64, 64
SHAPE = f"HopperBLT-V_B{BATCH}_T{SEQ}_h128"


def make_agent(
    model: str, algo: str, seed: int, device: torch.device, graph: bool = False, compiled: bool = False, **policy
) -> RecurrentAgent:
    """The benchmark's agent, its Adam in the form a runner with ``graph`` and ``compiled`` steps."""
    torch.manual_seed(seed)
    cfg = PolicyConfig(seq_model=model, algo_name=algo, **policy)
    return RecurrentAgent(OBS, ACT, cfg, AdamForm.for_update(compiled, graph, device)).to(device)


def random_batch(rng: np.random.Generator) -> Batch:
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    return Batch(
        observs=f(SEQ, BATCH, OBS),
        actions=np.tanh(f(SEQ, BATCH, ACT)),
        rewards=f(SEQ, BATCH, 1),
        terminals=np.zeros((SEQ, BATCH, 1), np.float32),
        next_observs=f(SEQ, BATCH, OBS),
        masks=np.ones((SEQ, BATCH, 1), np.float32),
        first_step=np.zeros(BATCH, np.int64),
    )


def _counted(fns: dict[str, Callable[[int], object]]) -> dict[str, Callable[[], object]]:
    """Each function, called with the number of its earlier calls (which picks its batches)."""
    counted = {}
    for k, fn in fns.items():
        calls = itertools.count()
        counted[k] = lambda fn=fn, calls=calls: fn(next(calls))
    return counted


def run(repeats: int, device: torch.device) -> list[Row]:
    rng = np.random.default_rng(0)
    batches = [random_batch(rng) for _ in range(4)]
    agents = {f"{algo}_{model}": make_agent(model, algo, 0, device) for algo in ("sac", "td3") for model in COMPARED}
    flops = {}
    for name, agent in agents.items():
        # Counted on a CPU copy: on CUDA, nn.GRU/nn.LSTM run as one cuDNN op that the counter has no
        # formula for, so their recurrent matmuls would silently drop out of the total.
        with FlopCounterMode(display=False) as counter:
            UpdateRunner(copy.deepcopy(agent).cpu(), cuda_graph=False)(batches[0])
        flops[name] = counter.get_total_flops() / 1e9
    row = functools.partial(Row, "update", SHAPE)
    rows = [row(k, "gflop", v, "GFLOP") for k, v in flops.items()]
    updates = {k: UpdateRunner(agent, cuda_graph=False) for k, agent in agents.items()}
    if device.type == "cuda":
        for k in agents:
            algo, model = k.split("_")
            runner = UpdateRunner(make_agent(model, algo, 0, device, graph=True), cuda_graph=True)
            for i in range(runner.warmup + 2):  # eager warm-up, the capture and a first replay
                runner(batches[i % len(batches)])
            assert runner.replays > 0 and runner.captured_paths == {(False, True)}, k
            updates[f"{k}+graph"] = runner
    fns = _counted({k: (lambda i, u=u: u(batches[i % len(batches)])) for k, u in updates.items()})
    med = interleaved_medians(fns, repeats, device, warmup=3)
    for k, v in med.items():
        rows += [
            row(k, "update_ms", v * 1e3, "ms"),
            row(k, "updates_per_s", 1.0 / v, "1/s"),
            row(k, "achieved_gflop_s", flops[k.removesuffix("+graph")] / v, "GFLOP/s"),
        ]
    rows += [row(k, "graph_speedup", med[k] / med[f"{k}+graph"], "x") for k in agents if f"{k}+graph" in med]
    # A plain fp32 matmul's rate at the update's typical size: [B*(T+1), 256] @ [256, 256].
    a = torch.randn(BATCH * (SEQ + 1), 256, device=device)
    w = torch.randn(256, 256, device=device)
    mm = interleaved_medians({"mm": lambda: a @ w}, 20, device, inner=10)["mm"]
    matmul_gflop_s = 2 * a.shape[0] * 256**2 / mm / 1e9
    return rows + [Row("update", "matmul_4160x256x256", "torch", "matmul_gflop_s", matmul_gflop_s, "GFLOP/s")]


def run_seeds(seed_counts: list[int], repeats: int, device: torch.device, model: str = CHALLENGER) -> list[Row]:
    """Seed-updates/s of S agents updated separately (in turn) and together (one runner), for each S."""
    rng = np.random.default_rng(0)
    graph = device.type == "cuda"
    rows = []
    batches = [random_batch(rng) for _ in range(4)]
    for S in seed_counts:
        agents = lambda graph=graph: [make_agent(model, "sac", k, device, graph) for k in range(S)]
        separate = [UpdateRunner(a, cuda_graph=graph) for a in agents()]
        kinds = ["together", "together+tf32"] if graph else ["together"]
        joint = {k: UpdateRunner(agents(), cuda_graph=graph) for k in kinds}
        variants = {"separate": lambda i, rs=separate: [r(batches[(i + k) % 4]) for k, r in enumerate(rs)]}
        for name, r in joint.items():
            variants[name] = lambda i, r=r: r.update_all([batches[(i + k) % 4] for k in range(S)])
        fns = _counted(variants)
        # Each warmed up to its replays; the TF32 runner captures with TF32 matmuls on (PyTorch's default, and the
        # reference's, is off; cuDNN keeps its own default).
        saved = torch.backends.cuda.matmul.allow_tf32
        for k, fn in fns.items():
            torch.backends.cuda.matmul.allow_tf32 = saved or k.endswith("+tf32")
            for _ in range(WARMUP_UPDATES + 2):
                fn()
        torch.backends.cuda.matmul.allow_tf32 = saved
        med = interleaved_medians(fns, repeats, device, warmup=1)
        shape = f"{SHAPE}_sac_{model}_S{S}"
        for k, v in med.items():
            rows.append(Row("seed-axis", shape, k, "round_ms", v * 1e3, "ms"))
            rows.append(Row("seed-axis", shape, k, "seed_updates_per_s", S / v, "1/s"))
        # What an eager round dispatches outside the optimisers' steps (a replay dispatches none), after a first
        # round has made the optimisers' state.
        runner = UpdateRunner(agents(False), cuda_graph=False)
        runner.update_all(batches[:1] * S)
        with DispatchedOps(optimisers=False) as counted:
            runner.update_all(batches[:1] * S)
        rows.append(Row("seed-axis", shape, "separate", "ops_per_round", counted.total, "ops"))
        del separate, joint, variants, fns, runner
        if graph:
            torch.cuda.empty_cache()
    return rows


def _kernel_count(fn: Callable[[], object], device: torch.device) -> tuple[str, int]:
    """(metric, count) for one call: on CUDA every device kernel the profiler sees (cuBLAS, cuDNN, Triton, torch's);
    on a CPU the operators run outside inductor's kernels and outside the optimisers' steps that would launch a
    kernel on a GPU (each ``aten::`` event with no ``aten::`` event above it, views left out). A CPU runs Adam per
    tensor where CUDA runs multi-tensor or fused kernels, so only the rest counts alike on both."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize(device)
    if cuda:
        return "kernels_per_update", sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)

    def launches(e) -> bool:
        if not e.name.startswith("aten::"):
            return False
        parent = e.cpu_parent
        while parent is not None:
            if parent.name.startswith(("aten::", "Optimizer.step")):
                return False
            parent = parent.cpu_parent
        packet = getattr(torch.ops.aten, e.name.removeprefix("aten::"), None)
        return packet is None or not any(getattr(packet, o).is_view for o in packet.overloads())

    return "ops_outside_steps", sum(map(launches, prof.events()))


def run_compiled(repeats: int, device: torch.device, seed_counts: list[int] | None = None) -> list[Row]:
    """``bench update --compile``: SAC/TD3 x FFM/GRU updated eagerly and, for FFM, through torch.compile
    (``+compile``), on CUDA each also as graph replays (``+graph``; ``+compile-scan``: compiled with the doubling
    scan instead of the associative one; ``+assoc``: uncompiled with the associative one, the other half of whether
    one form could serve both). GRU runs cuDNN's kernel: compiled, dynamo unrolls it step by step (241 s
    to compile a TD3+GRU update on a 2-vCPU VM), so it is not a variant here. Also: compile time cold (an empty
    inductor cache) and warm (the on-disk cache a resumed run finds), kernels per update (``_kernel_count``), and
    with ``seed_counts`` a SAC+FFM round of S seeds in one graph. On a CPU also ``+compile-assoc``: the form a
    compiled update takes on CUDA (FFM's associative scan in real arithmetic) through inductor's generic scan,
    minutes to compile; what it leaves outside inductor is what a GPU launches besides inductor's kernels. A
    variant that fails to compile or to capture is reported and skipped."""
    import time

    import torch._dynamo
    from torch._inductor import metrics as inductor_metrics

    from ..compiling import CompileError

    rng = np.random.default_rng(0)
    cuda = device.type == "cuda"
    batches = [random_batch(rng) for _ in range(4)]
    rows = []
    updates = {}
    # (suffix, compiled, graph, FFM's aggregator)
    variants = [("", False, False, "auto"), ("+compile", True, False, "auto")]
    if not cuda:  # the form a compiled update takes on CUDA (FFM's scan in real arithmetic), compiled here
        variants += [("+compile-assoc", True, False, "assoc")]
    else:
        variants += [
            ("+graph", False, True, "auto"),
            ("+assoc+graph", False, True, "assoc"),
            ("+compile+graph", True, True, "auto"),
            ("+compile-scan+graph", True, True, "scan"),
        ]
    for algo, model in itertools.product(("sac", "td3"), (CHALLENGER, BASELINES[0])):
        name, memory = f"{algo}_{model}", seq_models.get(model)
        for suffix, compiled, graph, aggregator in variants:
            if compiled and not memory.compile_pays:
                continue
            # A form of FFM's aggregator: FFM's alone, and with graphs SAC's alone.
            if aggregator != "auto" and (memory is not seq_models.FFM or (graph and algo != "sac")):
                continue
            agent = make_agent(model, algo, 0, device, graph, compiled, ffm=FFMConfig(aggregator=aggregator))
            runner = UpdateRunner(agent, cuda_graph=graph, compile=compiled)
            try:
                if compiled and not graph:  # the first compiled variant of this architecture: time its compile
                    before = inductor_metrics.generated_kernel_count
                    for label in ("compile_cold_s", "compile_warm_s"):
                        torch._dynamo.reset()  # warm: dynamo traces again, inductor reads its on-disk cache
                        t0 = time.perf_counter()
                        runner(batches[0])
                        if cuda:
                            torch.cuda.synchronize(device)
                        rows.append(Row("update-compile", SHAPE, name + suffix, label, time.perf_counter() - t0, "s"))
                        if label == "compile_cold_s":  # what the cold compile generated
                            generated = inductor_metrics.generated_kernel_count - before
                    rows.append(Row("update-compile", SHAPE, name + suffix, "generated_kernels", generated, "kernels"))
                for i in range(runner.warmup + 2):  # compiled, captured and replayed once where it applies
                    runner(batches[i % len(batches)])
            except (CompileError, CaptureError) as e:  # reported; the other variants go on
                print(f"{name}{suffix}: {e}", flush=True)
                continue
            if not graph:
                metric, kernels = _kernel_count(lambda r=runner: r(batches[0]), device)
                unit = "kernels" if cuda else "ops"
                rows.append(Row("update-compile", SHAPE, name + suffix, metric, kernels, unit))
            updates[name + suffix] = runner
    fns = _counted({k: (lambda i, u=u: u(batches[i % len(batches)])) for k, u in updates.items()})
    med = interleaved_medians(fns, repeats, device, warmup=2)
    rows += [Row("update-compile", SHAPE, k, "update_ms", v * 1e3, "ms") for k, v in med.items()]
    for S in seed_counts or []:
        runners = {
            f"together{suffix}": UpdateRunner(
                [make_agent("ffm", "sac", k, device, cuda, compiled) for k in range(S)],
                cuda_graph=cuda,
                compile=compiled,
            )
            for suffix, compiled in (("", False), ("+compile", True))
        }
        fns = _counted(
            {k: (lambda i, r=r: r.update_all([batches[(i + j) % 4] for j in range(S)])) for k, r in runners.items()}
        )
        for fn in fns.values():
            for _ in range(WARMUP_UPDATES + 2):
                fn()
        med = interleaved_medians(fns, repeats, device, warmup=1)
        for k, v in med.items():
            rows += [
                Row("update-compile", f"{SHAPE}_sac_ffm_S{S}", k, "round_ms", v * 1e3, "ms"),
                Row("update-compile", f"{SHAPE}_sac_ffm_S{S}", k, "ms_per_seed_update", v * 1e3 / S, "ms"),
            ]
    return rows

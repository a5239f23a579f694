"""``train.compile``: the one update through torch.compile (pomdp_ffm/update.py, patches/020-compiled-update.md).
Compiled against eager on a CPU: the same losses and parameters after SAC and TD3 updates to a float32 tolerance,
no graph break, a seed axis compiled equal to its seeds compiled alone, a compile failure as one line naming the
switch. In a run: compiled before the first episode without changing what the run computes, a stop meanwhile taken
right after, a failure as one line naming the switch and the log, a cache of its own, a switch on resume said.
Compiling takes tens of seconds (minutes for an unrolled GRU or LSTM), so the tests that run inductor are slow; the
others stand the eager functions in for the compiled ones. tests/test_cuda.py runs the compiled path on a GPU at the
paper's shape."""

import copy
from pathlib import Path

import pandas as pd
import pytest
import torch
from marks import parametrize_first_fast
from test_agent import make_agent, make_batch

from pomdp_ffm.catalog import COMPARED
from pomdp_ffm.compiling import CompileError
from pomdp_ffm.cuda_graph import UpdateRunner
from pomdp_ffm.optim import AdamForm
from pomdp_ffm.seq_models.recurrence import AGGREGATE
from pomdp_ffm.update import EAGER, Aligned, compiled_losses

FUSED = AdamForm(fused=True)  # the form a compiled update's agents are built in (trainer.Trainer)

# Measured on this suite's small agents (5 updates): losses agree to 2e-6 relative, parameters to 1e-4 absolute
# (Adam's scale-free step turns a last-bit difference in a near-zero gradient into up to lr = 3e-4 per step).
LOSS_RTOL, PARAM_ATOL = 1e-5, 5 * 3e-4


def updates(runner, agent, n=5):
    torch.manual_seed(11)
    stats = [{k: float(v) for k, v in runner(make_batch(i % 3)).items()} for i in range(n)]
    return stats, {k: v.detach().clone() for k, v in agent.state_dict().items()}


def assert_close_updates(out, ref):
    (stats, params), (ref_stats, ref_params) = out, ref
    for st, rs in zip(stats, ref_stats):
        assert st.keys() == rs.keys()
        for k in rs:
            assert st[k] == pytest.approx(rs[k], rel=LOSS_RTOL, abs=1e-6), (k, st[k], rs[k])
    for k, v in ref_params.items():
        torch.testing.assert_close(params[k], v, rtol=0, atol=PARAM_ATOL, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("model", COMPARED)
def test_compiled_updates_equal_the_eager_updates(algo, model):
    eager, compiled = make_agent(algo, model), make_agent(algo, model, adam=FUSED)
    ref = updates(UpdateRunner(eager, cuda_graph=False), eager)
    out = updates(UpdateRunner(compiled, cuda_graph=False, compile=True), compiled)
    assert_close_updates(out, ref)


@pytest.mark.slow
def test_a_compiled_update_in_real_arithmetic_equals_the_eager_update():
    # The form a compiled update takes on CUDA (FFM's associative scan on (re, im) pairs, fused Adam), here on a
    # CPU through inductor's generic scan (minutes to compile), against the eager update with the complex loop.
    from pomdp_ffm.config import FFMConfig

    eager, compiled = make_agent("sac", "ffm"), make_agent("sac", "ffm", adam=FUSED, ffm=FFMConfig(aggregator="assoc"))
    ref = updates(UpdateRunner(eager, cuda_graph=False), eager)
    out = updates(UpdateRunner(compiled, cuda_graph=False, compile=True), compiled)
    assert_close_updates(out, ref)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_each_compiled_part_is_one_graph(algo):
    # fullgraph=True makes a graph break an error; explain() also counts graphs and breaks, independently of it.
    agent = make_agent(algo, "ffm")
    s = Aligned.from_batch(make_batch(), "cpu")
    policy_out = agent.actor.over(s)[0] if agent.algo.shares_actor_pass else None
    for fn, args in (
        (EAGER.actor_pass, (agent, s)),
        (EAGER.critic_loss, (agent, s, policy_out)),
        (EAGER.actor_loss, (agent, s, policy_out)),
    ):
        report = torch._dynamo.explain(fn)(*args)
        assert (report.graph_count, report.graph_break_count) == (1, 0), (fn.__name__, report.break_reasons)
    assert compiled_losses() is compiled_losses()  # built once per process


@pytest.mark.slow
def test_a_seed_axis_compiled_equals_its_seeds_compiled_alone():
    agents = [make_agent("sac", "ffm", seed=k, adam=FUSED) for k in range(2)]
    alone = [copy.deepcopy(a) for a in agents]
    joint = UpdateRunner(agents, cuda_graph=False, compile=True)
    torch.manual_seed(3)
    together = [joint.update_all([make_batch(i), make_batch(i + 1)]) for i in range(3)]
    runners = [UpdateRunner(a, cuda_graph=False, compile=True) for a in alone]
    torch.manual_seed(3)
    turns = [[r(make_batch(i + k)) for k, r in enumerate(runners)] for i in range(3)]
    for st_joint, st_turns in zip(together, turns):
        for a, b in zip(st_joint, st_turns):
            assert {k: float(v) for k, v in a.items()} == {k: float(v) for k, v in b.items()}
    for a, b in zip(agents, alone):
        for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(x, y), k


@pytest.mark.slow
def test_a_warm_up_compiles_all_that_the_updates_run_and_changes_nothing(monkeypatch):
    # Inductor as train.compile runs it, in a fresh cache, its code generations counted: the warm-up makes them all
    # (TD3: two graphs, each forward and backward, the backward compiled at its first call), the updates none. The
    # agent, its optimisers and torch's generator (fallback_random draws from it) are as they were, and the updates
    # are those of a runner whose first update compiled, as before the warm-up.
    import numpy as np
    from torch._inductor import compile_fx
    from torch._inductor.utils import fresh_cache

    made, real = [], compile_fx.fx_codegen_and_compile
    monkeypatch.setattr(compile_fx, "fx_codegen_and_compile", lambda *a, **kw: made.append(1) or real(*a, **kw))
    agent = make_agent("td3", "ffm", adam=FUSED)
    lazy, before = copy.deepcopy(agent), copy.deepcopy(agent.state_dict())
    torch._dynamo.reset()
    with fresh_cache():
        runner = UpdateRunner(agent, cuda_graph=False, compile=True)
        torch.manual_seed(3)
        rng = torch.get_rng_state()
        assert runner.warm_up(type(make_batch())(*(np.zeros_like(x) for x in make_batch())))
        assert len(made) == 4
        assert torch.equal(torch.get_rng_state(), rng)
        assert agent.num_updates == 0 and not any(o.state for o in agent.optimizers().values())
        assert all(torch.equal(v, before[k]) for k, v in agent.state_dict().items())
        out = updates(runner, agent)
        assert len(made) == 4  # nothing compiled once the run acts
        torch._dynamo.reset()
        ref = updates(UpdateRunner(lazy, cuda_graph=False, compile=True), lazy)
    assert out[0] == ref[0]
    assert all(torch.equal(v, ref[1][k]) for k, v in out[1].items())


def test_a_failed_compile_is_one_line_naming_the_switch(monkeypatch):
    from pomdp_ffm import update as update_mod

    def breaks(agent, s, policy_out=None):
        print("a print is a graph break")  # (dynamo cannot put a print in a graph: under fullgraph, an error)
        return agent.critic(s.head(s.masks.shape[0]), s.actions[1:])

    monkeypatch.setattr(
        update_mod,
        "compiled_losses",
        lambda: update_mod.Losses(*(torch.compile(breaks, fullgraph=True, backend="eager") for _ in range(3))),
    )
    agent = make_agent("sac", "ffm", adam=FUSED)
    before = copy.deepcopy(agent.state_dict())
    with pytest.raises(CompileError) as e:
        UpdateRunner(agent, cuda_graph=False, compile=True)(make_batch())
    assert len(str(e.value).splitlines()) == 1 and "train.compile=false" in str(e.value)
    assert all(torch.equal(v, before[k]) for k, v in agent.state_dict().items())  # no step was taken
    assert agent.num_updates == 0


def test_the_associative_scan_equals_the_loop():
    # The recurrence as an associative scan over (gamma, u) pairs (the compiled CUDA path) against the chunked loop,
    # in float64 (torch's generic scan on a CPU: the same combine function inductor lowers on a GPU), forward and
    # backward (whose adjoint is the reverse scan).
    torch.manual_seed(0)
    T, B, m, c = 65, 3, 8, 4
    u = torch.randn(T, B, m, dtype=torch.float64, requires_grad=True)
    gamma = torch.polar(
        torch.exp(-torch.rand(m, 1, dtype=torch.float64) * 0.7).expand(m, c),
        torch.rand(1, c, dtype=torch.float64).expand(m, c) * 6,
    ).requires_grad_()
    s0 = torch.randn(B, m, c, dtype=torch.complex128, requires_grad=True)
    w = torch.randn(T, B, m, c, dtype=torch.complex128)
    results = []
    for method in ("loop", "assoc"):
        S = AGGREGATE[method](u, gamma, s0)
        torch.view_as_real(S * w).sum().backward()
        results.append([S.detach(), u.grad, gamma.grad, s0.grad])
        u.grad = gamma.grad = s0.grad = None
    for name, a, b in zip(("S", "grad u", "grad gamma", "grad s0"), *results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


def _ffm_pass(ffm, x, state):
    """Output, last state and every gradient of a loss over both."""
    ffm.zero_grad(set_to_none=True)
    y, last = ffm(x, state)
    (y.square().sum() + torch.view_as_real(last).sum()).backward()
    return [y.detach(), last.detach(), *(p.grad for p in ffm.parameters())]


@pytest.mark.parametrize("with_state", [False, True])
def test_ffm_in_real_arithmetic_equals_its_complex_loop(with_state):
    # aggregator="assoc" (the compiled CUDA path) runs FFM's recurrence on (re, im) pairs, gamma and state included,
    # with the adjoint written out in real arithmetic; the loop runs it in complex numbers. float64 throughout.
    from pomdp_ffm.seq_models import FFM

    torch.manual_seed(0)
    T, B = 33, 3
    x = torch.randn(T, B, 5, dtype=torch.float64)
    ffms = {}
    for method in ("loop", "assoc"):
        torch.manual_seed(1)
        ffms[method] = FFM(5, 64, aggregator=method).double().bounded_by_owner()
    m, c = ffms["loop"].memory_size, ffms["loop"].context_size
    state = torch.randn(B, m, c, dtype=torch.complex128) if with_state else None
    out, ref = (_ffm_pass(ffms[m], x, state) for m in ("assoc", "loop"))
    for name, a, b in zip(["y", "last state", *(n for n, _ in ffms["loop"].named_parameters())], out, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.slow
def test_no_complex_operator_reaches_the_compiler():
    # Inductor leaves complex operators to eager kernels, each a launch of its own on a GPU; in the compiled path
    # (aggregator "assoc") FFM's training pass, forward and backward, is real arithmetic from input to loss.
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    from pomdp_ffm.seq_models import FFM

    def complex_nodes(aggregator):
        graphs = []

        def keep(gm, _):
            graphs.append(gm)
            return make_boxed_func(gm.forward)

        def backend(gm, inputs):
            return aot_module_simplified(gm, inputs, fw_compiler=keep, bw_compiler=keep)

        torch._dynamo.reset()
        ffm = FFM(5, 64, aggregator=aggregator).bounded_by_owner()
        loss = torch.compile(lambda x: ffm(x)[0].square().sum(), backend=backend, fullgraph=True)
        loss(torch.randn(9, 2, 5)).backward()
        assert len(graphs) == 2  # forward, backward
        vals = [n.meta.get("val") for g in graphs for n in g.graph.nodes]
        return sum(torch.is_tensor(v) and v.is_complex() for v in vals)

    assert complex_nodes("loop") > 0  # (what the check sees where the recurrence is complex)
    assert complex_nodes("assoc") == 0


@pytest.mark.slow
def test_ffm_in_real_arithmetic_compiled_equals_the_eager_loop():
    # Through inductor (on a CPU its generic scan; on CUDA one Triton kernel a direction) against the eager complex
    # loop, float32: output, last state and gradients to the measured 1e-6 relative, with room.
    from pomdp_ffm.seq_models import FFM

    torch.manual_seed(0)
    x = torch.randn(16, 4, 5)
    ffms = {}
    for method in ("loop", "assoc"):
        torch.manual_seed(1)
        ffms[method] = FFM(5, 64, aggregator=method).bounded_by_owner()
    compiled = torch.compile(_ffm_pass)  # (backward() is a graph break: the pass is compiled around it)
    out, ref = compiled(ffms["assoc"], x, None), _ffm_pass(ffms["loop"], x, None)
    for name, a, b in zip(["y", "last state", *(n for n, _ in ffms["loop"].named_parameters())], out, ref):
        err = ((a - b).abs().max() / b.abs().max()).item()
        print(f"{name}: {err:.1e}")
        assert err < 1e-5, name


# --- train.compile in a run: compiled before it acts, a failure in one line, a cache of its own ----------------------
RUN = ("algo=td3", "seq_model=ffm", "device=cpu", "train.compile=true")


def inductor_cache_in(monkeypatch, folder: Path) -> None:
    """The user's inductor cache in ``folder`` (the runs' own under it), and inductor's settings that a run's start
    changes (compiling.use_run_cache) put back after the test."""
    from torch._inductor import codecache

    monkeypatch.setattr(codecache, "_HEADER_DIR", codecache._HEADER_DIR)
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", codecache._HEADER_LOCK_DIR)
    monkeypatch.setenv("TRITON_CACHE_DIR", "unused")
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder))


def eager_as_compiled(monkeypatch, calls: list, tmp_path: Path) -> None:
    """update.compiled_losses as the eager functions (a compile costs minutes on a CPU), each call listed with the
    update count of the agent it updates: what is checked is where and on what the run compiles, not inductor."""
    from pomdp_ffm import update as update_mod

    inductor_cache_in(monkeypatch, tmp_path / "inductor")

    def listed(fn):
        def call(agent, *args):
            calls.append(("compiled", agent.num_updates))
            return fn(agent, *args)

        return call

    monkeypatch.setattr(update_mod, "compiled_losses", lambda: update_mod.Losses(*map(listed, update_mod.EAGER)))


def episodes_listed(calls: list, base=None):
    """A Trainer whose episodes are listed in ``calls`` as they start."""
    from pomdp_ffm.trainer import Trainer

    class Listed(base or Trainer):
        def _next_episode(self):
            rollout = super()._next_episode()
            if rollout is not None:
                calls.append(("episode", self.standing.env_steps))
            return rollout

    return Listed


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_the_update_compiles_before_the_first_episode_and_the_run_is_the_lazily_compiled_one(
    composed, tmp_path, monkeypatch, algo
):
    # The warm-up (cuda_graph.UpdateRunner.warm_up) runs every compiled function once, on a throwaway copy of the agent,
    # before the run's first episode; it takes no step of the run's agent and draws nothing from its generators
    # (SAC's actor pass and TD3's target noise draw from torch's), so the run is the one whose first update compiled.
    from test_trainer import read, train

    from pomdp_ffm.metrics import TIMING as TIME_COLUMNS

    calls = []
    eager_as_compiled(monkeypatch, calls, tmp_path)
    overrides = (*RUN, f"algo={algo}")
    train(composed(*overrides), tmp_path / "warm", episodes_listed(calls))
    first_episode = calls.index(("episode", 0))
    warm_up = 3 if algo == "sac" else 2  # (SAC: the shared actor pass too)
    assert calls[:first_episode] == [("compiled", 0)] * warm_up
    log = (tmp_path / "warm" / "experiment.log").read_text()
    assert "train.compile: compiling the update before the first episode" in log and "compiled in" in log

    class Lazily(episodes_listed(calls)):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.updater.warm_up = lambda batch: True  # as before the warm-up: the first update compiles

    calls.clear()
    train(composed(*overrides), tmp_path / "lazy", Lazily)
    assert calls[0] == ("episode", 0)
    pd.testing.assert_frame_equal(
        read(tmp_path / "warm").drop(columns=TIME_COLUMNS),
        read(tmp_path / "lazy").drop(columns=TIME_COLUMNS),
        check_exact=True,
    )


@pytest.mark.slow
def test_a_stop_while_the_update_compiles_is_taken_before_the_first_episode_and_resumes_exactly(
    composed, tmp_path, monkeypatch
):
    # Nothing interrupts inductor: a stop signal that comes while it compiles is taken as soon as it is done, before
    # any episode, with a checkpoint that the resumed run continues as the uninterrupted one.
    from test_trainer import read, train

    from pomdp_ffm.metrics import TIMING as TIME_COLUMNS

    calls = []
    eager_as_compiled(monkeypatch, calls, tmp_path)
    train(composed(*RUN), tmp_path / "full")

    class StopWhileCompiling(episodes_listed(calls)):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            warm_up = self.updater.warm_up

            def stopped_meanwhile(batch):
                self.stop.request(10)  # what SIGUSR1 does, in the middle of the compile
                return warm_up(batch)

            self.updater.warm_up = stopped_meanwhile

    calls.clear()
    out = train(composed(*RUN), tmp_path / "cut", StopWhileCompiling)
    assert out.stopped and out.standing.env_steps == out.standing.rl_steps == 0
    assert calls and all(c[0] == "compiled" for c in calls)  # compiled, then stopped: no episode
    assert "stopped by signal 10 at 0 env steps" in (tmp_path / "cut" / "attempts.log").read_text()
    out = train(composed(*RUN, "resume=true"), tmp_path / "cut")
    assert not out.stopped
    pd.testing.assert_frame_equal(
        read(tmp_path / "cut").drop(columns=TIME_COLUMNS),
        read(tmp_path / "full").drop(columns=TIME_COLUMNS),
        check_exact=True,
    )


@pytest.mark.slow
def test_a_seed_axis_compiles_once_before_its_first_episode(composed, tmp_path, monkeypatch):
    # The seeds share one architecture, hence one set of compiled graphs: compiled once, before any seed's episode;
    # a stop that came meanwhile stops every seed there.
    from pomdp_ffm.train import train_job

    calls = []
    eager_as_compiled(monkeypatch, calls, tmp_path)

    class StopWhileCompiling(episodes_listed(calls)):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            warm_up = self.updater.warm_up
            self.updater.warm_up = lambda batch: self.stop.request(10) or warm_up(batch)

    out = train_job(composed(*RUN, "seeds=[0,1]"), tmp_path / "axis" / "seed-0", trainer_cls=StopWhileCompiling)
    assert calls == [("compiled", 0)] * 2  # one warm-up (TD3: critic and actor losses), no episode
    assert out.stopped and all(r.stopped and r.standing.env_steps == 0 for r in out.seeds.values())
    calls.clear()
    out = train_job(composed(*RUN, "seeds=[0,1]", "resume=true"), tmp_path / "axis" / "seed-0", episodes_listed(calls))
    assert not out.stopped and calls[: calls.index(("episode", 0))] == [("compiled", 0)] * 2


FAILING_COMPILE = """
import runpy, sys
import torch
from torch._inductor.exc import CppCompileError
from pomdp_ffm import update as update_mod

OUTPUT = "\\n".join(f"kernel.cpp:{i}: error: marker-{i}" for i in range(1000))  # (g++'s output runs that long)
WHERE = sys.argv[1]


def backend(gm, example_inputs):
    if WHERE == "build":
        raise CppCompileError(["g++", "kernel.cpp"], OUTPUT)

    def first_call(*args):
        raise RuntimeError("the compiled kernel failed\\n" + OUTPUT)

    return first_call


def compile_(fn):
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)
    return lambda *args: compiled(*args)


update_mod.compiled_losses = lambda: update_mod.Losses(*map(compile_, update_mod.EAGER))
sys.argv = ["train", *sys.argv[2:]]
runpy.run_module("pomdp_ffm.train", run_name="__main__")
"""


@pytest.mark.slow
@parametrize_first_fast("where", ["build", "first call"])
def test_a_failed_compile_in_a_run_is_one_line_naming_the_switch_and_the_log(tmp_path, where):
    # Any error of the compile (a C++ build in inductor, wrapped by dynamo; an error in the first compiled call,
    # unwrapped): one line on the terminal naming train.compile and experiment.log, which holds the whole chain (as
    # ERROR.txt does); exit 1, "failed"; no episode, no checkpoint.
    import os
    import subprocess
    import sys

    from conftest import TINY
    from hang import HANG_S

    from pomdp_ffm.run.exits import EXIT_FAILED

    run, root = tmp_path / "run", str(Path(__file__).resolve().parents[1])
    proc = subprocess.run(
        [sys.executable, "-c", FAILING_COMPILE, where.split()[0], *TINY, *RUN, f"hydra.run.dir={run}"],
        cwd=tmp_path,
        env=dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        ),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: compiling the update with torch.compile failed (")
    assert "train.compile=false" in line and str(run / "experiment.log") in line
    cause = "BackendCompilerFailed from CppCompileError: C++ compile error" if where == "build" else "RuntimeError"
    assert cause in line
    assert "marker-" not in proc.stdout + proc.stderr and "Traceback" not in proc.stdout + proc.stderr
    log = (run / "experiment.log").read_text()
    assert "Traceback" in log and "marker-999" in log and line.removeprefix("error: ").split(" (all of it")[0] in log
    assert "marker-999" in (run / "ERROR.txt").read_text()
    assert (run / "attempts.log").read_text().splitlines()[-1].endswith("failed (see ERROR.txt)")
    assert not (run / "checkpoints" / "last.pt").exists()


def test_each_run_compiles_into_a_cache_of_its_own(tmp_path, monkeypatch):
    # A compile failed in the user's shared inductor cache while other jobs compiled into it: each run has its own,
    # under the user's, named by its run directory, so that a resumed run of the same directory finds it warm.
    import getpass

    from torch._inductor import codecache
    from torch._inductor.runtime.cache_dir_utils import cache_dir, triton_cache_dir

    from pomdp_ffm.compiling import run_cache_dir, use_run_cache

    user = (tmp_path / "users-cache").resolve()
    inductor_cache_in(monkeypatch, user)
    a, b = tmp_path / "runs" / "a" / "seed-0", tmp_path / "runs" / "b" / "seed-0"
    assert run_cache_dir(a) != run_cache_dir(b) and run_cache_dir(a) == run_cache_dir(tmp_path / "runs/b/../a/seed-0")
    assert all(user in run_cache_dir(r).parents for r in (a, b))
    folder = use_run_cache(a)
    assert folder == run_cache_dir(a)
    # inductor compiles there (its C++ headers too), and Triton
    assert Path(cache_dir()) == folder and folder in Path(triton_cache_dir(0)).parents
    assert folder in Path(codecache._HEADER_DIR).parents
    # the next run of this process gets its own under the user's, not under the last run's
    assert user in run_cache_dir(b).parents and folder not in run_cache_dir(b).parents
    assert use_run_cache(b) != folder and use_run_cache(a) == folder
    # without a folder of the user's, under inductor's default: per user
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setattr(getpass, "getuser", lambda: "alice")
    alice = run_cache_dir(a)
    monkeypatch.setattr(getpass, "getuser", lambda: "bob")
    assert "torchinductor_alice" in str(alice) and run_cache_dir(a) != alice


@pytest.mark.slow
def test_a_resume_that_switches_train_compile_says_so(composed, tmp_path, monkeypatch, caplog):
    # Allowed (how the run runs, not what it learns: config.MAY_DIFFER), but the compiled update moves last bits, so
    # the continued run is neither setting's run: one line in the log (and on the terminal) and in attempts.log.
    from test_trainer import train

    from pomdp_ffm.trainer import Trainer

    eager_as_compiled(monkeypatch, [], tmp_path)

    class StopAfterTheFirstBurst(Trainer):
        def _end_burst(self):
            evaluation = super()._end_burst()
            self.stop.request(10)
            return evaluation

    run = tmp_path / "run"
    base = ("algo=td3", "seq_model=ffm", "device=cpu", "train.num_iters=6")
    assert train(composed(*base), run, StopAfterTheFirstBurst).stopped
    assert train(composed(*base, "resume=true"), run, StopAfterTheFirstBurst).stopped
    assert "train.compile" not in (run / "attempts.log").read_text()
    with caplog.at_level("WARNING", logger="pomdp_ffm"):
        assert train(composed(*base, "train.compile=true", "resume=true"), run, StopAfterTheFirstBurst).stopped
    said = [r.getMessage() for r in caplog.records if r.levelno >= 30 and "train.compile" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{run}: train.compile=true here, false when the run started")
    assert "matches neither setting" in said[0]
    start = [ln for ln in (run / "attempts.log").read_text().splitlines() if " start" in ln][-1]
    assert start.endswith(f" start ({said[0].removeprefix(f'{run}: ')})")
    assert "its updates run compiled from here on, uncompiled before" in said[0]
    assert (run / "experiment.log").read_text().count("false when the run started") == 1
    # Against the run's start, not the last attempt: the setting it started with is none; nor is null, which leaves a
    # CPU's update uncompiled as false does (compiling.compile_pays).
    train(composed(*base, "resume=true"), run, StopAfterTheFirstBurst)
    train(composed(*base, "train.compile=null", "resume=true"), run, StopAfterTheFirstBurst)
    starts = [ln.split(" ", 4)[-1] for ln in (run / "attempts.log").read_text().splitlines() if " start" in ln]
    assert [s.split(":")[0] for s in starts] == ["start"] * 2 + [
        "start (train.compile=true here, false when the run started"
    ] + ["start"] * 2

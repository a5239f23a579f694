"""``train.compile`` around the compiled update (update.compiled_losses, cuda_graph.UpdateRunner; patches/020): its
policy (where it pays, where it is known to fail), its errors as one line naming the switch, each run's own inductor
cache, the compile before the run acts, and the line a resume that switches it says."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from .agent import RecurrentAgent
from .config import as_read_now
from .seq_models import SeqModel

log = logging.getLogger("pomdp_ffm")


class CompileError(RuntimeError):
    """A failed torch.compile of the update; the message is one line naming the switch. Its cause (a failed C++ build
    prints the compiler's whole output: a thousand lines) goes to the run's experiment.log and ERROR.txt, never to the
    terminal (start.Attempt.fail, train.py)."""


def _root_cause(e: BaseException) -> BaseException:
    """The innermost exception of ``e``'s chain: dynamo's BackendCompilerFailed and inductor's InductorError hold
    what the compiler raised as ``inner_exception`` (InductorError cuts the chain: ``from None``)."""
    seen = {id(e)}
    while True:
        nxt = getattr(e, "inner_exception", None)
        if not isinstance(nxt, BaseException):
            nxt = e.__cause__ if e.__cause__ is not None else (None if e.__suppress_context__ else e.__context__)
        if nxt is None or id(nxt) in seen:
            return e
        seen.add(id(nxt))
        e = nxt


def _compile_failures() -> tuple[type[BaseException], ...]:
    """What torch.compile raises, where a compile can happen in any update (a recompile): dynamo's errors (a graph
    break under fullgraph, a backend's failure) and inductor's (a lowering, a C++ or CUDA build, which a backward
    compiled lazily at its first call may raise unwrapped)."""
    from torch._inductor import exc

    return (
        torch._dynamo.exc.TorchDynamoException,
        exc.OperatorIssue,
        exc.CppCompileError,
        exc.InvalidCxxCompiler,
        exc.CppWrapperCodegenError,
        exc.SubgraphLoweringException,
    )


@contextlib.contextmanager
def compile_errors_named(everything: bool = False):
    """torch.compile's errors as a CompileError; ``everything``: any error (``UpdateRunner.warm_up``, whose only work
    is compiling). A compile runs before its loss's optimiser step: a failure takes no step."""
    try:
        yield
    except CompileError:
        raise
    except Exception as e:
        if not (everything or isinstance(e, _compile_failures())):
            raise
        root = _root_cause(e)
        what = type(e).__name__ if root is e else f"{type(e).__name__} from {type(root).__name__}"
        detail = next((ln.strip() for ln in str(root).splitlines() if ln.strip()), "")[:200]
        raise CompileError(
            f"compiling the update with torch.compile failed ({what}: {detail}); "
            "set train.compile=false to run it uncompiled"
        ) from e


def _compile_failure(agents: Sequence[RecurrentAgent]) -> str | None:
    for m in (m for a in agents for m in a.modules() if isinstance(m, SeqModel)):
        why = m.compile_failure()
        if why is not None:
            return why
    return None


def compile_pays(agents: Sequence[RecurrentAgent], device: torch.device) -> bool:
    """``train.compile=null``: where compiling was measured to pay (docs/benchmarks.md, "The compiled update"): on
    CUDA, for memories that declare it (FFM). Not on a CPU (slower than eager), nor for GRU/LSTM (dynamo unrolls
    cuDNN's kernel step by step). ``agents``: built, or their shapes (agent.agent_shape); ``device``: where they
    train."""
    memories = {type(a.critic.encoder.memory) for a in agents}
    return device.type == "cuda" and all(m.compile_pays for m in memories) and _compile_failure(agents) is None


def compiles(setting: bool | None, agents: Sequence[RecurrentAgent], device: torch.device) -> bool:
    """``train.compile`` resolved: true or false as set, null as ``compile_pays`` finds; a CompileError, before
    anything is built or written, where a compile asked for is known to fail."""
    if setting is None:
        return compile_pays(agents, device)
    why = _compile_failure(agents) if setting and device.type == "cuda" else None
    if why is not None:
        raise CompileError(f"train.compile=true with {why}")
    return bool(setting)


def run_cache_dir(run: str | Path) -> Path:
    """The on-disk inductor cache of the run in ``run``: a folder of its own, under the user's (inductor's default,
    <tmp>/torchinductor_<user>, or the TORCHINDUCTOR_CACHE_DIR they set), named by the run directory's absolute path.
    A resumed run of the same directory on the same machine finds it warm (patches/020)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    now = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    base = Path(now) if now else Path(default_cache_dir())
    if base.parent.name == "pomdp_ffm-runs":  # an earlier run's of this process (use_run_cache): the user's is above
        base = base.parents[1]
    path = Path(run).resolve()
    key = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    return base.resolve() / "pomdp_ffm-runs" / f"{path.name}-{key}"


def use_run_cache(run: str | Path) -> Path:
    """Inductor's and Triton's on-disk caches in the run's own folder (``run_cache_dir``) from here on, this process
    and the compile workers it starts. Why not the user's shared folder: a run's compile failed there in a C++ build
    while other jobs compiled into it, as a race on it would. A run directory is locked for its run
    (run/rundir.py), so its folder has one writer at a time, and no lock is needed; a file lock around compiling
    would make the jobs of one node compile one after another. The cost: each run compiles cold once (tens of
    seconds, a resume excepted), against hours of training."""
    folder = run_cache_dir(run)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    try:  # inductor memoises some paths under its cache folder (as its own temporary_cache_dir clears them)
        from torch._inductor import codecache
        from torch._inductor.utils import clear_caches
    except ImportError:
        return folder
    clear_caches()
    # Its precompiled C++ headers stay in the user's folder whatever TORCHINDUCTOR_CACHE_DIR says (torch 2.13: a
    # module constant): a .gch half written by a killed job would fail every later CPU compile of the user.
    if hasattr(codecache, "_HEADER_DIR") and hasattr(codecache, "_HEADER_LOCK_DIR"):
        codecache._HEADER_DIR = str(folder / "precompiled_headers")
        codecache._HEADER_LOCK_DIR = str(folder / "precompiled_headers" / "locks")
    return folder


def compile_before_acting(trainer) -> bool:
    """``train.compile``: the trainer's update compiled now (cuda_graph.UpdateRunner.warm_up on a blank batch of the
    run's layout), before its first episode, into the run's own cache, so that no update waits for a compile, nor does a
    stop signal: True, for the caller to take one that came while it compiled (nothing interrupts inductor). A
    CompileError where it fails; False where the update is not compiled (or the updater is a test's double), or where
    no update remains (a resumed run at its budget, which only finishes)."""
    updater, c = trainer.updater, trainer.standing
    if not getattr(updater, "compiled", False) or (c.burst is None and c.env_steps >= trainer.budget):
        return False
    folder = use_run_cache(trainer.rundir.path)
    log.info("train.compile: compiling the update before the first episode (inductor's cache: %s)", folder)
    t0 = time.perf_counter()
    updater.warm_up(trainer.buffer.blank_batch(trainer.cfg.train.batch_size))
    log.info("train.compile: compiled in %.1f s", time.perf_counter() - t0)
    return True


def log_compile_failure(handler: logging.Handler | None, e: BaseException) -> None:
    """A CompileError's whole chain (a failed C++ build's output runs to a thousand lines) into the run's own log,
    through its handler alone: logged, it would reach the terminal too, which has the error's one line (train.py)."""
    if isinstance(e, CompileError) and handler is not None:
        handler.handle(log.makeRecord(log.name, logging.ERROR, "", 0, "%s", (e,), (type(e), e, e.__traceback__)))


def compile_switch_said(state: dict | None, trainer, where) -> str:
    """A resume (``state``: its checkpoint; None for a fresh start) whose update compiles where the run's start did
    not, or the reverse (``train.compile`` against the checkpoint's copy of its config, ``null`` as this attempt's
    device resolves it: a device that changed too is a change of its own): said in one line, a warning, and returned
    as the note of the start line in attempts.log, " (<the line>)"; else "". Allowed (config.MAY_DIFFER: how the run
    runs), but a compiled update moves last bits (patches/020), so the continued run is neither setting's run."""
    if state is None:
        return ""
    try:
        was = as_read_now(state["config"]).train.compile
    except Exception:  # (a value this version refuses: plan() compared it as it is)
        was = ((state.get("config") or {}).get("train") or {}).get("compile")
    now = trainer.cfg.train.compile
    compiled = [compile_pays([trainer.agent], trainer.device) if v is None else bool(v) for v in (was, now)]
    if compiled[0] == compiled[1]:
        return ""
    yaml = {True: "true", False: "false", None: "null"}
    line = (
        f"train.compile={yaml.get(now, now)} here, {yaml.get(was, was)} when the run started: its updates run "
        f"{'compiled' if compiled[1] else 'uncompiled'} from here on, {'compiled' if compiled[0] else 'uncompiled'} "
        "before, so it matches neither setting's run exactly"
    )
    log.warning("%s: %s", where, line)
    return f" ({line})"

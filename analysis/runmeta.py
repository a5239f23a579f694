"""What a run is (task, algorithm, memory model, seed, status, setup), read from its config and its path.

Metadata comes from the resolved config when there is one (``config.yaml``, then Hydra's ``.hydra/config.yaml``,
then the reference implementation's ``variant_<pid>.yml``) and from the path otherwise, so that runs of this
project and of the reference implementation can be analysed side by side.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import yaml

from pomdp_ffm.config import learning_settings
from pomdp_ffm.run.rundir import RunDir

from . import constants as C
from .rundirs import CONFIG_CANDIDATES, DONE_MARKER

# The reference's algorithm folder (its run name): an oracle_ prefix (the agent sees the full state), the number of
# recurrent layers where not 1, and _shared (one memory for actor and critic) make other agents than the plain
# <algo>_<model>, so they are filed as model variants (C.model_variant), never pooled with it.
_ALGO_MODEL_RE = re.compile(
    r"^(?P<oracle>oracle_)?(?P<algo>sacd|sac|td3)_(?P<layers>\d*)(?P<model>ffm|gru|lstm|mlp)(?:-mlp)?"
    r"(?P<shared>_shared)?$"
)
_MARKOVIAN_RE = re.compile(r"^(?P<kind>Markovian|oracle)_(?P<algo>sacd|sac|td3)$")
_SEED_RE = re.compile(r"^seed[-_=]?(?P<seed>\d+)$")


def _config_files(run_dir: Path) -> list[Path]:
    found = [run_dir / c for c in CONFIG_CANDIDATES if (run_dir / c).is_file()]
    variants = sorted(run_dir.glob("variant_*.yml"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    return found + variants[::-1]


def _get(cfg: dict, dotted: str):
    cur = cfg
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def parse_run_path(parts: list[str]) -> dict:
    """Metadata that can be read off a run's path components (ours or the reference's layout)."""
    meta: dict = {}
    for i, comp in enumerate(parts):
        if "task" not in meta and C.parse_task(comp):
            meta["task"] = comp
        if (
            comp in ("P", "V", "F")
            and i > 0
            and "task" not in meta
            and re.fullmatch(r"[A-Za-z0-9]+", parts[i - 1])
            and i + 1 < len(parts)
            and (_ALGO_MODEL_RE.match(parts[i + 1]) or _MARKOVIAN_RE.match(parts[i + 1]))
        ):
            meta["task"] = f"{parts[i - 1]}-{comp}-v0"
            meta["layout"] = "reference"
        m = _ALGO_MODEL_RE.match(comp)
        if m and "algo" not in meta:
            tags = (
                (["oracle"] if m.group("oracle") else [])
                + ([f"{m.group('layers')}layer"] if m.group("layers") not in ("", "1") else [])
                + (["shared"] if m.group("shared") else [])
            )
            meta["algo"], meta["model"] = m.group("algo"), C.model_variant(m.group("model"), tags)
        m = _MARKOVIAN_RE.match(comp)
        if m and "algo" not in meta:
            # The reference's observation-only agent, not our seq_model=mlp (patches/012): its own label; with
            # oracle_, the same agent on the full state (the reference's Oracle).
            meta["algo"], meta["model"] = m.group("algo"), "markovian" if m.group("kind") == "Markovian" else "oracle"
        m = _SEED_RE.match(comp)
        if m and "seed" not in meta:
            meta["seed"] = int(m.group("seed"))
    return meta


def read_run_metadata(root: Path, run_dir: Path) -> tuple[dict | None, list[tuple[str, str]]]:
    """task/algo/model/seed/source of one run, with problems found on the way."""
    problems: list[tuple[str, str]] = []
    cfg: dict | None = None
    cfg_file: Path | None = None
    for candidate in _config_files(run_dir):
        try:
            loaded = yaml.safe_load(candidate.read_text(errors="replace"))
        except yaml.YAMLError as exc:
            problems.append(("warning", f"config {candidate.name} is not valid YAML ({type(exc).__name__}); ignored"))
            continue
        if not isinstance(loaded, dict):
            problems.append(("warning", f"config {candidate.name} is not a mapping; ignored"))
            continue
        cfg, cfg_file = loaded, candidate
        break

    # Absolute but not resolved: a run reached through a symlink keeps the names of the path it was found by.
    run_abs, root_abs = Path(os.path.abspath(run_dir)), Path(os.path.abspath(root))
    rel = run_abs.relative_to(root_abs) if run_abs != root_abs else Path()
    parts = [root_abs.name, *rel.parts]
    from_path = parse_run_path(parts)
    is_reference = (cfg_file is not None and cfg_file.name.startswith("variant_")) or from_path.get(
        "layout"
    ) == "reference"
    meta: dict = {}
    if cfg is not None:
        meta = {
            "task": _get(cfg, "env.env_name"),
            "algo": _get(cfg, "policy.algo_name"),
            "model": _get(cfg, "policy.seq_model"),
            "seed": _get(cfg, "seed"),
        }
        missing = [k for k in ("task", "algo", "model") if meta[k] is None]
        if missing:
            problems.append(("warning", f"config {cfg_file.name} lacks {', '.join(missing)}; taken from the path"))
        if is_reference and from_path.get("model") is not None:
            # The reference's run name says which agent it is (Markovian, oracle, layers, shared memory); its
            # config's seq_model names only the memory (mlp for the Markovian agent).
            said, named = meta["model"], from_path["model"]
            if said is not None and str(said).lower().removesuffix("-mlp") not in (C.memory_of(named), "mlp"):
                problems.append(
                    (
                        "warning",
                        (
                            f"config {cfg_file.name} says seq_model {said!r} but the run's folder "
                            f"says {named!r}; the folder's is used"
                        ),
                    )
                )
            meta["model"] = named
        for k, v in from_path.items():
            if meta.get(k) is None:
                meta[k] = v
    else:
        problems.append(
            (
                "warning",
                (f"no config file ({', '.join(CONFIG_CANDIDATES)}, variant_*.yml); metadata parsed from the path"),
            )
        )
        meta = dict(from_path)
    meta["source"] = "reference" if is_reference else "ours"

    missing = [k for k in ("task", "algo", "model") if meta.get(k) in (None, "")]
    if missing:
        return None, problems + [("skipped", f"cannot determine {', '.join(missing)} from config or path")]
    meta["task"], meta["algo"], meta["model"] = str(meta["task"]), str(meta["algo"]).lower(), str(meta["model"]).lower()
    meta["model"] = meta["model"].removesuffix("-mlp")
    if meta["algo"] not in C.KNOWN_ALGOS:
        problems.append(("warning", f"unknown algorithm {meta['algo']!r}; kept as is"))
    if C.memory_of(meta["model"]) not in C.KNOWN_MODELS:
        problems.append(("warning", f"unknown memory model {meta['model']!r}; kept as is"))

    seed = meta.get("seed")
    if seed is not None:
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            problems.append(("warning", f"seed {seed!r} is not an integer; ignored"))
            seed = None
    meta["seed"] = seed
    if seed is None:
        meta["trial"] = run_dir.name
        problems.append(("warning", f"no seed; trial id taken from folder name {run_dir.name!r}"))
    else:
        meta["trial"] = f"seed-{seed}"

    # Only our engine writes DONE; for the reference layout completion is unknown.
    meta["status"], problem = _status(run_dir) if meta["source"] == "ours" else ("unknown", None)
    meta["finished"] = meta["status"] == "done" if meta["source"] == "ours" else pd.NA
    if problem:
        problems.append(("warning", problem))
    meta["setup"] = _setup(cfg, parts, is_reference)
    meta["run_id"] = "/".join(parts)
    return meta, problems


def _status(run_dir: Path) -> tuple[str, str | None]:
    """One of our runs: done, running, diverged, failed or unfinished (RunDir.status, a reference run's is
    unknown), and a warning for the two that ended in an error, which are analysed as far as they got (a diverged
    run's evaluations are its own result)."""
    try:
        status = RunDir(run_dir).status()
    except OSError:  # a lock file that cannot be read: its files alone say the rest
        status = "done" if (run_dir / DONE_MARKER).exists() else None
    if status in ("done", "running"):
        return status, None
    error = run_dir / RunDir.ERROR
    last = ""
    if error.is_file():
        lines = [ln.strip() for ln in error.read_text(errors="replace").splitlines() if ln.strip()]
        last = f" ({lines[-1][:120]})" if lines else ""
    if (run_dir / RunDir.DIVERGED).exists():
        return "diverged", (
            f"diverged{last}: its evaluations before the divergence are analysed as its result "
            f"(its last state is {RunDir.DIVERGED})"
        )
    if error.is_file():
        return "failed", (
            f"failed{last}: analysed as far as it got; {RunDir.ERROR} has the traceback, and a "
            "rerun with resume=true continues it"
        )
    return "unfinished", None


def _setup(cfg: dict | None, parts: list[str], is_reference: bool) -> dict:
    """What makes a run the experiment it is, to tell runs pooled in one group apart: our config's settings that
    change what a run learns (pomdp_ffm.config.learning_settings) but its seed, or the reference's run name (its
    folders between the algorithm's and the timestamp encode the discount, sequence length, batch size, update
    ratio and inputs)."""
    if is_reference:
        at = next((i for i, p in enumerate(parts) if _ALGO_MODEL_RE.match(p) or _MARKOVIAN_RE.match(p)), None)
        return {"run name": "/".join(parts[at + 1 : -1])} if at is not None and len(parts) > at + 2 else {}
    if cfg is None:
        return {}
    settings = learning_settings(cfg)
    settings.pop("seed", None)
    return settings

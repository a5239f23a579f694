"""The command line checked before Hydra starts anything (``precheck``): a misspelt key, an unknown task or model,
a bad value, or a run directory that cannot be made is one line and exit code 2, with nothing written or launched
(one this process may not write in: exit code 74, a file that cannot be written)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import stat
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from .. import catalog
from ..config import yaml_problem
from ..envs import check_worker_start_method
from ..run.unwritable import REFUSED_WRITES, Unwritable
from .grid import job_configs, job_overrides, sweep_jobs
from .plan import Refused, validate


def launcher_name(hydra_cfg) -> str:
    """The class name of a composed Hydra config's launcher ("BasicLauncher", "JoblibLauncher", ...)."""
    return str(hydra_cfg.launcher.get("_target_", "")).rsplit(".", 1)[-1]


def _one_line(e: Exception) -> str:
    """Hydra's composition errors in one line: what was refused, why, and what is allowed."""
    text = str(e)
    problem = yaml_problem(e)
    if problem is not None:  # a config file Hydra read
        return problem + ("; remove one of them" if "duplicate key" in problem else "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    group, _, choice = str(getattr(e, "missing_cfg_file", None) or "").partition("/")
    if group == "seq_model" and choice in catalog.skipped():  # a plug-in's memory left out: why, not the choices
        return f"seq_model={choice}: {catalog.skipped()[choice]}"
    if "Available options in" in text:  # an unknown config-group choice: name the choices
        head = lines[0].replace("In 'config': ", "")
        options = [
            ln.strip()
            for ln in text.split("Available options in", 1)[1].splitlines()[1:]
            if ln.startswith("\t") and "provider=" not in ln
        ]
        return f"{head}; the choices are {', '.join(options)}"
    cause = e.__cause__
    why = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
    if lines and lines[0].startswith("Could not override"):
        return f"{lines[0].rstrip('.')}: {why}; `--cfg job` prints every key" if why else lines[0]
    return "; ".join([*lines[:1], *([why] if why else [])])


def why_not_makeable(path: Path) -> tuple[str, bool] | None:
    """Why ``path`` cannot be made a directory (or written in), found without writing anything, and whether the file
    system refuses the write (no permission: a read-only or immutable folder, a read-only file system; Unwritable)
    rather than the path being wrong (a file in its way, a name too long). None where nothing tells so."""
    path = Path(path) if Path(path).is_absolute() else Path.cwd() / path  # ".." left to the kernel, as mkdir does
    found, missing = path, []
    while True:
        try:
            st = found.stat()  # through symlinks, as mkdir goes
            break
        except FileNotFoundError:
            missing.append(found.name)
            found = found.parent
        except OSError as e:  # ENOTDIR (a file on the way), ENAMETOOLONG, ELOOP, EACCES
            return f"{e.strerror}: {e.filename}", e.errno in REFUSED_WRITES
    if not stat.S_ISDIR(st.st_mode):
        return f"{found} is not a directory", False
    if not os.access(found, os.W_OK | os.X_OK):
        return f"no permission to write in {found}", True
    limit = os.pathconf(found, "PC_NAME_MAX")
    long = [n for n in missing if len(os.fsencode(n)) > limit]
    return (f"a name is longer than {limit} bytes: {long[0][:40]}...", False) if long else None


def precheck(argv: list[str], check_dirs: bool = True) -> DictConfig | None:
    """Compose and validate what the command line asks for before Hydra starts anything, so that a misspelt
    key, an unknown task or model, or a bad value is one line and exit code 2, with nothing written or
    launched. Every job of a sweep (the command line's, and a preset's ``hydra.sweeper.params`` in a multirun)
    is checked, with its own overrides as the sweep will start it; jobs that differ only in their seed are composed
    once (``grid.job_configs``). Commands with Hydra flags other than --multirun (--cfg, --help, -cn, ...) are left
    to Hydra. Returns the config composed from the fixed overrides, with Hydra's (None where the command is left
    to Hydra). With ``check_dirs``, the run (or sweep) directory must be one that can be made, and no file may sit
    where one of a sweep's run directories, or a folder above one, belongs; one the file system will not let this
    process write in raises Unwritable (exits.EXIT_UNWRITABLE)."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None
    flag = any(a in ("-m", "--multirun") for a in argv)
    overrides = [a for a in argv if not a.startswith("-")]
    try:
        if (problem := _hydra_override_problem(overrides, flag)) is not None:
            raise Refused(problem)
        every, composed = job_overrides(overrides, multirun=flag)
        multirun = flag or composed.hydra.mode == RunMode.MULTIRUN
        # The multiprocessing start method a sweep's jobs run under: joblib's launcher runs them in loky's workers
        # (unless it runs one job at a time, in this process, or in threads); the others run them in processes of
        # Python's own.
        launcher = composed.hydra.launcher
        loky = (
            multirun
            and launcher_name(composed.hydra) == "JoblibLauncher"
            and launcher.get("n_jobs") != 1
            and launcher.get("backend") in (None, "loky")
        )
        for job, job_cfg in job_configs(every):
            try:
                if validate(job_cfg).eval_in_workers():
                    check_worker_start_method("loky" if loky else None, "this sweep's jobs use")
            except (Refused, ValueError) as e:
                raise Refused(f"{e}" + (f" (in the job {' '.join(job)})" if len(every) > 1 else "")) from None
    except Refused:
        raise
    except OverrideParseException as e:
        raise Refused(_unlexable(e, argv) or _one_line(e) + _quoting_hint(argv)) from None
    except Exception as e:  # Hydra's and OmegaConf's composition errors
        raise Refused(_one_line(e) + _quoting_hint(argv)) from None
    # A run or sweep directory that cannot be made (a file in its way, a name too long: refused) or written in (no
    # permission, a read-only or immutable folder, a read-only file system: Unwritable) is one line, instead of
    # Hydra's traceback once it tries.
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        path = Path(str(OmegaConf.select(composed, key, throw_on_resolution_failure=True)))
    except Exception:  # named by Hydra's runtime values (${hydra:...}), it cannot be resolved yet: left to Hydra
        return composed
    if check_dirs and (not_makeable := why_not_makeable(path)) is not None:
        why, refused_write = not_makeable
        if refused_write:  # (as a run's file that cannot be written: make it writable, and the same command runs)
            raise Unwritable(errno.EACCES, why, f"{key}={path}")
        raise Refused(f"{key}={path} cannot be made a directory ({why})")
    if not (check_dirs and multirun):
        return composed
    # Hydra makes each job's directory before the job runs: a file there would end the sweep with a traceback.
    with contextlib.suppress(InterpolationResolutionError):  # a subdir named by Hydra's runtime values
        for job in sweep_jobs([a for a in argv if a not in ("-m", "--multirun")], statuses=False):
            for d in (job.run_dir, *job.run_dirs):
                file = next((p for p in (d, *d.parents) if p.exists()), d)  # the deepest existing path
                if not file.is_dir():
                    where = "a job's run directory" if file == d else f"a folder of the job's run directory {d}"
                    raise Refused(f"{file} is a file where {where} belongs; move it away")
    return composed


def _hydra_override_problem(overrides: list[str], multirun: bool) -> str | None:
    """An override of Hydra's own settings that Hydra would take only to fail with its own error: a sweep of one
    (Hydra sweeps none), or ``hydra.sweeper.params`` set where no preset gives it a value (Hydra cannot merge into
    its empty one); named with the sweep that works."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    prefix = "hydra.sweeper.params."
    for o in parsed:
        if o.is_hydra_override() and o.is_sweep_override():
            key, value = o.key_or_group, o.input_line.split("=", 1)[1]
            fix = (
                f"sweep the setting itself: -m {key[len(prefix) :]}={value}"
                if key.startswith(prefix)
                else "give it one value"
            )
            return f"{o.input_line} sweeps a setting of Hydra's own (hydra.*), which Hydra does not do; {fix}"
    params = [o for o in parsed if o.key_or_group == prefix[:-1] or o.key_or_group.startswith(prefix)]
    if not params:
        return None
    _, composed = job_overrides([o.input_line for o in parsed if o not in params], multirun=multirun)
    if composed.hydra.sweeper.params is not None:  # (a preset's, which these replace or extend)
        return None
    o, value = params[0], params[0].value()
    sweep = (
        " ".join(f"{k}={v}" for k, v in value.items())
        if isinstance(value, dict)
        else f"{o.key_or_group[len(prefix) :]}={value}"
        if o.key_or_group.startswith(prefix) and isinstance(value, (str, int, float))
        else "<key>=<a>,<b>"
    )
    return (
        f"{o.input_line}: only an experiment preset (conf/experiment/) gives hydra.sweeper.params a value to "
        f"override, and none here does; sweep the settings themselves: -m {sweep}"
    )


def _quoting_hint(argv: list[str]) -> str:
    """A word that is no override right after a key=value one is most likely the rest of a value with spaces,
    which the shell split: say how to quote it."""
    for prev, word in zip(argv, argv[1:]):
        if "=" not in word and not word.startswith("-") and "=" in prev and not prev.startswith("-"):
            key, value = prev.split("=", 1)
            return f"; if '{value} {word}' is one value, quote it for the shell and Hydra: '{key}=\"{value} {word}\"'"
    return ""


_LEXER = "LexerNoViableAltException: "


def _unlexable(e: OverrideParseException, argv: list[str]) -> str | None:
    """Hydra's lexer refusing an override (a character its grammar allows only quoted: a non-ASCII letter, a quote
    mark, ...) in one line naming the override and the character, and showing the override quoted for Hydra, as
    one shell word; None for Hydra's other parse errors."""
    lines = str(e).splitlines()
    override = getattr(e, "override", None)
    if not override or not lines or not lines[0].startswith(_LEXER):
        return None
    # Hydra marks where its lexer stopped with a caret in the line below the override: at the character, or at the
    # start of the token it was reading (".ü" in a key), so the first non-ASCII character from there on is named.
    at = lines[1].find("^") - len(_LEXER) if len(lines) > 1 else -1
    if 0 <= at < len(override):
        at = next((i for i in range(at, len(override)) if not override[i].isascii()), at)
    char = f"{override[at]!r}" if 0 <= at < len(override) else "a character"
    head = f"Hydra cannot read the override {override}"
    key, eq, value = override.partition("=")
    if not eq:  # a word of a value the shell split, or no override at all
        return f"{head}: an override is key=value" + _quoting_hint(argv)
    if at < len(key):  # (no quoting makes a key)
        return f"{head}: {char} cannot be in a key (keys are ASCII letters, digits, _ and -, joined by .)"
    # A value the shell split at a space: its next words belong in the quotes too.
    words = argv[argv.index(override) + 1 :] if override in argv else []
    while words and "=" not in words[0] and not words[0].startswith("-"):
        value += " " + words.pop(0)
    quoted = _quoted(key, value)
    if quoted is None:
        return f"{head}: {char} is read only in quotes (https://hydra.cc/docs/advanced/override_grammar/basic/)"
    return f"{head}: {char} is read only in quotes; quote it for the shell and Hydra: {_shell_word(quoted)}"


def _reads_as(override: str, value=None) -> bool:
    """Whether Hydra parses ``override`` (to ``value``, where one is given)."""
    with contextlib.suppress(OverrideParseException):
        parsed = OverridesParser.create().parse_overrides([override])[0]
        return value is None or parsed.value() == value
    return False


def _quoted(key: str, value: str) -> str | None:
    """``key=value`` with ``value`` quoted so that Hydra reads it as that string, or a sweep's elements (a,b) each
    quoted where they need it, so that it stays a sweep; None where no quoting tried reads."""
    if "," in value and not any(c in value for c in "[]{}()'\"\\"):
        parts = [v if _reads_as(f"{key}={v}") else f'"{v}"' for v in value.split(",")]
        if _reads_as(f"{key}={','.join(parts)}"):
            return f"{key}={','.join(parts)}"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return next(
        (f"{key}={q}" for q in (f'"{value}"', f"'{value}'", f'"{escaped}"') if _reads_as(f"{key}={q}", value)), None
    )


def _shell_word(text: str) -> str:
    """``text`` as one shell word: in single quotes (as the hint for a split value writes it), else, where it has
    one, in double quotes (with ", $, ` and \\ escaped); shlex's form where a ! would expand in a shell's history."""
    if "'" not in text:
        return f"'{text}'"
    if "!" in text:
        return shlex.quote(text)
    return '"' + re.sub(r'(["$`\\])', r"\\\1", text) + '"'


def printed_config_overrides(argv: list[str]) -> list[str] | None:
    """The overrides of a command that prints the composed config (``--cfg job|hydra|all``, with ``--resolve`` or
    ``--package``) or its help (``--help``, which composes it too), or None for any other command."""
    if not any(a in ("--cfg", "-c", "--help", "-h") for a in argv):
        return None
    rest = []
    args = iter(argv)
    for a in args:
        if a in ("--cfg", "-c", "--package", "-p"):
            next(args, None)  # (its value)
        elif a not in ("--resolve", "--help", "-h"):
            rest.append(a)
    return None if any(a.startswith("-") and a not in ("-m", "--multirun") for a in rest) else rest


def config_dir_as_searchpath(argv: list[str]) -> list[str]:
    """``--config-dir DIR`` (``-cd``) as a search path, for the checks to read what Hydra will (given argv as is)."""
    out = []
    rest = iter(argv)
    for a in rest:
        if a in ("--config-dir", "-cd") or a.startswith("--config-dir="):
            d = a.split("=", 1)[1] if "=" in a else next(rest, "")
            if not d or "'" in d or any(x.startswith("hydra.searchpath=") for x in argv):
                return argv  # (left to Hydra)
            if not Path(d).is_dir():
                raise ValueError(f"--config-dir {d} is not a directory")
            a = f"hydra.searchpath=['file://{Path(d).resolve()}']"
        out.append(a)
    return out


def checked_command(argv: list[str]) -> DictConfig | None:
    """``precheck`` of the command line as Hydra will read it (``--config-dir`` as a search path); a command that
    prints the config is checked too (an invalid config is refused, not printed as if it were fine)."""
    checked = config_dir_as_searchpath(argv)
    printed = printed_config_overrides(checked)
    if printed is not None:
        precheck(printed, check_dirs=False)
    return precheck(checked)

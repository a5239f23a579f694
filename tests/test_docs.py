"""The repository explains itself.

Comments, configs and the ledger may point at docs/reference.md (which describes the reference implementation
section by section) or at the reference's own source paths, but not at numbered sections of documents that are
not in the repository. Every `docs/reference.md#<anchor>` link must land on a heading of that file.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference.md"

# A numbered section of an outside document ("spec" followed by a number) or the outside notes by name.
# (The patterns are written so that this file does not match them itself.)
OUTSIDE_CITATION = re.compile(r"\bspec(?:\s+section)?(?:\s*§\s*|\s+)\d|\bfacts[\s_-]+sheet", re.IGNORECASE)
# `docs/reference.md#<anchor>`, or `reference.md#<anchor>` from inside docs/.
REFERENCE_LINK = re.compile(r"reference\.md#([\w-]+)")
# In-page links inside docs/reference.md itself.
LOCAL_LINK = re.compile(r"\]\(#([\w-]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", "runs", "outputs", "multirun", "build", "dist"}


def repository_files() -> list[Path]:
    """Tracked files plus untracked ones git does not ignore; a plain walk where git is unavailable."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        names = sorted({n for n in out.split("\0") if n})
        return [ROOT / n for n in names if (ROOT / n).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for path in ROOT.rglob("*"):
            rel = path.relative_to(ROOT).parts
            if path.is_file() and not any(p in _SKIP_DIRS or p.endswith(".egg-info") for p in rel):
                files.append(path)
        return sorted(files)


def read_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary (figures, checkpoints)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> list[str]:
    """Anchors of every heading outside fenced code blocks, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m is None:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append(base if n == 0 else f"{base}-{n}")
    return out


def test_slug_follows_github():
    assert slug("Training loop") == "training-loop"
    assert slug("`progress.csv` format") == "progresscsv-format"
    assert slug("Tasks & index lists") == "tasks--index-lists"
    assert slug("FFM fork differences") == "ffm-fork-differences"
    assert anchors("# A\n## B c\n```\n# not a heading\n```\n### B c\n") == ["a", "b-c", "b-c-1"]


def test_no_citations_of_documents_outside_the_repository():
    offenders = []
    for path in repository_files():
        text = read_text(path)
        if text is None:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_CITATION.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, (
        "cite a docs/reference.md section (e.g. docs/reference.md#training-loop) or the "
        "reference's file path instead of:\n" + "\n".join(offenders)
    )


def test_reference_headings_are_unique():
    found = anchors(REFERENCE.read_text(encoding="utf-8"))
    # A repeated heading would get GitHub's fragile "-1" anchor.
    assert len(found) == len(set(found)), sorted({a for a in found if found.count(a) > 1})


def test_every_reference_link_points_at_a_heading():
    known = set(anchors(REFERENCE.read_text(encoding="utf-8")))
    broken = []
    for path in repository_files():
        text = read_text(path)
        if text is None:
            continue
        links = REFERENCE_LINK.findall(text)
        if path == REFERENCE:
            links += LOCAL_LINK.findall(text)
        broken += [f"{path.relative_to(ROOT)}: #{a}" for a in links if a not in known]
    assert not broken, (
        "links to missing docs/reference.md headings:\n" + "\n".join(broken) + f"\nknown anchors: {sorted(known)}"
    )


@pytest.mark.parametrize(
    "path",
    [
        "buffers/seq_replay_buffer_vanilla.py",
        "policies/learner.py",
        "policies/models/policy_rnn.py",
        "standalone/ffm/ffa.py",
    ],
)
def test_reference_names_the_files_it_summarises(path):
    assert f"`{path}`" in REFERENCE.read_text(encoding="utf-8")


def test_every_ledger_entry_named_exists():
    named = re.compile(r"patches/(\d{3}-[\w-]+\.md)")
    missing = []
    for path in repository_files():
        text = read_text(path)
        if text is None:
            continue
        missing += [
            f"{path.relative_to(ROOT)}: patches/{n}"
            for n in named.findall(text)
            if not (ROOT / "patches" / n).is_file()
        ]
    assert not missing, "ledger entries that do not exist:\n" + "\n".join(missing)


# A path in code quotes (`pomdp_ffm/{envs,trainer}.py`, `jobs/start.py`) under one of the project's folders.
QUOTED_PATH = re.compile(r"`((?:pomdp_ffm|analysis|conf|launch|patches|tests|docs)/[\w.{},/-]*)`")
GUIDES = ["README.md", "docs/architecture.md"]


def expand_braces(path: str) -> list[str]:
    """`a/{b,c}.py` -> [`a/b.py`, `a/c.py`], as a shell expands it."""
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return [p for alt in m.group(1).split(",") for p in expand_braces(path[: m.start()] + alt + path[m.end() :])]


def named_paths(text: str) -> list[str]:
    return [p for quoted in QUOTED_PATH.findall(text) for p in expand_braces(quoted)]


def test_path_expansion():
    assert named_paths("see `pomdp_ffm/{envs,trainer}.py` and `docs/`, not `x/y.py`") == [
        "pomdp_ffm/envs.py",
        "pomdp_ffm/trainer.py",
        "docs/",
    ]


@pytest.mark.parametrize("guide", GUIDES)
def test_every_path_a_guide_names_exists(guide):
    # docs/architecture.md names the package's modules from inside it (`jobs/start.py`): either root will do.
    missing = [
        p
        for p in named_paths((ROOT / guide).read_text())
        if not any((r / p).exists() for r in (ROOT, ROOT / "pomdp_ffm"))
    ]
    assert not missing, f"{guide} names paths that do not exist: {missing}"


MARKDOWN_LINK = re.compile(r"\]\(([^)\s#]*\.md)?#([\w-]+)\)")


def test_every_heading_link_in_the_guides_points_at_a_heading():
    """A link to a heading (``[...](#anchor)`` in the same file, ``[...](other.md#anchor)`` across files) in the
    README, the docs, the launch guide and the ledger finds that heading: the contents of docs/benchmarks.md too."""
    guides = [ROOT / "README.md", ROOT / "launch" / "README.md", *(ROOT / "docs").glob("*.md")]
    guides += sorted((ROOT / "patches").glob("*.md"))
    broken = []
    for path in guides:
        for target, anchor in MARKDOWN_LINK.findall(path.read_text(encoding="utf-8")):
            file = (path.parent / target).resolve() if target else path
            if not file.is_file() or anchor not in anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{path.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, "links to missing headings:\n" + "\n".join(broken)

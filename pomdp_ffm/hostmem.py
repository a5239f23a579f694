"""How much memory this process can still take on the host: the least of what the machine has available, what the
address-space limit (``ulimit -v``, RLIMIT_AS) leaves, and what the cgroup's limit leaves (``memory.max``, as
SLURM and containers set it; cgroup v1's ``memory.limit_in_bytes``). Each with the words that name it, for the
memory check's refusal."""

from __future__ import annotations

import resource
from pathlib import Path

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _kib_field(path: Path, field: str) -> int | None:
    try:
        with open(path) as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(field))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def machine_available() -> int | None:
    return _kib_field(PROC / "meminfo", "MemAvailable:")


def address_space_left() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = _kib_field(PROC / "self" / "status", "VmSize:")
    return None if used is None else max(soft - used, 0)


def cgroup_left() -> int | None:
    """The least headroom of this process's cgroup and its ancestors (a job's limit often sits above the step's
    own cgroup), or None without a limit."""
    try:
        lines = (PROC / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    left = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2
            base, limit_file, usage_file = CGROUP_ROOT, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):  # cgroup v1
            base, limit_file, usage_file = CGROUP_ROOT / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        node = base / path.lstrip("/")
        while True:
            limit, usage = _read_int(node / limit_file), _read_int(node / usage_file)
            if limit is not None and usage is not None and limit < 1 << 60:  # v1 writes ~2^63 for no limit
                left.append(max(limit - usage, 0))
            if node == base or base not in node.parents:
                break
            node = node.parent
    return min(left) if left else None


def host_memory_left() -> tuple[int | None, str]:
    """(bytes, the words naming the tightest limit), or (None, "") where nothing can tell."""
    limits = (
        (machine_available(), "of host memory available"),
        (address_space_left(), "that the address-space limit (ulimit -v) leaves"),
        (cgroup_left(), "that the cgroup's memory limit leaves"),
    )
    found = [(n, words) for n, words in limits if n is not None]
    if not found:
        return None, ""
    return min(found, key=lambda f: f[0])

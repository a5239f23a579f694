"""The memory check reads the host's tightest limit: what the machine has available, what ``ulimit -v`` leaves and
what the cgroup's limit leaves (pomdp_ffm/hostmem.py), each named in the refusal."""

import resource
import subprocess
import sys

import pytest
from hang import HANG_S

from pomdp_ffm import hostmem

GiB = 1 << 30


@pytest.fixture
def fake_host(tmp_path, monkeypatch):
    """A /proc and a /sys/fs/cgroup of our own: meminfo, this process's status and cgroup, no rlimit."""
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {64 * GiB // 1024} kB\nMemAvailable: {48 * GiB // 1024} kB\n")
    (proc / "self" / "status").write_text(f"Name: python\nVmSize: {3 * GiB // 1024} kB\n")
    (proc / "self" / "cgroup").write_text("0::/\n")
    cg.mkdir()
    monkeypatch.setattr(hostmem, "PROC", proc)
    monkeypatch.setattr(hostmem, "CGROUP_ROOT", cg)
    monkeypatch.setattr(hostmem.resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    return proc, cg


def test_without_limits_the_machines_available_memory(fake_host):
    assert hostmem.host_memory_left() == (48 * GiB, "of host memory available")


def test_ulimit_v_leaves_its_limit_less_what_the_process_maps(fake_host, monkeypatch):
    monkeypatch.setattr(hostmem.resource, "getrlimit", lambda which: (8 * GiB, resource.RLIM_INFINITY))
    assert hostmem.host_memory_left() == (5 * GiB, "that the address-space limit (ulimit -v) leaves")


def test_a_cgroup_limit_above_the_processs_own_cgroup_counts(fake_host):
    # SLURM: the job's cgroup holds the limit, the step's cgroup below it has none ("max")
    proc, cg = fake_host
    (proc / "self" / "cgroup").write_text("0::/job_7/step_0\n")
    (cg / "job_7" / "step_0").mkdir(parents=True)
    (cg / "job_7" / "step_0" / "memory.max").write_text("max\n")
    (cg / "job_7" / "step_0" / "memory.current").write_text(f"{GiB}\n")
    (cg / "job_7" / "memory.max").write_text(f"{16 * GiB}\n")
    (cg / "job_7" / "memory.current").write_text(f"{6 * GiB}\n")
    assert hostmem.cgroup_left() == 10 * GiB
    assert hostmem.host_memory_left() == (10 * GiB, "that the cgroup's memory limit leaves")


def test_cgroup_v1_and_its_no_limit_value(fake_host):
    proc, cg = fake_host
    (proc / "self" / "cgroup").write_text("4:memory:/user\n2:cpu,cpuacct:/user\n")
    (cg / "memory" / "user").mkdir(parents=True)
    (cg / "memory" / "user" / "memory.limit_in_bytes").write_text(f"{(1 << 63) - 4096}\n")  # v1's "no limit"
    (cg / "memory" / "user" / "memory.usage_in_bytes").write_text(f"{GiB}\n")
    assert hostmem.cgroup_left() is None
    (cg / "memory" / "user" / "memory.limit_in_bytes").write_text(f"{4 * GiB}\n")
    assert hostmem.cgroup_left() == 3 * GiB


def test_nothing_readable_is_none(fake_host):
    proc, _ = fake_host
    for f in (proc / "meminfo", proc / "self" / "cgroup"):
        f.unlink()
    assert hostmem.host_memory_left() == (None, "")


def test_a_real_ulimit_is_read():
    # In a process of its own under a real RLIMIT_AS: what it reports is the limit less the process's mappings.
    script = (
        "import resource; from pomdp_ffm import hostmem; resource.setrlimit(resource.RLIMIT_AS, "
        "(64 << 30, resource.RLIM_INFINITY)); n, words = hostmem.host_memory_left(); "
        "print(hostmem.address_space_left(), words)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_S, check=True)
    left = int(out.stdout.split()[0])
    assert 0 < left < 64 << 30

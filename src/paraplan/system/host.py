"""This machine's free memory: what the limits that keep a command within the machine derive from
(the simulator's task graph, profile-links' message buffers, profile's batches), so that a size
that cannot be materialised is refused in one line instead of growing until the kernel kills it.

Read fresh on every call: other programs come and go.
"""

from __future__ import annotations

import os

GIB = 2**30


def available_memory_bytes() -> int | None:
    """Bytes this process can still allocate: the least of the machine's free memory, what its
    control group still allows and what its address-space limit (ulimit -v) leaves; None where
    none of them is known."""
    known = [x for x in (_machine_available(), _cgroup_available(), _address_space_left()) if x is not None]
    return min(known) if known else None


def _machine_available() -> int | None:
    """/proc/meminfo's MemAvailable (free memory plus the page cache the kernel can drop), else
    os.sysconf's free pages (no cache: a lower figure)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts in kB (KiB)
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages, page_bytes = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None
    return pages * page_bytes if pages > 0 and page_bytes > 0 else None


def _cgroup_available() -> int | None:
    """A container's limit less its use (cgroup v2, then v1): MemAvailable shows the whole host."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:  # no limit (v1 writes a huge number)
            return None
        return max(0, int(limit) - usage)
    return None


def _address_space_left() -> int | None:
    """RLIMIT_AS (ulimit -v) less the address space already mapped (VmSize)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft < 0:
            return None
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(0, soft - int(line.split()[1]) * 1024)
    except (ImportError, OSError, ValueError, IndexError):
        return None
    return None


def gib(n_bytes: float) -> str:
    """'21.3 GiB', for messages."""
    return f"{n_bytes / GIB:.3g} GiB" if n_bytes < 1000 * GIB else f"{n_bytes / GIB:,.0f} GiB"

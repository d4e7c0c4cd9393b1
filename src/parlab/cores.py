"""How many CPU cores this process may really use: its affinity, capped by a cgroup CPU quota.

``os.sched_getaffinity`` counts the cores the process may be scheduled on,
but a container or a hub's spawner usually limits CPU *time* instead: a
cgroup quota of, say, 4 CPUs on a 112-core DGX leaves the affinity at 112.
Sizing threads or grading workers from the affinity then oversubscribes the
quota, and the kernel throttles every thread.  So the count here is
``min(affinity, ceil(quota / period))``, the rule the JDK's container
support applies (``CgroupSubsystem`` / ``-XX:ActiveProcessorCount``):

- cgroup v2: ``cpu.max`` holds ``"$MAX $PERIOD"`` (``"max"`` is no limit),
  see the kernel's Documentation/admin-guide/cgroup-v2.rst;
- cgroup v1: ``cpu.cfs_quota_us`` (``-1`` is no limit) over
  ``cpu.cfs_period_us``, see Documentation/scheduler/sched-bwc.rst.

A limit set on any ancestor applies too, so every level from the process's
cgroup up to the mount's root is read and the smallest limit wins.  Where
the cgroup is found comes from ``/proc/self/cgroup`` and
``/proc/self/mountinfo`` (which cgroup path each mount shows), so the same
code works on a host and inside a container's cgroup namespace.

Used by the launcher (``OMP_NUM_THREADS`` per rank), ``parlab doctor`` and
``parlab grade`` (how many submissions to grade at once).
"""
from __future__ import annotations

import math
import os


def affinity_cores() -> int:
    """Cores this process may be scheduled on (``os.cpu_count()`` where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def usable_cores(proc_dir: str = "/proc/self") -> int:
    """The cores this process can keep busy: affinity capped by the cgroup CPU quota, at least 1."""
    cores = affinity_cores()
    quota = cpu_quota(proc_dir)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def cores_text(proc_dir: str = "/proc/self") -> str:
    """``parlab doctor``'s line: the usable count, and the quota when it is what limits it."""
    cores, quota, affinity = usable_cores(proc_dir), cpu_quota(proc_dir), affinity_cores()
    if quota is None or cores >= affinity:
        return str(cores)
    return f"{cores} (a cgroup CPU quota of {quota:g} CPUs; {affinity} cores in this process's affinity)"


def cpu_quota(proc_dir: str = "/proc/self") -> float | None:
    """The tightest cgroup CPU limit on this process, in CPUs (1.5 = 150 ms per 100 ms), or None."""
    try:
        with open(os.path.join(proc_dir, "cgroup")) as f:
            memberships = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
        mounts = _cgroup_mounts(os.path.join(proc_dir, "mountinfo"))
    except OSError:
        return None
    limits = []
    for hierarchy, controllers, path in memberships:
        if hierarchy == "0" and controllers == "":
            found = [(root, point) for kind, _, root, point in mounts if kind == "cgroup2"]
            read = _v2_limit
        elif "cpu" in controllers.split(","):
            found = [(root, point) for kind, opts, root, point in mounts if kind == "cgroup" and "cpu" in opts]
            read = _v1_limit
        else:
            continue
        for root, point in found:
            limits += [lim for d in _levels(root, point, path) if (lim := read(d)) is not None]
    return min(limits) if limits else None


def _cgroup_mounts(mountinfo: str) -> list[tuple[str, set, str, str]]:
    """(filesystem type, super options, cgroup path shown at the mount, mount point) per cgroup mount."""
    mounts = []
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                mounts.append((tail[0], set(tail[2].split(",")), fields[3], fields[4]))
    return mounts


def _levels(root: str, point: str, path: str) -> list[str]:
    """The folders of ``path``'s cgroup under mount ``point`` (showing cgroup ``root``), up to ``point``."""
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root):]
    here = os.path.normpath(os.path.join(point, path.lstrip("/")))
    if not os.path.isdir(here):  # a path from outside this namespace's view: only the mount is known
        here = point
    levels = [here]
    while here != os.path.normpath(point) and len(here) > len(point):
        here = os.path.dirname(here)
        levels.append(here)
    return levels


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _ratio(quota: str | None, period: str | None) -> float | None:
    """quota / period in CPUs; None for no limit ("max", -1) or an unreadable file."""
    try:
        quota_us, period_us = int(quota), int(period)
    except (TypeError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def _v2_limit(folder: str) -> float | None:
    parts = (_read(os.path.join(folder, "cpu.max")) or "").split()
    return _ratio(parts[0], parts[1] if len(parts) > 1 else "100000") if parts else None


def _v1_limit(folder: str) -> float | None:
    return _ratio(_read(os.path.join(folder, "cpu.cfs_quota_us")), _read(os.path.join(folder, "cpu.cfs_period_us")))

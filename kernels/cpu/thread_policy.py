"""How many compute threads the native kernels should run, given the cores this process can get.

Why: the kernels' threads meet at a barrier after every parallel region (hundreds per decode
step). When another process takes a core, the thread waiting at the barrier spins through its
time slice while the one it waits for is descheduled, and a step that took 7 ms can take
hundreds (measured: 153 -> 1 tok/s beside one busy process on 2 cores). One thread fewer has no
one to wait for. So the count follows what is free:

    limit   = min(threads asked for, CPUs in this process's affinity, the cgroup CPU quota)
    others  = busy time of the affinity's CPUs, less this process's own CPU time, per second
              (read from /proc every `interval` seconds; our own spinning counts as ours)
    taken   = floor(others + 1 - TAKEN_AT)     (a core is taken once others use 3/4 of it, so
                                               background blips on an idle machine take none)
    target  = clamp(len(affinity) - taken, 1, limit)

A change is applied after `patience` consecutive readings agree, so a short burst next door
does not flap the count. `ThreadPolicy.threads()` is called before each step by the model
runner; it costs two small /proc reads every `interval`, nothing in between.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
TAKEN_AT = 0.75


@dataclass(frozen=True)
class CpuSample:
    """Cumulative busy seconds of the watched CPUs, and of this process."""

    system_busy: float
    own: float


def read_sample(cpus: frozenset[int], proc: Path = Path("/proc")) -> CpuSample | None:
    """Busy seconds of `cpus` (/proc/stat: all but idle and iowait) and of this process
    (/proc/self/stat utime + stime), or None where /proc cannot say."""
    try:
        stat = (proc / "stat").read_text().splitlines()
        own_fields = (proc / "self" / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    busy = 0
    for line in stat:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        values = [int(v) for v in rest.split()]
        busy += sum(values) - values[3] - (values[4] if len(values) > 4 else 0)
    own = int(own_fields[11]) + int(own_fields[12])  # utime, stime (fields 14, 15 of stat)
    return CpuSample(busy / CLOCK_TICKS, own / CLOCK_TICKS)


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs the cgroup quota allows (cgroup v2 cpu.max or v1 cfs quota), or None: no quota."""
    try:
        quota, period = (root / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def affinity() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def usable_threads(requested: int, cpus: frozenset[int], quota: float | None) -> int:
    """The most threads worth running: no more than the CPUs we may run on or the quota."""
    limit = min(requested, len(cpus))
    if quota is not None:
        limit = min(limit, max(1, int(quota + 0.5)))
    return max(1, limit)


class ThreadPolicy:
    """The thread count for the next step (module docstring)."""

    def __init__(
        self,
        requested: int,
        interval: float = 0.5,
        patience: int = 2,
        cpus: frozenset[int] | None = None,
        quota: float | None = None,
        sample: Callable[[], CpuSample | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cpus = cpus if cpus is not None else affinity()
        self.limit = usable_threads(requested, self.cpus, quota)
        self.current = self.limit
        self.interval, self.patience = interval, patience
        self._sample = sample if sample is not None else (lambda: read_sample(self.cpus))
        self._clock = clock
        self._last = self._sample()
        self._last_time = clock()
        self._wanted, self._streak = self.limit, 0

    def threads(self) -> int:
        """Threads to run now; re-reads /proc at most every `interval` seconds."""
        now = self._clock()
        if self.limit == 1 or now - self._last_time < self.interval:
            return self.current
        sample = self._sample()
        if sample is None or self._last is None:
            self._last, self._last_time = sample, now
            return self.current
        elapsed = now - self._last_time
        others = (sample.system_busy - self._last.system_busy) - (sample.own - self._last.own)
        self._last, self._last_time = sample, now
        taken = int(max(0.0, others) / elapsed + 1.0 - TAKEN_AT)  # cores other processes hold
        target = len(self.cpus) - taken
        self._follow(min(self.limit, max(1, target)))
        return self.current

    def _follow(self, target: int) -> None:
        if target == self.current:
            self._streak = 0
            return
        self._streak = self._streak + 1 if target == self._wanted else 1
        self._wanted = target
        if self._streak >= self.patience:
            self.current, self._streak = target, 0

"""ThreadPolicy: the kernels' thread count follows the cores other processes leave free, within
the affinity and the cgroup quota; /proc and cgroup files are read as this machine has them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.cpu.thread_policy import (
    CLOCK_TICKS,
    CpuSample,
    ThreadPolicy,
    affinity,
    cgroup_cpu_limit,
    read_sample,
    usable_threads,
)


class Machine:
    """Two CPUs; `others` cores of busy time per second from other processes, `own` ours."""

    def __init__(self) -> None:
        self.time, self.others, self.own = 0.0, 0.0, 2.0
        self.busy_total, self.own_total = 0.0, 0.0

    def advance(self, seconds: float) -> None:
        self.time += seconds
        self.busy_total += (self.others + self.own) * seconds
        self.own_total += self.own * seconds

    def sample(self) -> CpuSample:
        return CpuSample(self.busy_total, self.own_total)


def policy_on(machine: Machine, **kwargs) -> ThreadPolicy:
    return ThreadPolicy(
        2, cpus=frozenset({0, 1}), sample=machine.sample, clock=lambda: machine.time, **kwargs
    )


def run(machine: Machine, policy: ThreadPolicy, seconds: float, step: float = 0.1) -> list[int]:
    counts = []
    for _ in range(int(seconds / step)):
        machine.advance(step)
        counts.append(policy.threads())
    return counts


def test_one_busy_process_beside_drops_a_thread_and_its_end_restores_it() -> None:
    machine = Machine()
    policy = policy_on(machine)
    assert run(machine, policy, 3.0)[-1] == 2  # idle: both cores
    machine.others, machine.own = 1.0, 1.0  # a busy process takes a core
    counts = run(machine, policy, 3.0)
    assert counts[-1] == 1 and counts[:4] == [2] * 4  # after `patience` readings, not at once
    machine.others, machine.own = 0.0, 1.0
    assert run(machine, policy, 3.0)[-1] == 2


def test_a_short_burst_next_door_does_not_flap_the_count() -> None:
    machine = Machine()
    policy = policy_on(machine, patience=3)
    run(machine, policy, 1.0)
    machine.others = 1.0
    assert set(run(machine, policy, 0.9)) == {2}  # under three readings of 0.5 s
    machine.others = 0.0
    assert set(run(machine, policy, 3.0)) == {2}


def test_background_blips_keep_every_thread() -> None:
    machine = Machine()
    machine.others, machine.own = 0.6, 1.4  # a fraction of a core, e.g. a log shipper
    policy = policy_on(machine)
    assert set(run(machine, policy, 3.0)) == {2}


def test_two_busy_processes_leave_one_thread_never_zero() -> None:
    machine = Machine()
    machine.others, machine.own = 2.0, 0.7
    policy = policy_on(machine)
    assert run(machine, policy, 3.0)[-1] == 1


def test_the_limit_is_the_affinity_and_the_quota() -> None:
    assert usable_threads(8, frozenset({0, 1}), None) == 2
    assert usable_threads(2, frozenset({0, 1, 2, 3}), 1.0) == 1
    assert usable_threads(4, frozenset(range(4)), 2.5) == 3
    assert usable_threads(4, frozenset(range(4)), 0.2) == 1
    policy = ThreadPolicy(4, cpus=frozenset({3}), sample=lambda: None)
    assert policy.threads() == 1 and policy.limit == 1


def test_without_proc_the_count_stays_at_the_limit() -> None:
    policy = ThreadPolicy(
        2, cpus=frozenset({0, 1}), sample=lambda: None, clock=iter(range(99)).__next__
    )
    assert [policy.threads() for _ in range(5)] == [2] * 5


def test_proc_and_cgroup_files_parse(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "stat").write_text(
        "cpu  9 9 9 9 9 0 0 0 0 0\ncpu0 100 0 50 800 50 0 0 0 0 0\ncpu1 300 0 0 600 0 0 0 0 0 0\n"
    )
    (tmp_path / "self" / "stat").write_text(
        "42 (python (x)) R " + " ".join(["0"] * 10) + " 70 30 0"
    )
    # cpu0: 1000 ticks, 800 idle, 50 iowait -> 150 busy; cpu1: 300 busy; ours: 70 + 30.
    assert read_sample(frozenset({0}), tmp_path) == CpuSample(150 / CLOCK_TICKS, 100 / CLOCK_TICKS)
    assert read_sample(frozenset({0, 1}), tmp_path).system_busy == 450 / CLOCK_TICKS
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    assert cgroup_cpu_limit(cgroup) is None
    (cgroup / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(cgroup) == pytest.approx(1.5)
    (cgroup / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(cgroup) is None


def test_this_machine_reads() -> None:
    cpus = affinity()
    assert cpus and read_sample(cpus) is not None

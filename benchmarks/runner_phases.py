"""Where a real engine step's runner time goes, phase by phase (an instrument for benchmarks).

`RunnerPhases(runner).install()` wraps the parts of `ModelRunner.execute` on this runner's own
objects (nothing in the engine changes): block copies, input packing, and on the CUDA-graph
path padding, staging, FlashInfer's plan and the replay; then the logits (lm_head), the
verification and the step outputs. On a GPU each part is followed by a synchronize, so the
device work it launched is counted in it (the step gets slower by the syncs: for locating
time, not for rates); `uninstall()` puts everything back. `take()` returns the last step's phases in ms, "other" being the step
less the parts (the eager model call, the gather after a replay), and the replayed graph's
(batch, rows) with whether that was its first replay.

Written for `goodput_probe.py --phases`: on the H200 6 of 28 drafting steps at 16 requests
ran 2.5-4.5 ms over the usual (docs/benchmarks.md §4j), each the first of its token count;
the phases say which part stalls.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

import engine.runner.model_runner as model_runner_module

PHASES = ("blocks", "pack", "pad", "stage", "plan", "replay", "logits", "verify", "outputs")


class RunnerPhases:
    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.sync = runner.device.type == "cuda"
        self._current: dict[str, float] = {}
        self._shape: tuple[int, int] | None = None
        self._replayed: set[tuple[int, int]] = set()
        self._first_replay = False
        self._last: dict[str, Any] = {}
        self._undo: list[Callable[[], None]] = []

    def install(self) -> RunnerPhases:
        """Wrap the runner's parts (instance attributes, so only this runner is timed)."""
        runner = self.runner
        self._wrap(runner, "execute", self._step)
        self._wrap(runner, "_copy_blocks", self._timed("blocks"))
        self._wrap(runner, "_outputs", self._timed("outputs"))
        self._wrap(runner.verifier, "verify", self._timed("verify"))
        self._wrap(runner.model, "compute_logits", self._timed("logits"))
        for name in ("plan", "plan_graph"):  # FlashInfer's (the CPU backends plan nothing)
            if hasattr(runner.backend, name):
                self._wrap(runner.backend, name, self._timed("plan"))
        if runner.graphs is not None:
            self._wrap(runner.graphs, "_pad", self._timed("pad"))
            self._wrap(runner.graphs, "_stage", self._timed("stage"))
            self._wrap(runner.graphs, "_replay", self._replay)
        self._wrap(model_runner_module, "build_model_input", self._timed("pack"))
        return self

    def uninstall(self) -> None:
        """Undo install() (the module's input packing is shared by every runner)."""
        while self._undo:
            self._undo.pop()()

    def take(self) -> dict[str, Any]:
        """The last step's phases (ms), its other time, its graph shape and first replay."""
        return dict(self._last)

    def _wrap(self, owner: Any, name: str, wrapper: Callable) -> None:
        own = vars(owner).get(name)  # an instance's own attribute, or None: the class's
        setattr(owner, name, wrapper(getattr(owner, name)))
        if own is None:
            self._undo.append(lambda: delattr(owner, name))
        else:
            self._undo.append(lambda: setattr(owner, name, own))

    def _timed(self, phase: str) -> Callable:
        def wrapper(fn: Callable) -> Callable:
            @functools.wraps(fn)
            def timed(*args, **kwargs):
                start = time.perf_counter()
                result = fn(*args, **kwargs)
                if self.sync:
                    torch.cuda.synchronize()
                elapsed = 1e3 * (time.perf_counter() - start)
                self._current[phase] = self._current.get(phase, 0.0) + elapsed
                return result

            return timed

        return wrapper

    def _replay(self, fn: Callable) -> Callable:
        timed = self._timed("replay")(fn)

        @functools.wraps(fn)
        def replay(shape, n):
            self._shape = tuple(shape)
            self._first_replay = self._shape not in self._replayed
            self._replayed.add(self._shape)
            return timed(shape, n)

        return replay

    def _step(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def step(*args, **kwargs):
            self._current, self._shape, self._first_replay = {}, None, False
            output = fn(*args, **kwargs)
            phases = {phase: self._current.get(phase, 0.0) for phase in PHASES}
            phases["other"] = 1e3 * output.step_time - sum(phases.values())
            self._last = dict(phases=phases, graph=self._shape, first_replay=self._first_replay)
            return output

        return step


def first_counts(steps: list[dict]) -> list[bool]:
    """Per step, whether it is the first at its (requests, tokens): a shape not run before."""
    seen, first = set(), []
    for step in steps:
        key = (step["requests"], step["tokens"])
        first.append(key not in seen)
        seen.add(key)
    return first


def phase_summary(steps: list[dict], top: int = 8) -> dict:
    """Median phases of the drafting steps at the largest batch, first of their token count
    against repeats, and the `top` slowest steps with their phases."""
    timed = [s for s in steps if "phases" in s]
    if not timed:
        return {}
    first = dict(zip(map(id, timed), first_counts(timed)))
    largest = max(s["requests"] for s in timed)
    drafting = [s for s in timed if s["requests"] == largest and s["drafts"] and not s["eager"]]
    groups = {
        "first": [s for s in drafting if first[id(s)]],
        "repeat": [s for s in drafting if not first[id(s)]],
    }
    medians = {
        name: dict(steps=len(group), **{p: _median(group, p) for p in (*PHASES, "other")})
        for name, group in groups.items()
        if group
    }
    slowest = sorted(timed, key=lambda s: -s["measured"])[:top]
    keys = ("requests", "tokens", "drafts", "eager", "measured", "graph", "first_replay")
    return dict(
        requests=largest,
        drafting=medians,
        slowest=[
            {k: s[k] for k in keys} | {"first_count": first[id(s)]} | s["phases"] for s in slowest
        ],
    )


def _median(steps: list[dict], phase: str) -> float:
    values = sorted(s["phases"][phase] for s in steps)
    return values[len(values) // 2]

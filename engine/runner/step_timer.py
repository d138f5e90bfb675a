"""StepTimer: the runner's "time these step shapes" callable, for the start-up profile of the
cost model (engine/speculation/control/profiler.py fits it; the runner runs it).

A call times one synthetic step: greedy verification of random drafts over random tokens,
timed as the engine times a real step (ModelOutput.step_time), plus the draft-model passes a
caller hands in (the draft proposer's own, run over the same borrowed slots first).

Safety invariant: synthetic steps run before any real request exists, on a pristine pool
(every block free, nothing in the prefix cache; checked at every call, else RuntimeError).
They borrow free block ids without allocating them, so the BlockManager (free lists, ref
counts, prefix cache) is never touched. The K/V they write is garbage in free blocks; a real
request only reads positions it computed itself or took from the prefix cache, and nothing
written here is ever hashed into it.
"""

from __future__ import annotations

import functools
import platform
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.core.block_pool import NULL_BLOCK
from engine.outputs import Drafts, ScheduledRequest, SchedulerOutput
from engine.request import Request
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.core.block_manager import BlockManager
    from engine.runner.model_runner import ModelRunner

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

Shape = tuple[int, int, int]  # (context_len, num_new_tokens, num_draft_tokens) of one request
# draft_passes(scheduled, num_passes, random_tokens, num_catchup_tokens) -> seconds of the
# draft model's passes, the first one feeding num_catchup_tokens more (its catch-up)
DraftPasses = Callable[[Sequence[ScheduledRequest], int, Callable[[int], list[int]], int], float]


class StepTimer:
    def __init__(self, runner: ModelRunner, block_manager: BlockManager, seed: int = 0) -> None:
        self.runner = runner
        self.block_manager = block_manager
        self.block_size = block_manager.block_size
        self.num_blocks = block_manager.num_total_blocks
        self.max_model_len = runner.max_model_len
        self.vocab_size = runner.arch.vocab_size
        self.rng = random.Random(seed)
        self.num_steps = 0

    @property
    def identity(self) -> tuple[str, str, str, int]:
        """What the timings depend on, the profile cache's key: (model, device, backend and
        processor, dtype, weight format and KV dtype, threads). The model by file name and
        architecture, so a rebuilt copy of the same model in another directory shares the
        entry; the processor by name, so a home directory shared by machines keeps one entry
        per kind; the weight format names the native kernels' build, so new kernels get a new
        profile."""
        runner, arch = self.runner, self.runner.arch
        model = f"{Path(runner.model_path).name}:{arch.num_layers}x{arch.hidden_size}"
        model += f"x{arch.intermediate_size}:h{arch.num_heads}/{arch.num_kv_heads}"
        model += f":v{arch.vocab_size}"
        backend = getattr(runner.backend, "name", type(runner.backend).__name__)
        dtype = str(runner.dtype).removeprefix("torch.")
        dtype += f"/{getattr(runner, 'weight_format', 'dense')}"
        kv_dtype = getattr(runner, "kv_dtype", runner.dtype)
        if kv_dtype != runner.dtype:
            dtype += f"/kv-{str(kv_dtype).removeprefix('torch.')}"
        device = f"{runner.device}/{backend}@{processor_name(runner.device)}"
        return model, device, dtype, torch.get_num_threads()

    def check_pristine(self) -> None:
        manager = self.block_manager
        window = manager.window_pool
        if (
            manager.num_free_blocks != manager.num_total_blocks
            or manager.num_cached_blocks
            or (window is not None and (window.usage > 0 or window.prefix.num_cached_blocks))
        ):
            raise RuntimeError(
                "the cost-model profile runs only on an idle KV pool (every block free, empty "
                f"prefix cache); found {manager.num_free_blocks}/{manager.num_total_blocks} "
                f"free and {manager.num_cached_blocks} cached"
            )

    def _window_tables(self, shapes: Sequence[Shape]) -> list[list[int]]:
        """Each request's window-pool table: the blocks its queries read, from the free ones
        (taken again from the first when they run out: a dummy step's values do not matter)."""
        manager = self.block_manager
        if manager.window_pool is None:
            return [[] for _ in shapes]
        free = manager.window_pool.free_block_ids()
        tables, taken = [], 0
        for context, num_new, num_drafts in shapes:
            num_blocks = -(-(context + num_new + num_drafts) // self.block_size)
            first = manager.first_visible_block(context)
            table = [NULL_BLOCK] * first
            for _ in range(first, num_blocks):
                table.append(free[taken % len(free)])
                taken += 1
            tables.append(table)
        return tables

    def __call__(
        self,
        shapes: Sequence[Shape],
        num_draft_passes: int = 0,
        draft_passes: DraftPasses | None = None,
        num_catchup_tokens: int = 0,
    ) -> float:
        """Seconds of one synthetic step of these request shapes, and of `num_draft_passes`
        draft passes through `draft_passes` when given, catching up on `num_catchup_tokens`
        first (see the module docstring)."""
        self.check_pristine()
        free_block_ids = self.block_manager.free_block_ids()
        window_ids = self._window_tables(shapes)
        scheduled, chains = [], {}
        for index, (context, num_new, num_drafts) in enumerate(shapes):
            request = self._fake_request(index, context + num_new)
            num_blocks = -(-(context + num_new + num_drafts) // self.block_size)
            if num_blocks > len(free_block_ids):
                raise ValueError(f"{shapes} does not fit the KV pool; use fit_to_pool")
            request.block_ids = free_block_ids[:num_blocks]
            del free_block_ids[:num_blocks]
            request.window_block_ids = window_ids[index]
            request.num_computed_tokens = context
            scheduled.append(ScheduledRequest(request, num_new + num_drafts, num_drafts, context))
            if num_drafts:
                chains[request.request_id] = self._tokens(num_drafts)
        num_batched_tokens = sum(s.num_new_tokens for s in scheduled)
        sched = SchedulerOutput(tuple(scheduled), num_batched_tokens=num_batched_tokens)
        draft_seconds = 0.0
        if draft_passes is not None and num_draft_passes > 0:
            draft_seconds = draft_passes(
                scheduled, num_draft_passes, self._tokens, num_catchup_tokens
            )
        output = self.runner.execute(sched, Drafts(chains=chains))
        self.num_steps += 1
        return output.step_time + draft_seconds

    def _fake_request(self, index: int, num_tokens: int) -> Request:
        return Request(f"__profile-{self.num_steps}-{index}", self._tokens(num_tokens), _GREEDY)

    def _tokens(self, count: int) -> list[int]:
        return [self.rng.randrange(self.vocab_size) for _ in range(count)]


@functools.cache
def processor_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name (/proc/cpuinfo), or what platform knows."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

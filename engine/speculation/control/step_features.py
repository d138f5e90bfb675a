"""StepFeatures: the shape of one engine step as far as its cost is concerned, the input of
the step-time cost model (cost_model.py), and the synthetic grid the start-up profile times."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from dataclasses import dataclass

from kernels.graph_shapes import NO_GRAPHS, GraphShapes

# Batched-row knots of the cost model's piecewise-linear row term: a step's cost can jump
# between two row counts (measured on this CPU: 5 -> 6 rows, where the few-row matmul path
# ends), so the model gets one ramp per segment between consecutive knots.
ROW_KNOTS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048)
FEATURE_NAMES = (
    "intercept",
    "batched_tokens",
    *(f"rows_{lo}_{hi}" for lo, hi in zip(ROW_KNOTS, ROW_KNOTS[1:])),
    "requests",
    "kv_tokens",
    "draft_tokens",
    "draft_steps",
    "spec_requests",
    "eager_steps",
    "eager_rows",  # an eager step's rows: they cost it what the row terms cost a replayed one
    "catchup_tokens",  # tokens a draft model feeds to catch up before drafting
    # 1 when any request verifies drafts: what a verification step costs over a plain one
    # whatever drafts it carries (its host work, the logits of every draft row's request,
    # the verifying attention). On an H200 at 15-16 requests a drafting step ran a median
    # 0.59 ms over a plain one (a line through them: 0.46 ms + 0.008 ms a draft), priced at
    # a median +0.04 ms by the other terms (docs/benchmarks.md §4j); at one request it is
    # spec_requests' share.
    "verify_steps",
)


@dataclass(frozen=True)
class StepFeatures:
    """The shape of one step, as far as its cost is concerned."""

    num_batched_tokens: int = 0  # prefill chunks + (1 + k) per decoding request
    num_requests: int = 0
    num_kv_tokens: int = 0  # key/value positions attention reads, summed over requests
    num_draft_tokens: int = 0
    num_draft_steps: int = 0  # draft-model forward passes; 0 for model-free proposers
    num_spec_requests: int = 0  # requests verifying at least one draft token
    # 1 when the step cannot replay a captured CUDA graph although graphs are on (a prefill
    # chunk longer than the captured query rows, a tree, a batch past the largest graph: it
    # runs eagerly, several times a graph step on a GPU); 0 elsewhere.
    num_eager_steps: int = 0
    # Verified tokens a separate draft model feeds before drafting (all it missed since it last
    # ran, past each request's root): a term of its own, so that a probe after a long idle
    # spell is not read as slow draft passes.
    num_catchup_tokens: int = 0
    # The longest request's rows (1 + k for a decode, the chunk for a prefill) and, for a step
    # that replays a captured CUDA graph, the rows the graph computes: every request padded to
    # that longest query and the batch to a captured size (kernels/graph_shapes.py). One
    # request verifying 4 drafts beside 15 decodes makes the graph compute 16 x 5 rows, which
    # the cost model's row terms then see (0: no graph replays the step; the rows are
    # num_batched_tokens).
    max_query_len: int = 0
    num_graph_rows: int = 0

    @classmethod
    def from_shapes(
        cls,
        shapes: Iterable[tuple[int, int, int]],
        draft_model: bool = False,
        graphs: GraphShapes = NO_GRAPHS,
        num_catchup_tokens: int = 0,
    ) -> StepFeatures:
        """Build from (context_len, num_new_tokens, k) per request.

        context_len: tokens already in the KV cache; num_new_tokens: the prefill chunk or 1;
        k: draft tokens (tree nodes). A draft model drafts chains in lock-step and expands one
        tree node per request per pass, so it runs max(k) passes. graphs: the step shapes the
        runner replays (a tree proposer passes graphs.decode_only()); any other is eager.
        One pass over the shapes: the driver builds a step's features every step.
        """
        rows = kv = drafts = longest_k = spec = longest = num = 0
        query_lens = []
        for context, new, k in shapes:
            query = new + k
            rows += query
            kv += context + query
            num += 1
            if k:
                drafts += k
                spec += 1
                longest_k = max(longest_k, k)
            longest = max(longest, query)
            query_lens.append(query)
        eager = graphs.enabled and not graphs.replays(query_lens)
        return cls(
            num_batched_tokens=rows,
            num_requests=num,
            num_kv_tokens=kv,
            num_draft_tokens=drafts,
            num_draft_steps=longest_k if draft_model else 0,
            num_spec_requests=spec,
            num_eager_steps=int(eager),
            num_catchup_tokens=num_catchup_tokens,
            max_query_len=longest,
            num_graph_rows=graph_rows(graphs, num, longest, eager),
        )

    def with_drafts(
        self,
        num_draft_tokens: int,
        num_spec_requests: int,
        num_draft_steps: int = 0,
        graphs: GraphShapes = NO_GRAPHS,
        longest: int | None = None,
    ) -> StepFeatures:
        """These features plus drafts (each draft is one more batched and attended token).
        `longest`: the longest chain among the added drafts, which sets a replayed step's
        padding; by default the drafts spread evenly over the newly speculating requests
        (drafts added to requests already speculating stay within the step's padding).
        Drafts make a replayed step eager where graphs replay decodes alone, or where the
        longest query passes the captured rows."""
        if longest is None:
            longest = -(-num_draft_tokens // num_spec_requests) if num_spec_requests else 0
        query_len = max(self.max_query_len, 1 + longest if num_draft_tokens else 0)
        eager = (
            self.num_eager_steps
            or (graphs.eager_on_drafts and num_draft_tokens > 0)
            or (graphs.enabled and query_len > graphs.max_query_len)
        )
        return StepFeatures(
            num_batched_tokens=self.num_batched_tokens + num_draft_tokens,
            num_requests=self.num_requests,
            num_kv_tokens=self.num_kv_tokens + num_draft_tokens,
            num_draft_tokens=self.num_draft_tokens + num_draft_tokens,
            num_draft_steps=max(self.num_draft_steps, num_draft_steps),
            num_spec_requests=self.num_spec_requests + num_spec_requests,
            num_eager_steps=int(eager),
            num_catchup_tokens=self.num_catchup_tokens,
            max_query_len=query_len,
            num_graph_rows=graph_rows(graphs, self.num_requests, query_len, eager),
        )


def graph_rows(graphs: GraphShapes, num_requests: int, query_len: int, eager: bool) -> int:
    """The rows a replayed graph computes for the step (0 when none replays it)."""
    if eager or not graphs.enabled or not 0 < num_requests <= graphs.batch_sizes[-1]:
        return 0
    batch, rows = graphs.padded(num_requests, query_len)
    return batch * rows


def profile_grid(
    max_num_batched_tokens: int = 512,
    max_num_seqs: int = 64,
    max_draft_tokens: int = 4,
    max_context: int = 2048,
    draft_model: bool = False,
    seed: int = 0,
    graphs: GraphShapes = NO_GRAPHS,
    free_drafts: bool = False,
) -> list[StepFeatures]:
    """Synthetic step shapes spanning the features: decode batches of every size with chains
    of 0..max_draft_tokens drafts over short and long contexts, plus single prefill chunks;
    each marked eager or not as the runner's graphs will run it. With a draft model, also one
    request drafting after the draft model missed a few dozen or hundred tokens (its
    catch-up): without them the catch-up term is never fitted and a probe after a long idle
    spell is priced as free (docs/benchmarks.md §5k). `free_drafts` (a draft model beside
    model-free proposers): one and two requests' chains also without draft passes, as a
    model-free proposer drafts them; with every chain drafted by the model, k passes come
    with k drafts, and the fit can split their seconds between the passes and the verify
    rows as it likes (the Qwen pair's auto priced four n-gram drafts at +59 ms where they
    took +42, and drafted shorter chains than the n-gram proposer alone: §5zp)."""
    sizes = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n <= max_num_seqs]
    ks = sorted({0, 1, max_draft_tokens // 2, max_draft_tokens})
    contexts = sorted({16, max_context // 8, max_context})
    grid = []
    for size in sizes:
        # One and two requests get every k: there each extra row is a step of the row ramps,
        # and a CPU's rows-per-pass kernel makes some steps jump (without 4-row samples at
        # batch 1 a fit put +30 ms between 3 and 4 rows on the Qwen pair, where 1.7x -> 2.4x
        # of a decode step was measured from 3 to 5 rows: docs/benchmarks.md §4g).
        for k in range(max_draft_tokens + 1) if size <= 2 else ks:
            if size * (1 + k) > max_num_batched_tokens:
                continue
            for context in contexts:
                shape = (context, 1, k)
                grid.append(StepFeatures.from_shapes([shape] * size, draft_model, graphs))
                if free_drafts and draft_model and k and size <= 2:
                    grid.append(StepFeatures.from_shapes([shape] * size, False, graphs))
    for chunk in (16, 64, 128, 256, 512, 1024, 2048):
        if chunk <= max_num_batched_tokens:
            grid.append(StepFeatures.from_shapes([(0, chunk, 0)], graphs=graphs))
    if draft_model:
        drafting = StepFeatures.from_shapes([(max_context, 1, 1)], draft_model, graphs)
        for catchup in sorted({max_context // 8, max_context // 2} - {0}):
            grid.append(dataclasses.replace(drafting, num_catchup_tokens=catchup))
    random.Random(seed).shuffle(grid)
    return grid

"""The Proposer protocol every speculative proposer implements.

Per step the engine calls `propose` once for the batch (drafts follow each request's last
verified token, the root) and `observe` once after verification with each request's verified
step. A proposer keeps what it knows about a request in that request's memos (ProposeRequest
and Observation carry them: the request's SpecState.memos, under the proposer's name), so it
holds no map by request id and has nothing to free when a request finishes; the memos are
dropped when the request is preempted (its KV blocks are freed). engine/speculation/build.py
builds proposers by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from engine.outputs import Drafts, DraftTree, RequestStepOutput
    from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class ProposeRequest:
    """What a proposer needs to know about one request this step."""

    request_id: str
    token_ids: Sequence[int]  # prompt + verified output; the last one is the root of the drafts
    num_draft_tokens: int  # chain length budget, or tree node budget when tree=True
    tree: bool = False
    # Added for draft-model proposers (model-free proposers ignore them). A draft model samples
    # with the request's own sampling transforms and writes its K/V through the request's
    # block table, into the slots the scheduler reserved for this step's drafts.
    params: SamplingParams | None = None  # None: greedy
    num_prompt_tokens: int = 0  # token_ids[:num_prompt_tokens] is the prompt (penalty history)
    eos_token_ids: tuple[int, ...] = ()  # blocked before min_tokens, as in the target's sampler
    seed: int | None = None  # the request's effective seed; a draft RNG is derived from it
    block_ids: tuple[int, ...] = ()  # the request's KV cache blocks this step
    # Trees: (parent slot, rank) nodes best first, learned from verified trees
    # (engine/speculation/control/tree_shape.py); a proposer fills rank r with its r-th candidate.
    tree_template: tuple[tuple[int | None, int], ...] = ()
    proposer: str = ""  # proposer choice: the proposer the policy chose ("" = the only one)
    # Each proposer's own state of this request, under its name (the request's SpecState.memos).
    memos: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Observation:
    """One request's verified step, as proposers see it.

    step.token_ids: the newly verified tokens (accepted drafts + the bonus/correction token).
    step.target_topk_ids[i], when asked for (Proposer.target_topk), is the target's top-k
    next-token ids from the logits row that produced token_ids[i], so under greedy decoding
    its first id is token_ids[i]; that row's input token is token_ids[i - 1], or the previous
    root for i == 0. step.draft_topk_ids[j]: the same at the row whose input was draft j (the
    token the target predicts after it, in that draft's context).
    """

    step: RequestStepOutput
    draft_ids: tuple[int, ...] = ()  # this step's drafts (chain tokens or tree nodes), in row order
    memos: dict[str, Any] = field(default_factory=dict)  # as ProposeRequest.memos


@runtime_checkable
class Proposer(Protocol):
    name: str
    # How many of the target's top token ids observe() wants per verified token (0: none);
    # the engine passes it to the model runner through Drafts.target_topk.
    target_topk: int

    def propose(self, requests: Sequence[ProposeRequest]) -> Drafts:
        """Drafts per request: a chain of at most num_draft_tokens tokens, or a DraftTree of at most
        num_draft_tokens nodes when tree=True. A request with nothing to propose is left out."""
        ...

    def observe(self, observations: Sequence[Observation]) -> None:
        """The step's verified tokens, one Observation per request that got any. A proposer
        whose observe() does nothing says so with `observes = False` (optional, True when
        absent): the driver then builds no Observations for it, a sixth of its work on a
        step without drafts (docs/benchmarks.md §5zi)."""
        ...


def observes(proposer: Proposer) -> bool:
    """Whether the proposer learns from observe() (`observes`, True when absent)."""
    return getattr(proposer, "observes", True)


def collect_drafts(
    requests: Sequence[ProposeRequest],
    chain_of: Callable[[ProposeRequest], list[int]],
    tree_of: Callable[[ProposeRequest], DraftTree],
) -> Drafts:
    """Drafts for requests one at a time (model-free proposers): chain_of or tree_of per
    request with a budget; empty chains and trees are left out. Times itself."""
    from engine.outputs import Drafts

    start = time.perf_counter()
    chains: dict[str, list[int]] = {}
    trees: dict[str, DraftTree] = {}
    for request in requests:
        if request.num_draft_tokens <= 0:
            continue
        if request.tree:
            tree = tree_of(request)
            if tree.num_nodes:
                trees[request.request_id] = tree
        else:
            chain = chain_of(request)
            if chain:
                chains[request.request_id] = chain
    return Drafts(chains=chains, trees=trees, proposer_time=time.perf_counter() - start)


DRAFT_PROPOSER = "draft"  # the proposer that runs draft-model passes

"""The Proposer protocol every speculative proposer implements, and the registry that builds one.

Per step the engine calls `propose` once for the batch (drafts follow each request's last
verified token, the root), `observe` after verification with the newly verified tokens, and
`release` when a request finishes. Proposers keep per-request state keyed by request_id and
must drop it in `release`. engine/speculation/build.py builds them by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from engine.outputs import Drafts, DraftTree
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

    def observe(
        self,
        request_id: str,
        token_ids: Sequence[int],
        topk_ids: Sequence[Sequence[int]] | None,
        draft_ids: Sequence[int] = (),
        draft_topk_ids: Sequence[Sequence[int]] = (),
    ) -> None:
        """Newly verified tokens of one request (accepted drafts + the bonus/correction token).

        topk_ids[i], when given, is the target's top-k next-token ids from the same logits row
        that produced token_ids[i] (RequestStepOutput.target_topk_ids), so under greedy
        decoding topk_ids[i][0] == token_ids[i]. The row's input token is token_ids[i - 1],
        or the previous root for i == 0. draft_ids: this step's drafts (chain tokens or tree
        nodes, accepted or not); draft_topk_ids[j], when given, the target's top ids at the
        row whose input was draft j (the token the target predicts after it, in that draft's
        context).
        """
        ...

    def release(self, request_id: str) -> None:
        """The request finished, was aborted, or was preempted (its KV blocks were freed and
        it will be recomputed): forget its state."""
        ...


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

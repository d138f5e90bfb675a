"""Token Recycling proposer (Luo et al., arXiv 2408.08696): drafts from recycled target top-k.

An adjacency matrix [vocab, k] keeps, for every token t, the target's top-k next-token
candidates from the last time t was verified (row t is replaced with the latest top-k, as in
the paper). It is model-free, training-free and shared by all requests: int32 storage is
vocab * k * 4 bytes (1.5 MiB for SmolLM2's 49,152 tokens at k = 8, the paper's "<2MB").

Drafts grow from the request's root token. Chains follow the top-1 path adj[t][0]. Trees fill
an imbalanced template of (parent slot, rank) nodes enumerated best-first by path probability:
the engine passes one learned from verified trees (tree_shape.py); without it, the paper's
static prior over ranks gives one, wide near the root and deep along the top-1 path. A node's
token is adj[parent token][rank]; template nodes whose parent row was never observed (or whose
token repeats a sibling's) are dropped with their subtrees, and the first num_draft_tokens surviving
nodes form the tree, emitted in breadth-first order. The one thing kept per request is its last
verified token (the root the next step's top-k rows follow), in the request's memos.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.config import SpecConfig
from engine.outputs import Drafts, DraftTree
from engine.speculation.proposers.proposer import Observation, ProposeRequest, collect_drafts
from engine.speculation.proposers.tree_builders import TemplateNode, best_first_template

NUM_CANDIDATES = 8
# Static guess of P(rank-r candidate is accepted | parent accepted); only the order matters much.
DEFAULT_RANK_PRIOR = (0.5, 0.16, 0.08, 0.05, 0.035, 0.025, 0.02, 0.015)
MAX_TEMPLATE_NODES = 512  # spare template nodes replace dropped ones (spec_tree_nodes <= 256)


class RecycleProposer:
    """Engine-wide adjacency of recycled target top-k candidates; chain and tree drafts."""

    name = "recycle"

    def __init__(
        self,
        vocab_size: int,
        num_candidates: int = NUM_CANDIDATES,
        rank_prior: Sequence[float] = DEFAULT_RANK_PRIOR,
        max_template_nodes: int = MAX_TEMPLATE_NODES,
    ) -> None:
        _check_args(vocab_size, num_candidates, rank_prior)
        self.vocab_size = vocab_size
        self.num_candidates = num_candidates
        self.target_topk = num_candidates  # the target's top ids it recycles per token
        # adjacency[t, :row_lengths[t]] are token t's candidates, best first; length 0 = unseen.
        self.adjacency = np.zeros((vocab_size, num_candidates), dtype=np.int32)
        self.row_lengths = np.zeros(vocab_size, dtype=np.uint8)
        prior = rank_prior[:num_candidates]
        self._template = best_first_template(
            lambda depth, rank: prior[rank] if rank < len(prior) else 0.0, max_template_nodes
        )[0]

    @classmethod
    def from_config(
        cls, config: SpecConfig, vocab_size: int | None = None, **runtime: Any
    ) -> RecycleProposer:
        if vocab_size is None:
            raise ValueError("the recycle proposer needs the model's vocab_size")
        return cls(vocab_size=vocab_size)

    @property
    def num_bytes(self) -> int:
        return self.adjacency.nbytes + self.row_lengths.nbytes

    def candidates(self, token_id: int) -> list[int]:
        """Token token_id's recycled next-token candidates, best first ([] if never seen)."""
        if not 0 <= token_id < self.vocab_size:
            return []
        return self.adjacency[token_id, : self.row_lengths[token_id]].tolist()

    def observe(self, observations: Sequence[Observation]) -> None:
        for observation in observations:
            self._observe(observation)

    def _observe(self, observation: Observation) -> None:
        """Row of the input token of each verified position <- that position's top-k.

        target_topk_ids[i] came from the logits row whose input was token_ids[i - 1] (the
        previous root for i == 0; unknown before this request's first propose or observe
        after a preemption, so then skipped).
        """
        step, memos = observation.step, observation.memos
        token_ids = step.token_ids
        if step.target_topk_ids:
            previous = memos.get(self.name)
            for i, topk in enumerate(step.target_topk_ids[: len(token_ids)]):
                input_id = previous if i == 0 else token_ids[i - 1]
                if input_id is not None:
                    self._update_row(int(input_id), topk)
        # Rejected drafts were verified too: their rows hold the target's top-k after them.
        for draft_id, topk in zip(observation.draft_ids, step.draft_topk_ids):
            self._update_row(int(draft_id), topk)
        if len(token_ids):
            memos[self.name] = int(token_ids[-1])

    def _update_row(self, token_id: int, topk: Sequence[int]) -> None:
        if not 0 <= token_id < self.vocab_size:
            return
        # dict.fromkeys: valid ids, first occurrence kept, rank order preserved.
        valid = dict.fromkeys(int(t) for t in topk if 0 <= t < self.vocab_size)
        candidates = list(valid)[: self.num_candidates]
        self.adjacency[token_id, : len(candidates)] = candidates
        self.row_lengths[token_id] = len(candidates)

    def propose(self, requests: Sequence[ProposeRequest]) -> Drafts:
        for request in requests:  # the root is remembered even when nothing is drafted
            if len(request.token_ids):
                request.memos[self.name] = int(request.token_ids[-1])
        asks = [r for r in requests if len(r.token_ids)]
        return collect_drafts(
            asks,
            lambda r: self.greedy_chain(int(r.token_ids[-1]), r.num_draft_tokens),
            lambda r: self.grow_tree(
                int(r.token_ids[-1]), r.num_draft_tokens, r.tree_template or None
            ),
        )

    def greedy_chain(self, root_id: int, num_draft_tokens: int) -> list[int]:
        """The top-1 path root -> adj[root][0] -> ..., stopping at an unseen row."""
        chain: list[int] = []
        token_id = root_id
        while len(chain) < num_draft_tokens:
            candidates = self.candidates(token_id)
            if not candidates:
                break
            token_id = candidates[0]
            chain.append(token_id)
        return chain

    def grow_tree(
        self, root_id: int, num_nodes: int, template: Sequence[TemplateNode] | None = None
    ) -> DraftTree:
        """Instantiate a template from the root: the learned one the engine passes
        (tree_shape.py), else the static one (see the module docstring)."""
        rows: dict[int, list[int]] = {}
        # Per template slot: (token, parent slot, rank) of the surviving nodes, in template order.
        kept: dict[int, tuple[int, int | None, int]] = {}
        sibling_tokens: dict[int | None, set[int]] = {}
        for slot, (parent_slot, rank) in enumerate(template or self._template):
            if len(kept) >= num_nodes:
                break
            if parent_slot is not None and parent_slot not in kept:
                continue  # its parent was dropped
            parent_token = root_id if parent_slot is None else kept[parent_slot][0]
            if parent_token not in rows:
                rows[parent_token] = self.candidates(parent_token)
            row = rows[parent_token]
            if rank >= len(row) or row[rank] in sibling_tokens.setdefault(parent_slot, set()):
                continue
            sibling_tokens[parent_slot].add(row[rank])
            kept[slot] = (row[rank], parent_slot, rank)
        return _breadth_first(kept)


def _breadth_first(kept: dict[int, tuple[int, int | None, int]]) -> DraftTree:
    """Renumber template slots into a DraftTree in breadth-first order (also topological).

    Siblings keep template order; each node keeps its candidate rank (DraftTree.ranks), which
    its sibling index is not where a rank was skipped (a duplicate or a short row).
    """
    children: dict[int | None, list[int]] = {}
    for slot, (_, parent_slot, _) in kept.items():
        children.setdefault(parent_slot, []).append(slot)
    token_ids: list[int] = []
    parent_ids: list[int | None] = []
    node_of_slot: dict[int, int] = {}
    queue: list[int | None] = [None]
    for parent_slot in queue:  # the list grows while it is walked: a BFS queue
        for slot in children.get(parent_slot, ()):
            node_of_slot[slot] = len(token_ids)
            token_ids.append(kept[slot][0])
            parent_ids.append(None if parent_slot is None else node_of_slot[parent_slot])
            queue.append(slot)
    ranks = tuple(kept[slot][2] for slot in sorted(node_of_slot, key=node_of_slot.get))
    return DraftTree(tuple(token_ids), tuple(parent_ids), ranks)


def _check_args(vocab_size: int, num_candidates: int, rank_prior: Sequence[float]) -> None:
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if not 1 <= num_candidates <= min(255, len(rank_prior)):
        raise ValueError(
            f"num_candidates must be in 1..{min(255, len(rank_prior))} (one prior per rank), "
            f"got {num_candidates}"
        )
    prior = list(rank_prior[:num_candidates])
    if not all(0 < p < 1 for p in prior) or prior != sorted(prior, reverse=True):
        raise ValueError(f"rank_prior must be non-increasing values in (0, 1), got {prior}")

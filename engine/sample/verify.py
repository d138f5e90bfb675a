"""Lossless verification of one request's drafts against the target's own tokens (DESIGN §5).

Rows over a request's step are [root, drafts...] (chains) or [root, node 0, node 1, ...]
(trees): row 0 predicts the token after the root (the last verified token), the row of draft j
(node n) predicts the token after it. For every row the target token is what the target would
emit at that position with speculation off:
    greedy   the argmax of the processed logits;
    sampled  the winner of the exponential race over the processed distribution p keyed by
             (seed, t), where t is the position of the predicted token (engine/sample/rng.py;
             rows at the same tree depth share t).
Verification accepts drafts while they equal the target token of the row before them and emits
the target token of the last accepted row (the correction, or the bonus after a fully accepted
chain). Every emitted token is therefore exactly the token plain decoding emits at that
position with the same race: lossless for greedy and sampled requests, and a seeded request
gives the same text with speculation off, at any k, alone or batched.

What a draft costs in acceptance: a deterministic proposer (n-gram, Token Recycling, a top-k
draft tree) proposing x at a row with distribution p is accepted with probability p(x), as in
rejection sampling with a point-mass q. A draft model that races q with the same noise
(engine/speculation/proposers/draft_model.py) is accepted with probability at least
(1 - TV(p, q)) / (1 + TV(p, q)) (Daliri, Musco & Suresh 2025), measured at 0.75-0.99 of the
1 - TV of Leviathan et al.'s rule; its tree children are the first finishers of q's race.

Trees: from the root, move to the child whose token equals the current row's target token
(siblings are distinct tokens; among equal ones the lower index wins), until no child matches.
This module is pure Python: the targets come from engine/sample/batch_verify.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.outputs import DraftTree
from engine.sample.tree import path_to


@dataclass(frozen=True)
class VerifyResult:
    token_ids: tuple[int, ...]  # accepted drafts, then one correction or bonus token
    accepted_node_ids: tuple[int, ...]  # tree nodes (chains: draft indices) on the accepted path

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_node_ids)


def verify_chain(target_ids: Sequence[int], draft_ids: Sequence[int]) -> VerifyResult:
    """target_ids: the target token of rows [root, drafts...] (1 + len(draft_ids) ids)."""
    _check_rows(len(target_ids), len(draft_ids) + 1, "1 + number of drafts")
    num_accepted = 0
    while num_accepted < len(draft_ids) and draft_ids[num_accepted] == target_ids[num_accepted]:
        num_accepted += 1
    tokens = (*draft_ids[:num_accepted], target_ids[num_accepted])
    return VerifyResult(tuple(int(t) for t in tokens), tuple(range(num_accepted)))


def verify_tree(tree: DraftTree, target_ids: Sequence[int]) -> VerifyResult:
    """target_ids: the target token of rows [root, node 0, ...] (1 + tree.num_nodes ids).

    The accepted path is the longest root-to-node path whose every token equals the target
    token of its parent's row; with distinct sibling tokens there is at most one such path.
    """
    _check_rows(len(target_ids), tree.num_nodes + 1, "1 + number of tree nodes")
    depths = tree.depths()
    matched = [False] * tree.num_nodes
    best: int | None = None
    for node, (token_id, parent) in enumerate(zip(tree.token_ids, tree.parent_ids)):
        parent_ok = parent is None or matched[parent]
        matched[node] = parent_ok and token_id == target_ids[0 if parent is None else parent + 1]
        if matched[node] and (best is None or depths[node] > depths[best]):
            best = node
    path = path_to(tree, best)
    next_token = target_ids[0 if best is None else best + 1]
    return VerifyResult((*(tree.token_ids[n] for n in path), int(next_token)), tuple(path))


def _check_rows(got: int, expected: int, rule: str) -> None:
    if got != expected:
        raise ValueError(f"target rows: expected {expected} ({rule}), got {got}")

"""DraftModelProposer: speculative drafts from a second, smaller model, or a self-draft.

Per step (DESIGN §1 step 3), for the requests given draft slots:
  chains: one catch-up forward over the verified tokens the draft has not seen yet, root
          included (a multi-token query, like a chunked prefill), whose last row gives q_0;
          then k - 1 batched single-token forwards, one per draft position, for every request
          still drafting (batched drafting).
  trees:  the same catch-up, then rounds of best-first expansion (engine.speculation.proposers.tree_builders):
          each round every request adds its best frontier candidates and one batched forward
          scores the children of the node it chose to expand. That node is fed as the path
          root..node at positions root, root + 1, ..., so the plain causal mask over those
          contiguous positions is exactly the tree's ancestor mask.

Sampling: draft token j is drawn from q_j = Sampler.process(draft logits) with the request's
own sampling row (engine.sample.batch_verify.sampling_row, with the drafts before j as
history): greedy requests draft the argmax, sampled ones the winner of q_j's exponential race
run with the very noise the target's race uses at that position (engine/sample/rng.py,
kernels/sampling.py), so the draft is the target's token with probability >= (1 - TV) /
(1 + TV). Tree children: greedy requests the draft's top-k, sampled ones the first finishers
of that race (Gumbel-top-k), each scored by its draft probability. Verification accepts a
draft iff it equals the target's token, which is lossless whatever the drafts are
(engine/sample/verify.py).

Draft K/V state (own cache only; a self-draft shares the target's): the draft's K/V is valid
for a request's first `num_computed` verified tokens, written through the block table seen
then. Only verified tokens count: the next catch-up re-feeds the accepted drafts (a short
chunk) rather than trusting K/V written for draft rows, so rejected drafts, trimmed blocks and
tree branches need no tracking. A changed block id (copy-on-write) cuts the valid prefix at
that block; preemption drops the state (it lives in the request's memos, which SpecDriver
clears).

Known limitation: a self-draft reads the target's cache before the runner performs this step's
copy-on-write block copies, so in the one step where a request's root block is copied (the
first write after an n > 1 fork) its drafts attend to an uncopied block and are poor. Only
acceptance suffers: the draft writes nothing outside the reserved slots, and verification is
unaffected.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import SpecConfig
from engine.outputs import Drafts, ScheduledRequest
from engine.sample.batch_verify import sampling_row
from engine.sample.rng import race_keys
from engine.sample.sampler import Sampler, SamplingRow
from engine.sampling_params import SamplingParams
from engine.speculation.proposers.draft_runner import DraftQuery, DraftRunner
from engine.speculation.proposers.proposer import Observation, ProposeRequest
from engine.speculation.proposers.tree_builders import TreeBuilder
from kernels.sampling import race_topk

_GREEDY = SamplingParams(temperature=0, max_tokens=None)


@dataclass
class _RequestState:
    num_computed: int = 0  # leading verified tokens whose draft K/V is valid (own cache)
    block_ids: tuple[int, ...] = ()  # the block table those K/V were written through


@dataclass(frozen=True)
class _RequestView:
    """The fields of a Request that engine.sample.batch_verify.sampling_row reads."""

    sampling_params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    eos_token_ids: tuple[int, ...]


class DraftModelProposer:
    name = "draft"
    target_topk = 0  # needs none of the target's top ids
    observes = False  # observe() does nothing: the next catch-up syncs from the token ids

    def __init__(self, runner: DraftRunner) -> None:
        self.runner = runner
        self.sampler = Sampler()

    @classmethod
    def from_config(
        cls, config: SpecConfig, runner: Any = None, **runtime: Any
    ) -> DraftModelProposer:
        """`runner` is the target's ModelRunner (the draft mirrors its KV layout)."""
        if runner is None:
            raise ValueError("the draft proposer needs the target model runner (runner=...)")
        if not config.draft_model:
            raise ValueError("speculative_proposer=draft needs --draft-model PATH or self:N")
        return cls(
            DraftRunner.from_target(
                config.draft_model, runner, config.draft_vocab, config.draft_weights
            )
        )

    # ---- the Proposer protocol -----------------------------------------------------------
    def propose(self, requests: Sequence[ProposeRequest]) -> Drafts:
        start = time.perf_counter()
        asks = [ask for ask in map(self._fit, requests) if ask is not None]
        catchup = sum(self.catchup_tokens(ask.memos, len(ask.token_ids)) for ask in asks)
        drafts = Drafts()
        chains = [ask for ask in asks if not ask.tree]
        if chains:
            self._propose_chains(chains, drafts)
        trees = [ask for ask in asks if ask.tree]
        if trees:
            self._propose_trees(trees, drafts)
        seconds = time.perf_counter() - start
        return dataclasses.replace(drafts, proposer_time=seconds, num_catchup_tokens=catchup)

    def warm(self, requests: Sequence[ProposeRequest]) -> int:
        """Feed each request's tokens (a prefill chunk's end) the draft has no K/V for, in one
        forward, without drafting; returns how many were fed. A self-draft has nothing to do."""
        if self.runner.shares_target_cache:
            return 0
        limit = self.runner.max_positions
        queries = [self._catch_up(ask) for ask in requests if 0 < len(ask.token_ids) <= limit]
        if queries:
            self.runner.logits(queries)
        return sum(len(query.token_ids) for query in queries)

    def catchup_tokens(self, memos: dict, num_tokens: int) -> int:
        """Verified tokens the next catch-up feeds past the root (all since the draft last ran,
        the whole context on a first run; 0 for a self-draft). Ignores a block id changed by
        copy-on-write, which feeds a block more."""
        if self.runner.shares_target_cache or num_tokens == 0:
            return 0
        state = memos.get(self.name)
        return num_tokens - 1 - min(state.num_computed if state else 0, num_tokens - 1)

    def observe(self, observations: Sequence[Observation]) -> None:
        return None  # the next catch-up syncs from ProposeRequest.token_ids

    # ---- the start-up profile --------------------------------------------------------------
    def time_passes(
        self,
        scheduled: Sequence[ScheduledRequest],
        num_passes: int,
        random_tokens: Callable[[int], list[int]],
        num_catchup_tokens: int = 0,
    ) -> float:
        """Seconds of `num_passes` batched single-token passes over the scheduled requests'
        draft slots, as chains are drafted, synced as propose() is: the draft model's share
        of a synthetic step (engine/runner/step_timer.py; it writes only those slots). The
        first pass also feeds `num_catchup_tokens` (shared among the drafting requests, each
        at most its context) at the positions before the drafts, as a catch-up does; a
        draft that shares the target's cache never catches up, so it feeds none."""
        # (first draft slot's position, drafts, block ids) of each drafting request
        drafting = [
            (
                s.start + s.num_new_tokens - s.num_draft_tokens,
                s.num_draft_tokens,
                s.request.block_ids,
            )
            for s in scheduled
            if s.num_draft_tokens > 0
        ]
        left = 0 if self.runner.shares_target_cache else num_catchup_tokens
        catchups = [0] * len(drafting)
        by_room = sorted(range(len(drafting)), key=lambda i: drafting[i][0])
        for done, i in enumerate(by_room):  # the least room first: the rest take what it can't
            catchups[i] = min(drafting[i][0], -(-left // (len(drafting) - done)))
            left -= catchups[i]
        start = time.perf_counter()
        for j in range(num_passes):
            queries = [
                DraftQuery(random_tokens(1 + catchup), first - catchup, block_ids)
                if j == 0
                else DraftQuery(random_tokens(1), first + j, block_ids)
                for (first, num_drafts, block_ids), catchup in zip(drafting, catchups)
                if j < num_drafts
            ]
            if queries:
                self.runner.logits(queries).sum().item()
        return time.perf_counter() - start

    # ---- chains --------------------------------------------------------------------------
    def _propose_chains(self, asks: list[ProposeRequest], drafts: Drafts) -> None:
        histories: list[list[int]] = [[] for _ in asks]
        queries = [self._catch_up(ask) for ask in asks]
        active = list(range(len(asks)))
        while active:
            logits = self.runner.logits(queries)
            picked = [asks[i] for i in active]
            probs = self.sampler.process(logits, self._rows(picked, [histories[i] for i in active]))
            keys = self._race_keys(picked, [histories[i] for i in active])
            tokens = self.sampler.sample(probs, keys).tolist()
            for row, i in enumerate(active):
                histories[i].append(tokens[row])
            active = [i for i in active if len(histories[i]) < asks[i].num_draft_tokens]
            # Draft j (0-based) sits at position num_tokens + j, in a slot reserved for it.
            queries = [
                DraftQuery(
                    histories[i][-1:],
                    len(asks[i].token_ids) - 1 + len(histories[i]),
                    asks[i].block_ids,
                )
                for i in active
            ]
        for ask, chain in zip(asks, histories):
            drafts.chains[ask.request_id] = chain

    def _race_keys(
        self, asks: Sequence[ProposeRequest], histories: Sequence[list[int]]
    ) -> torch.Tensor | None:
        """The target's own race key for the position after each request's drafts so far (the
        same noise: the draft's token is the target's as often as the coupling allows); None
        when every request is greedy."""
        if all(_params(ask).greedy for ask in asks):
            return None
        seeds = [ask.seed or 0 for ask in asks]
        positions = [len(ask.token_ids) + len(history) for ask, history in zip(asks, histories)]
        return torch.from_numpy(race_keys(seeds, positions)).to(self.runner.device)

    # ---- trees ---------------------------------------------------------------------------
    def _propose_trees(self, asks: list[ProposeRequest], drafts: Drafts) -> None:
        builders = [TreeBuilder(ask.num_draft_tokens) for ask in asks]
        logits = self.runner.logits([self._catch_up(ask) for ask in asks])
        self._add_children(asks, builders, [None] * len(asks), logits)
        # fed[i]: the path whose K/V sits right after request i's root (positions num_tokens..)
        fed: list[list[int]] = [[] for _ in asks]
        while True:
            expand = [
                (i, node)
                for i, node in enumerate(map(_next_to_expand, builders))
                if node is not None
            ]
            if not expand:
                break
            queries = [
                self._path_query(asks[i], fed[i], builders[i].path(node)) for i, node in expand
            ]
            for i, node in expand:
                fed[i] = builders[i].path(node)
            self._add_children(
                [asks[i] for i, _ in expand],
                [builders[i] for i, _ in expand],
                [node for _, node in expand],
                self.runner.logits(queries),
            )
        for ask, builder in zip(asks, builders):
            if builder.num_nodes:
                drafts.trees[ask.request_id] = builder.tree()

    @staticmethod
    def _path_query(ask: ProposeRequest, fed: list[int], path: list[int]) -> DraftQuery:
        """Feed `path` (tokens after the root) from where it leaves the already fed path: the
        K/V of a shared prefix was computed with the same ancestors at the same positions.
        A new node is never on the fed path, so at least its own token is fed."""
        common = _num_same(fed, path)
        return DraftQuery(path[common:], len(ask.token_ids) + common, ask.block_ids)

    def _add_children(
        self,
        asks: list[ProposeRequest],
        builders: list[TreeBuilder],
        nodes: list[int | None],
        logits: torch.Tensor,
    ) -> None:
        """Push the draft's candidates after each node (None: the root) onto its frontier, with
        their draft probabilities: a greedy request's top ones, a sampled request's first
        finishers of the race the target runs at that position."""
        histories = [b.path(node) for b, node in zip(builders, nodes)]
        probs = self.sampler.process(logits, self._rows(asks, histories, for_scores=True))
        num_top = min(max(b.num_left for b in builders), probs.shape[-1])
        token_ids = probs.topk(num_top, dim=-1).indices
        keys = self._race_keys(asks, histories)
        if keys is not None:
            sampled = torch.tensor([not _params(ask).greedy for ask in asks], device=probs.device)
            raced = race_topk(probs, keys, num_top)
            token_ids = torch.where(sampled[:, None], raced, token_ids)
        values = probs.gather(-1, token_ids)
        for builder, node, row_values, row_ids in zip(
            builders, nodes, values.tolist(), token_ids.tolist()
        ):
            left = builder.num_left
            builder.add_candidates(node, row_ids[:left], row_values[:left])

    # ---- shared helpers ------------------------------------------------------------------
    def _fit(self, ask: ProposeRequest) -> ProposeRequest | None:
        """Cap the draft budget so every fed draft row has a RoPE position; None: no drafts.

        Chains feed drafts 0..k-2 at positions up to num_tokens + k - 2, trees feed paths of
        depth <= k - 1 from the root at num_tokens - 1: both need num_tokens + k - 2 < limit.
        """
        num_tokens = len(ask.token_ids)
        num_draft_tokens = min(ask.num_draft_tokens, self.runner.max_positions - num_tokens + 1)
        if num_tokens == 0 or num_draft_tokens <= 0:
            return None
        return (
            ask
            if num_draft_tokens == ask.num_draft_tokens
            else dataclasses.replace(ask, num_draft_tokens=num_draft_tokens)
        )

    def _catch_up(self, ask: ProposeRequest) -> DraftQuery:
        """The query feeding the verified tokens the draft has no K/V for, root included."""
        state = self._state(ask)
        num_tokens = len(ask.token_ids)
        if self.runner.shares_target_cache:
            start = num_tokens - 1  # the target holds the prefix's K/V for every layer
        else:
            same = _num_same(state.block_ids, ask.block_ids)
            start = min(state.num_computed, num_tokens - 1, same * self.runner.block_size)
            state.num_computed, state.block_ids = num_tokens, tuple(ask.block_ids)
        return DraftQuery(ask.token_ids[start:], start, ask.block_ids)

    def _state(self, ask: ProposeRequest) -> _RequestState:
        return ask.memos.setdefault(self.name, _RequestState())

    @staticmethod
    def _rows(
        asks: Sequence[ProposeRequest], histories: Sequence[list[int]], for_scores: bool = False
    ) -> list[SamplingRow]:
        """Each request's sampling row after its drafts so far. Tree scores of greedy requests
        use temperature 1 (a greedy row's probabilities are one-hot, useless for ranking)."""
        rows = []
        for ask, history in zip(asks, histories):
            params = _params(ask)
            if for_scores and params.greedy:
                params = dataclasses.replace(params, temperature=1.0)
            view = _RequestView(
                params,
                ask.token_ids[: ask.num_prompt_tokens],
                ask.token_ids[ask.num_prompt_tokens :],
                ask.eos_token_ids,
            )
            rows.append(sampling_row(view, history))  # type: ignore[arg-type]
        return rows


def _next_to_expand(builder: TreeBuilder) -> int | None:
    """Add the best frontier candidate as a node; its index if its children could still fit."""
    node = builder.pop()
    return node if node is not None and builder.num_left > 0 else None


def _params(ask: ProposeRequest) -> SamplingParams:
    return ask.params if ask.params is not None else _GREEDY


def _num_same(old: Sequence[int], new: Sequence[int]) -> int:
    """Length of the common prefix."""
    count = 0
    for a, b in zip(old, new):
        if a != b:
            break
        count += 1
    return count

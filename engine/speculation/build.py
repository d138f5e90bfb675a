"""Where speculation is put together: the one place that names every proposer and policy.

`build_spec_driver` is the engine's entry (the target's runner is needed once, to build the
proposer for it; its step timer seeds the cost model with a start-up profile);
`make_spec_driver`, `make_policy` and `make_proposer` are its parts, for tests and tools.
Proposer modules are imported by name, so choosing `ngram` never imports the draft model's
torch stack.
"""

from __future__ import annotations

import importlib
from typing import Any

from engine.config import SchedulerConfig, SpecConfig
from engine.speculation.control.cost_model import OnlineLinearCostModel, StepCostModel
from engine.speculation.control.goodput import GoodputPolicy
from engine.speculation.control.policy import FixedPolicy, OffPolicy, SpecPolicy
from engine.speculation.control.profiler import DraftPasses, StepTimer, seed_cost_model
from engine.speculation.control.tree_shape import TreeShapeEstimator
from engine.speculation.driver import SpecDriver, max_draft_tokens, speculates
from engine.speculation.proposers.proposer import DRAFT_PROPOSER, Proposer
from engine.speculation.proposers.proposer_set import ProposerSet
from engine.speculation.shadow import ShadowChecks
from kernels.graph_shapes import NO_GRAPHS, GraphShapes

# Proposer name -> "module:Class"; the class provides from_config(spec, **runtime).
_PROPOSERS: dict[str, str] = {
    "ngram": "engine.speculation.proposers.ngram:NgramProposer",
    "recycle": "engine.speculation.proposers.recycle:RecycleProposer",
    "draft": "engine.speculation.proposers.draft_model:DraftModelProposer",
}
_SPEC_HELP = "use 'off', 'fixed:K' with an integer K >= 0, or 'goodput'"


def build_spec_driver(
    config: SpecConfig, target: Any, limits: SchedulerConfig, timer: StepTimer
) -> SpecDriver:
    """The proposer built for `target` (the engine's ModelRunner: a draft model mirrors its KV
    layout), the cost model seeded by `timer`'s synthetic steps (goodput only)."""
    proposer = make_proposer(config, vocab_size=target.arch.vocab_size, runner=target)
    graphs = getattr(target, "graph_shapes", NO_GRAPHS)
    driver = make_spec_driver(
        config, proposer, limits.max_num_batched_tokens, limits.max_num_seqs, graphs
    )
    if driver.enabled and isinstance(driver.policy, GoodputPolicy):
        # Before any request exists, as the timer's safety invariant requires.
        driver.seed_report = seed_cost_model(
            driver.cost_model,
            timer,
            config,
            limits,
            driver.max_draft_tokens,
            draft_passes=_draft_passes(proposer),
            graphs=driver.graphs,
            free_drafts=any(name != DRAFT_PROPOSER for name in _members(proposer)),
        )
    return driver


def _members(proposer: Proposer | None) -> dict[str, Proposer]:
    """The proposers by name: a ProposerSet's members, or the one proposer (none: empty)."""
    if isinstance(proposer, ProposerSet):
        return proposer.proposers
    return {} if proposer is None else {proposer.name: proposer}


def _draft_passes(proposer: Proposer | None) -> DraftPasses | None:
    """The draft model's pass timer, when a draft model is among the proposers."""
    draft = _members(proposer).get(DRAFT_PROPOSER)
    return None if draft is None else draft.time_passes


def make_spec_driver(
    config: SpecConfig,
    proposer: Proposer | None,
    token_budget: int,
    max_num_seqs: int = 1 << 30,
    graphs: GraphShapes = NO_GRAPHS,
) -> SpecDriver:
    """A driver around `proposer` with the policy `config` names. graphs: the step shapes
    the runner replays as CUDA graphs (trees never replay)."""
    tree = config.spec_tree_nodes > 0
    graphs = graphs.decode_only() if tree else graphs
    # refits within a quarter percent of the steps' time: docs/benchmarks.md §5zi
    cost_model = OnlineLinearCostModel(refit_every=8, refit_share=0.0025)
    # Trees: the shape learned from verified trees, for the proposers and the policy.
    tree_shape = TreeShapeEstimator() if tree else None
    choice = len(config.proposers) > 1  # proposer is a ProposerSet
    policy = make_policy(
        config.policy if speculates(config, proposer) else "off",
        cost_model=cost_model,
        max_draft_tokens=max_draft_tokens(config),
        # goodput only: node budgets and draft passes change E(k) and T(batch)
        tree=tree,
        draft_model=DRAFT_PROPOSER in config.proposers,
        token_budget=token_budget,
        graphs=graphs,
        tree_shape=tree_shape,
        proposers=config.proposers if choice else (),
        # the model-free proposers' CPU seconds per request, as the ProposerSet measures them
        propose_seconds=proposer.seconds_per_request if choice else None,
    )
    return SpecDriver(
        config,
        proposer,
        policy,
        cost_model,
        tree_shape,
        token_budget,
        max_num_seqs,
        graphs,
        _shadow_checks(config, proposer, policy),
    )


def _shadow_checks(
    config: SpecConfig, proposer: Proposer | None, policy: SpecPolicy
) -> ShadowChecks | None:
    """The model-free proposers checked where they do not draft: goodput's chains only (its
    acceptance estimates are what the checks feed; a tree's outcome is not a chain's)."""
    if not config.spec_shadow_checks or config.spec_tree_nodes > 0:
        return None
    if not isinstance(policy, GoodputPolicy):
        return None
    free = {name: p for name, p in _members(proposer).items() if name != DRAFT_PROPOSER}
    if not free:
        return None
    # Checked, they need no forced probes (the estimate of a single proposer is named "").
    policy.exploration.shadowed = frozenset(free if policy.choice else ("",))
    return ShadowChecks(free)


def make_policy(
    spec: str,
    cost_model: StepCostModel | None = None,
    max_draft_tokens: int = 4,
    **goodput_options: Any,
) -> SpecPolicy:
    """Parse a policy spec: 'off' | 'fixed:K' | 'goodput'.

    `max_draft_tokens` caps the goodput policy (tokens per chain, or nodes per tree with tree=True);
    `goodput_options` go to GoodputPolicy. Without a cost model, goodput gets a fresh
    OnlineLinearCostModel that it warms up online.
    """
    text = spec.strip().lower() if isinstance(spec, str) else spec
    if text == "off":
        return OffPolicy()
    if isinstance(text, str) and text.startswith("fixed:"):
        value = text.removeprefix("fixed:").strip()
        if not value.isdigit():
            raise ValueError(f"spec policy {spec!r}: K must be an integer >= 0; {_SPEC_HELP}")
        return FixedPolicy(int(value))
    if text == "goodput":
        model = cost_model if cost_model is not None else OnlineLinearCostModel()
        return GoodputPolicy(model, max_draft_tokens, **goodput_options)
    raise ValueError(f"unknown spec policy {spec!r}; {_SPEC_HELP}")


def proposer_names() -> tuple[str, ...]:
    return ("none", *_PROPOSERS)


def make_proposer(config: SpecConfig, **runtime: Any) -> Proposer | None:
    """Build the proposer named by config.proposer, None for 'none', or a ProposerSet of
    config.proposers when it names several (proposer choice).

    `runtime` carries facts known only once the model is loaded (e.g. vocab_size for
    Token Recycling, the target model for a draft proposer); each proposer takes what it needs.
    """
    names = config.proposers
    if not names:
        return None
    built = {name: _build(name, config, runtime) for name in names}
    if len(built) == 1:
        return built[names[0]]
    return ProposerSet(built)


def _build(name: str, config: SpecConfig, runtime: dict[str, Any]) -> Proposer:
    target = _PROPOSERS.get(name)
    if target is None:
        raise ValueError(f"unknown speculative proposer {name!r}; known: {proposer_names()}")
    module_name, class_name = target.split(":")
    proposer_class = getattr(importlib.import_module(module_name), class_name)
    return proposer_class.from_config(config, **runtime)

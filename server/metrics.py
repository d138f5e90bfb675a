"""Prometheus collectors for one engine (DESIGN.md §9).

Every metric is named `goodspeed:<name>` and labelled `model_name`, so one Prometheus can scrape
several replicas and models. Each `EngineMetrics` owns its own `CollectorRegistry` (tests start
several servers in one process, and the default global registry would reject duplicate names).

Contract with the engine loop: `on_step` is called by the engine thread after every step with the
cumulative `EngineStats` snapshot and that step's `RequestOutput`s. Counters advance by the delta
of the cumulative engine counters since the previous call (a drop means a fresh engine, whose
value is then the delta). `render` may be called from any thread: prometheus-client locks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from engine.outputs import EngineStats, RequestOutput

PREFIX = "goodspeed:"

# Buckets cover a fast GPU (milliseconds per token) and a slow CPU (seconds per token) alike:
# roughly logarithmic from 1 ms to 80 s for per-token and per-step times ...
TOKEN_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# ... and from 10 ms to 30 min for whole requests (long CPU generations take minutes).
REQUEST_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1200.0, 1800.0,
)  # fmt: skip
# Speculation lengths are small integers; le="0" counts steps where speculation was switched off.
CHOSEN_K_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 64)

# EngineStats cumulative field -> our counter attribute (the counters mirror the engine's).
_COUNTER_FIELDS = {
    "prompt_tokens_total": "prompt_tokens",
    "num_preemptions_total": "num_preemptions",
    "prefix_cache_queries_total": "prefix_cache_queries",
    "prefix_cache_hits_total": "prefix_cache_hits",
    "spec_num_drafts_total": "spec_num_drafts",
    "spec_num_draft_tokens_total": "spec_num_draft_tokens",
    "spec_num_accepted_tokens_total": "spec_num_accepted_tokens",
}


# EngineStats.spec_proposer_totals entry index -> per-proposer counter (labelled `proposer`).
_PROPOSER_COUNTERS = {1: "drafts", 2: "draft_tokens", 3: "accepted_tokens"}


def _delta(current: int, previous: int) -> int:
    """Increase of a cumulative counter; a decrease means the engine restarted from zero."""
    return current - previous if current >= previous else current


@dataclass
class _Families:
    """The labelled metric families, registered once per registry."""

    gauges: dict[str, Gauge]
    counters: dict[str, Counter]
    histograms: dict[str, Histogram]
    request_success: Counter
    accepted_per_position: Counter
    by_proposer: dict[str, Counter]  # _PROPOSER_COUNTERS values -> counter


def _register(registry: CollectorRegistry) -> _Families:
    label = ("model_name",)

    def gauge(name: str, doc: str) -> Gauge:
        return Gauge(PREFIX + name, doc, label, registry=registry)

    def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        # prometheus-client appends the `_total` suffix itself.
        return Counter(PREFIX + name, doc, label + extra, registry=registry)

    def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(PREFIX + name, doc, label, buckets=buckets, registry=registry)

    gauges = {
        "num_requests_running": gauge("num_requests_running", "Requests in the running batch."),
        "num_requests_waiting": gauge("num_requests_waiting", "Requests queued or preempted."),
        "kv_cache_usage_perc": gauge("kv_cache_usage_perc", "Fraction of KV blocks in use (0-1)."),
        "goodput": gauge(
            "spec_decode_goodput_tokens_per_second",
            "Tokens emitted by the last step divided by its measured time.",
        ),
    }
    counters = {
        "prompt_tokens": counter("prompt_tokens", "Prompt tokens computed (cache hits excluded)."),
        "generation_tokens": counter("generation_tokens", "Output tokens returned to callers."),
        "num_preemptions": counter("num_preemptions", "Requests preempted for lack of KV blocks."),
        "prefix_cache_queries": counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        ),
        "prefix_cache_hits": counter("prefix_cache_hits", "Prompt tokens found in the cache."),
        "spec_num_drafts": counter("spec_decode_num_drafts", "Draft chains or trees verified."),
        "spec_num_draft_tokens": counter(
            "spec_decode_num_draft_tokens", "Draft tokens proposed and verified."
        ),
        "spec_num_accepted_tokens": counter(
            "spec_decode_num_accepted_tokens", "Draft tokens accepted by verification."
        ),
    }
    histograms = {
        "ttft": histogram(
            "time_to_first_token_seconds",
            "Arrival to first output token.",
            REQUEST_LATENCY_BUCKETS,
        ),
        "itl": histogram(
            "inter_token_latency_seconds",
            "Time between output tokens of a request (a step emitting n tokens counts n times).",
            TOKEN_LATENCY_BUCKETS,
        ),
        "e2e": histogram(
            "e2e_request_latency_seconds", "Arrival to finish.", REQUEST_LATENCY_BUCKETS
        ),
        "queue": histogram(
            "request_queue_time_seconds", "Arrival to first scheduled.", REQUEST_LATENCY_BUCKETS
        ),
        "step_time": histogram(
            "step_time_seconds", "Measured engine step time.", TOKEN_LATENCY_BUCKETS
        ),
        "step_time_predicted": histogram(
            "step_time_predicted_seconds",
            "Cost model's predicted time of the step it planned (observed when it predicted).",
            TOKEN_LATENCY_BUCKETS,
        ),
        "chosen_k": histogram(
            "spec_decode_chosen_k",
            "Speculation length chosen per running request per step.",
            CHOSEN_K_BUCKETS,
        ),
    }
    return _Families(
        gauges=gauges,
        counters=counters,
        histograms=histograms,
        request_success=counter(
            "request_success", "Finished requests by finish reason.", ("finished_reason",)
        ),
        accepted_per_position=counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by position in the draft (0 = first).",
            ("position",),
        ),
        by_proposer={
            "drafts": counter(
                "spec_decode_proposer_drafts", "Drafts verified, by proposer.", ("proposer",)
            ),
            "draft_tokens": counter(
                "spec_decode_proposer_draft_tokens",
                "Draft tokens proposed and verified, by proposer.",
                ("proposer",),
            ),
            "accepted_tokens": counter(
                "spec_decode_proposer_accepted_tokens",
                "Draft tokens accepted by verification, by proposer.",
                ("proposer",),
            ),
        },
    )


class EngineMetrics:
    """The engine's Prometheus metrics, fed by the engine thread and rendered for /metrics."""

    def __init__(
        self,
        model_name: str,
        registry: CollectorRegistry | None = None,
        proposers: Sequence[str] = (),
    ) -> None:
        self.model_name = model_name
        self.registry = registry if registry is not None else CollectorRegistry()
        self._families = _register(self.registry)
        self._bind_labels(proposers)
        self._previous = EngineStats()
        # request_id -> monotonic time of the request's latest output tokens (for ITL).
        self._last_token_time: dict[str, float] = {}

    def _bind_labels(self, proposers: Sequence[str]) -> None:
        # Pre-binding makes every series exist (at zero) from the first scrape, so dashboards
        # and `rate()` have data before the first request arrives (a fast engine can finish
        # a burst of requests between two scrapes: a series born inside it never shows a rise).
        name = self.model_name
        families = self._families
        self._gauges = {k: g.labels(model_name=name) for k, g in families.gauges.items()}
        self._counters = {k: c.labels(model_name=name) for k, c in families.counters.items()}
        self._histograms = {k: h.labels(model_name=name) for k, h in families.histograms.items()}
        for reason in ("stop", "length", "abort", "error"):
            families.request_success.labels(model_name=name, finished_reason=reason)
        for proposer in proposers:
            for counter in families.by_proposer.values():
                counter.labels(model_name=name, proposer=proposer)

    def on_step(self, stats: EngineStats, outputs: Sequence[RequestOutput], now: float) -> None:
        """Record one engine step; `now` is the monotonic time the outputs were produced."""
        stepped = self._advance_counters(stats)
        self._set_gauges(stats)
        if stepped:
            self._observe_step(stats)
        num_generated = sum(len(output.new_token_ids) for output in outputs)
        if num_generated:  # one increment per step: each takes the counter's lock
            self._counters["generation_tokens"].inc(num_generated)
        for output in outputs:
            self._observe_output(output, now)
        self._previous = stats

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of this registry and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _set_gauges(self, stats: EngineStats) -> None:
        self._gauges["num_requests_running"].set(stats.num_running)
        self._gauges["num_requests_waiting"].set(stats.num_waiting)
        self._gauges["kv_cache_usage_perc"].set(stats.kv_cache_usage)

    def _advance_counters(self, stats: EngineStats) -> bool:
        """Add the engine counters' deltas; return whether at least one step ran since last call."""
        previous = self._previous
        for field_name, key in _COUNTER_FIELDS.items():
            delta = _delta(getattr(stats, field_name), getattr(previous, field_name))
            if delta > 0:
                self._counters[key].inc(delta)
        old_positions = previous.spec_accepted_per_position_total
        for position, total in enumerate(stats.spec_accepted_per_position_total):
            before = old_positions[position] if position < len(old_positions) else 0
            delta = _delta(total, before)
            if delta > 0:
                self._families.accepted_per_position.labels(
                    model_name=self.model_name, position=str(position)
                ).inc(delta)
        self._advance_proposers(stats.spec_proposer_totals, previous.spec_proposer_totals)
        if stats.num_steps_total == 0:
            # An engine that does not count steps: every call with a measured time is a step.
            return stats.last_step_time > 0
        return stats.num_steps_total != previous.num_steps_total

    def _advance_proposers(self, totals: Sequence[tuple], previous: Sequence[tuple]) -> None:
        """Per-proposer counters (proposer choice): deltas of each proposer's totals."""
        before = {entry[0]: entry for entry in previous}
        for entry in totals:
            old = before.get(entry[0], (entry[0], 0, 0, 0))
            for index, key in _PROPOSER_COUNTERS.items():
                # Bound even at zero: the engine lists its proposers before they draft, so
                # each series exists (for rate()) from the first step on.
                counter = self._families.by_proposer[key]
                series = counter.labels(model_name=self.model_name, proposer=entry[0])
                delta = _delta(entry[index], old[index])
                if delta > 0:
                    series.inc(delta)

    def _observe_step(self, stats: EngineStats) -> None:
        if stats.last_step_time > 0:  # 0 = the engine did not measure this step
            self._histograms["step_time"].observe(stats.last_step_time)
        if stats.last_predicted_step_time is not None:
            self._histograms["step_time_predicted"].observe(stats.last_predicted_step_time)
        self._gauges["goodput"].set(stats.last_goodput)
        for k in stats.last_chosen_k:
            self._histograms["chosen_k"].observe(k)

    def _observe_output(self, output: RequestOutput, now: float) -> None:
        num_new = len(output.new_token_ids)
        if num_new:
            previous_time = self._last_token_time.get(output.request_id)
            if previous_time is not None:
                # Spread the gap evenly over the tokens a speculative step emitted at once.
                per_token = max(now - previous_time, 0.0) / num_new
                for _ in range(num_new):
                    self._histograms["itl"].observe(per_token)
            self._last_token_time[output.request_id] = now
        if output.finished:
            self._observe_finished(output)

    def _observe_finished(self, output: RequestOutput) -> None:
        self._last_token_time.pop(output.request_id, None)
        reason = output.finish_reason or "error"
        self._families.request_success.labels(
            model_name=self.model_name, finished_reason=reason
        ).inc()
        times = output.metrics
        arrival = times.get("arrival_time")
        if arrival is None:
            return
        spans = {
            "ttft": times.get("first_token_time"),
            "e2e": times.get("finished_time"),
            # Never scheduled (aborted or timed out in the queue): it queued until it finished.
            "queue": times.get("first_scheduled_time", times.get("finished_time")),
        }
        for key, end in spans.items():
            if end is not None:
                self._histograms[key].observe(max(end - arrival, 0.0))

"""EngineMetrics fed with hand-made EngineStats / RequestOutput sequences (no engine, no model)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.outputs import EngineStats, RequestOutput
from server.metrics import EngineMetrics

MODEL = "tiny"


def value(metrics: EngineMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value("goodspeed:" + name, {"model_name": MODEL, **labels})


def output(request_id: str, new: list[int], finished: bool = False, **kw) -> RequestOutput:
    return RequestOutput(request_id, [1, 2, 3], new, list(new), finished=finished, **kw)


def test_counters_advance_by_deltas_of_cumulative_stats() -> None:
    metrics = EngineMetrics(MODEL)
    cumulative = [
        EngineStats(num_steps_total=1, prompt_tokens_total=7, prefix_cache_queries_total=7),
        EngineStats(num_steps_total=2, prompt_tokens_total=7, prefix_cache_queries_total=12,
                    prefix_cache_hits_total=4, spec_num_drafts_total=1,
                    spec_num_draft_tokens_total=3, spec_num_accepted_tokens_total=2,
                    spec_accepted_per_position_total=(1, 1)),
        EngineStats(num_steps_total=3, prompt_tokens_total=20, num_preemptions_total=1,
                    prefix_cache_queries_total=12, prefix_cache_hits_total=4,
                    spec_num_drafts_total=3, spec_num_draft_tokens_total=9,
                    spec_num_accepted_tokens_total=5, spec_accepted_per_position_total=(3, 1, 1)),
    ]  # fmt: skip
    for now, stats in enumerate(cumulative):
        metrics.on_step(stats, [], float(now))
    assert value(metrics, "prompt_tokens_total") == 20
    assert value(metrics, "prefix_cache_queries_total") == 12
    assert value(metrics, "prefix_cache_hits_total") == 4
    assert value(metrics, "num_preemptions_total") == 1
    assert value(metrics, "spec_decode_num_drafts_total") == 3
    assert value(metrics, "spec_decode_num_draft_tokens_total") == 9
    assert value(metrics, "spec_decode_num_accepted_tokens_total") == 5
    per_pos = "spec_decode_num_accepted_tokens_per_pos_total"
    assert [value(metrics, per_pos, position=str(p)) for p in range(3)] == [3, 1, 1]


def test_engine_restart_counts_the_new_cumulative_value() -> None:
    metrics = EngineMetrics(MODEL)
    metrics.on_step(EngineStats(num_steps_total=5, prompt_tokens_total=100), [], 0.0)
    metrics.on_step(EngineStats(num_steps_total=1, prompt_tokens_total=8), [], 1.0)
    assert value(metrics, "prompt_tokens_total") == 108
    assert value(metrics, "step_time_seconds_count") == 0  # no measured time was given


def test_gauges_follow_the_latest_snapshot() -> None:
    metrics = EngineMetrics(MODEL)
    metrics.on_step(EngineStats(num_running=3, num_waiting=2, num_free_blocks=25,
                                num_total_blocks=100), [], 0.0)  # fmt: skip
    assert value(metrics, "num_requests_running") == 3
    assert value(metrics, "num_requests_waiting") == 2
    assert value(metrics, "kv_cache_usage_perc") == pytest.approx(0.75)
    metrics.on_step(EngineStats(num_total_blocks=100, num_free_blocks=100), [], 1.0)
    assert value(metrics, "num_requests_running") == 0
    assert value(metrics, "kv_cache_usage_perc") == 0


def test_step_histograms_observe_only_new_steps() -> None:
    metrics = EngineMetrics(MODEL)
    step = EngineStats(num_steps_total=1, last_step_time=0.25, last_predicted_step_time=0.2,
                       last_goodput=12.0, last_chosen_k=(0, 3, 4))  # fmt: skip
    metrics.on_step(step, [], 0.0)
    metrics.on_step(step, [], 0.1)  # same cumulative step count: an idle call, not a step
    assert value(metrics, "step_time_seconds_count") == 1
    assert value(metrics, "step_time_seconds_sum") == pytest.approx(0.25)
    assert value(metrics, "step_time_predicted_seconds_sum") == pytest.approx(0.2)
    assert value(metrics, "spec_decode_goodput_tokens_per_second") == 12.0
    assert value(metrics, "spec_decode_chosen_k_count") == 3
    assert value(metrics, "spec_decode_chosen_k_sum") == 7
    assert value(metrics, "spec_decode_chosen_k_bucket", le="0.0") == 1


def test_generation_tokens_and_inter_token_latency_from_outputs() -> None:
    metrics = EngineMetrics(MODEL)
    steps = [
        (10.0, [output("a", [5])]),  # first token of a: no inter-token gap yet
        (10.5, [output("a", [6, 7]), output("b", [9])]),  # a: 2 tokens in 0.5 s
        (11.5, [output("a", []), output("b", [8])]),  # b: 1 token in 1.0 s
    ]
    for now, outputs in steps:
        metrics.on_step(EngineStats(), outputs, now)
    assert value(metrics, "generation_tokens_total") == 5
    assert value(metrics, "inter_token_latency_seconds_count") == 3
    assert value(metrics, "inter_token_latency_seconds_sum") == pytest.approx(0.25 * 2 + 1.0)


def test_finished_request_latencies_and_reason() -> None:
    metrics = EngineMetrics(MODEL)
    times = dict(arrival_time=100.0, first_scheduled_time=100.5, first_token_time=101.0,
                 finished_time=104.0)  # fmt: skip
    done = output("a", [4], finished=True, finish_reason="length", metrics=times)
    aborted = output("b", [], finished=True, finish_reason="abort")  # no times: reason only
    metrics.on_step(EngineStats(), [done, aborted], 104.0)
    assert value(metrics, "request_success_total", finished_reason="length") == 1
    assert value(metrics, "request_success_total", finished_reason="abort") == 1
    assert value(metrics, "request_success_total", finished_reason="stop") == 0
    assert value(metrics, "time_to_first_token_seconds_sum") == pytest.approx(1.0)
    assert value(metrics, "e2e_request_latency_seconds_sum") == pytest.approx(4.0)
    assert value(metrics, "request_queue_time_seconds_sum") == pytest.approx(0.5)
    assert value(metrics, "e2e_request_latency_seconds_count") == 1
    assert not metrics._last_token_time  # finished requests are forgotten


def test_registries_are_independent_and_render_is_prometheus_text() -> None:
    first, second = EngineMetrics(MODEL), EngineMetrics(MODEL)
    first.on_step(EngineStats(num_running=4), [], 0.0)
    assert value(second, "num_requests_running") == 0
    body, content_type = first.render()
    assert content_type.startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(body.decode())}
    assert "goodspeed:num_requests_running" in names
    assert "goodspeed:time_to_first_token_seconds" in names
    assert 'goodspeed:num_requests_running{model_name="tiny"} 4.0' in body.decode()


def test_per_proposer_counters_advance_by_deltas_and_keep_the_totals() -> None:
    metrics = EngineMetrics(MODEL)
    cumulative = [
        EngineStats(num_steps_total=1, spec_num_drafts_total=2, spec_num_draft_tokens_total=6,
                    spec_num_accepted_tokens_total=3,
                    spec_proposer_totals=(("ngram", 1, 4, 3), ("draft", 1, 2, 0))),
        EngineStats(num_steps_total=2, spec_num_drafts_total=4, spec_num_draft_tokens_total=11,
                    spec_num_accepted_tokens_total=6,
                    spec_proposer_totals=(("ngram", 2, 7, 4), ("draft", 1, 2, 0),
                                          ("recycle", 1, 2, 2))),
    ]  # fmt: skip
    for now, stats in enumerate(cumulative):
        metrics.on_step(stats, [], float(now))

    def by_proposer(kind: str) -> dict[str, float | None]:
        name = f"spec_decode_proposer_{kind}_total"
        return {p: value(metrics, name, proposer=p) for p in ("ngram", "recycle", "draft")}

    assert by_proposer("drafts") == {"ngram": 2, "recycle": 1, "draft": 1}
    assert by_proposer("draft_tokens") == {"ngram": 7, "recycle": 2, "draft": 2}
    assert by_proposer("accepted_tokens") == {"ngram": 4, "recycle": 2, "draft": 0}
    assert value(metrics, "spec_decode_num_draft_tokens_total") == 11  # the totals still count
    assert value(metrics, "spec_decode_num_accepted_tokens_total") == 6


def test_listed_proposers_have_zero_series_before_the_first_step() -> None:
    # A burst can finish between two scrapes: a series born inside it would never show a rise.
    metrics = EngineMetrics(MODEL, proposers=("ngram", "draft"))
    for proposer in ("ngram", "draft"):
        for name in ("drafts", "draft_tokens", "accepted_tokens"):
            sample = f"spec_decode_proposer_{name}_total"
            assert value(metrics, sample, proposer=proposer) == 0
    assert (
        value(EngineMetrics(MODEL), "spec_decode_proposer_drafts_total", proposer="ngram") is None
    )

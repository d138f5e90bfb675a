"""Writes deploy/grafana/goodspeed.json, the Grafana dashboard for goodspeed's /metrics.

The dashboard is generated so that every panel is one readable line of PromQL here; edit this
file and run `python deploy/grafana/make_dashboard.py` (tests/deploy checks the two agree and
evaluates every expression against a real Prometheus scraping a real server).
Queries filter on the `model_name` variable and use `$__rate_interval`, which Grafana sizes
from the scrape interval.
"""

from __future__ import annotations

import json
from pathlib import Path

OUTPUT = Path(__file__).with_name("goodspeed.json")
SEL = '{model_name=~"$model_name"}'
RATE = "[$__rate_interval]"


def rate(metric: str, by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group}(rate(goodspeed:{metric}{SEL}{RATE}))"


def quantiles(histogram: str) -> list[tuple[str, str]]:
    return [
        (f"histogram_quantile({q}, {rate(histogram + '_bucket', 'le')})", f"p{round(q * 100)}")
        for q in (0.5, 0.9, 0.99)
    ]


def mean(histogram: str) -> str:
    return f"{rate(histogram + '_sum')} / {rate(histogram + '_count')}"


# One timeseries panel each: (title, unit, [(expr, legend)], description); three per grid row.
OVERVIEW = [
    ("Requests finished / s", "reqps",
     [(rate("request_success_total", "finished_reason"), "{{finished_reason}}")],
     "Finished requests per second by finish reason (stop, length, abort, error)."),
    ("Running and waiting requests", "short",
     [(f"sum(goodspeed:num_requests_running{SEL})", "running"),
      (f"sum(goodspeed:num_requests_waiting{SEL})", "waiting")],
     "Waiting includes preempted requests; a growing waiting count means add replicas."),
    ("KV cache usage", "percentunit",
     [(f"max by (instance)(goodspeed:kv_cache_usage_perc{SEL})", "{{instance}}")],
     "Fraction of KV blocks in use per replica; near 100% leads to preemptions."),
    ("Token throughput", "short",
     [(rate("prompt_tokens_total"), "prompt tokens/s"),
      (rate("generation_tokens_total"), "generation tokens/s")],
     "Prompt tokens computed (prefix-cache hits excluded) and output tokens returned, per second."),
    ("Preemptions / s", "short",
     [(rate("num_preemptions_total"), "preemptions/s")],
     "Requests evicted for lack of KV blocks (recomputed later)."),
    ("Prefix cache hit rate", "percentunit",
     [(f"{rate('prefix_cache_hits_total')} / {rate('prefix_cache_queries_total')}", "hit rate")],
     "Share of prompt tokens found in the prefix cache."),
]  # fmt: skip
LATENCY = [
    ("Time to first token", "s", quantiles("time_to_first_token_seconds"),
     "Arrival to first output token."),
    ("Inter-token latency", "s", quantiles("inter_token_latency_seconds"),
     "Gap between output tokens; a speculative step emitting n tokens counts n gaps of 1/n."),
    ("End-to-end request latency", "s", quantiles("e2e_request_latency_seconds"),
     "Arrival to finish."),
    ("Queue time", "s",
     [*quantiles("request_queue_time_seconds")[::2], (mean("request_queue_time_seconds"), "mean")],
     "Arrival to first scheduled step."),
]  # fmt: skip
SPECULATION = [
    ("Draft acceptance rate", "percentunit",
     [(f"{rate('spec_decode_num_accepted_tokens_total')}"
       f" / {rate('spec_decode_num_draft_tokens_total')}", "accepted / proposed")],
     "Share of proposed draft tokens that verification accepted."),
    ("Acceptance by draft position", "percentunit",
     [(f"{rate('spec_decode_num_accepted_tokens_per_pos_total', 'position')}"
       f" / ignoring(position) group_left {rate('spec_decode_num_drafts_total')}",
       "position {{position}}")],
     "Accepted tokens at each draft position per verified draft (0 = first draft token)."),
    ("Mean accepted length", "short",
     [(f"1 + {rate('spec_decode_num_accepted_tokens_total')}"
       f" / {rate('spec_decode_num_drafts_total')}", "tokens per verified draft")],
     "Tokens emitted per verification: accepted drafts plus the bonus/correction token."),
    ("Chosen speculation length", "short",
     [(mean("spec_decode_chosen_k"), "mean k"),
      (f"histogram_quantile(0.9, {rate('spec_decode_chosen_k_bucket', 'le')})", "p90 k")],
     "k chosen per running request per step by the goodput policy (0 = no drafts)."),
    ("Goodput", "short",
     [(f"avg by (instance)(avg_over_time(goodspeed:spec_decode_goodput_tokens_per_second{SEL}"
       f"{RATE}))", "{{instance}} tokens/s")],
     "Tokens emitted per second of step time, as the goodput policy sees it."),
    ("Step time: predicted vs measured", "s",
     [(mean("step_time_seconds"), "measured (mean)"),
      (mean("step_time_predicted_seconds"), "predicted (mean)"),
      (f"histogram_quantile(0.9, {rate('step_time_seconds_bucket', 'le')})", "measured p90")],
     "The cost model's prediction against the measured step time; they should track."),
    ("Draft acceptance rate by proposer", "percentunit",
     [(f"{rate('spec_decode_proposer_accepted_tokens_total', 'proposer')}"
       f" / {rate('spec_decode_proposer_draft_tokens_total', 'proposer')}", "{{proposer}}")],
     "Per proposer (n-gram, recycle, draft model): accepted / proposed draft tokens. With "
     "several proposers loaded the goodput policy picks one per request and step."),
    ("Draft tokens / s by proposer", "short",
     [(rate("spec_decode_proposer_draft_tokens_total", "proposer"), "{{proposer}}")],
     "Which proposer the goodput policy has drafting: proposed draft tokens per second."),
]  # fmt: skip
CHOSEN_K_HEATMAP = (
    "Chosen speculation length distribution",
    f"sum by (le)(increase(goodspeed:spec_decode_chosen_k_bucket{SEL}{RATE}))",
)


def timeseries(panel_id: int, spec: tuple, x: int, y: int) -> dict:
    title, unit, targets, description = spec
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, "min": 0}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def heatmap(panel_id: int, y: int) -> dict:
    title, expr = CHOSEN_K_HEATMAP
    return {
        "id": panel_id,
        "type": "heatmap",
        "title": title,
        "description": "How many request-steps chose each k (bucket upper bound) over time.",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 24, "x": 0, "y": y},
        "options": {"calculate": False, "yAxis": {"unit": "short"}, "cellGap": 1},
        "targets": [{"refId": "A", "expr": expr, "format": "heatmap", "legendFormat": "{{le}}"}],
    }


def panels() -> list[dict]:
    result: list[dict] = []
    y = 0
    for title, specs in (
        ("Overview", OVERVIEW),
        ("Latency", LATENCY),
        ("Speculation", SPECULATION),
    ):
        result.append({"id": len(result) + 1, "type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})  # fmt: skip
        y += 1
        for i, spec in enumerate(specs):
            result.append(timeseries(len(result) + 1, spec, 8 * (i % 3), y + 8 * (i // 3)))
        y += 8 * ((len(specs) + 2) // 3)
    result.append(heatmap(len(result) + 1, y))
    return result


def templating() -> dict:
    datasource = {"name": "datasource", "label": "Data source", "type": "datasource",
                  "query": "prometheus", "current": {}, "hide": 0}  # fmt: skip
    model = {
        "name": "model_name",
        "label": "Model",
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": "label_values(goodspeed:num_requests_running, model_name)",
                  "refId": "model_name"},
        "definition": "label_values(goodspeed:num_requests_running, model_name)",
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
        "hide": 0,
    }  # fmt: skip
    return {"list": [datasource, model]}


def dashboard() -> dict:
    return {
        "uid": "goodspeed",
        "title": "goodspeed",
        "description": "goodspeed inference server: load, latency, KV cache and speculation.",
        "tags": ["goodspeed", "llm", "inference"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "graphTooltip": 1,
        "annotations": {"list": []},
        "links": [],
        "templating": templating(),
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT}")

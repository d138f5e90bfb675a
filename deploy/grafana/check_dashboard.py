"""Static checks of the dashboard and alert rules against what goodspeed exports.

    python deploy/grafana/check_dashboard.py [--promql-rules OUT.yml]

1. goodspeed.json is exactly what make_dashboard.py generates (nobody hand-edited one of them);
2. every `goodspeed:` series that a dashboard query or an alert rule names is one that
   server.metrics.EngineMetrics exports (a renamed metric would otherwise show empty panels);
3. with --promql-rules, writes every dashboard query, Grafana variables substituted, as a
   Prometheus rule file so that `promtool check rules OUT.yml` parses each one.
The live check, every query returning data from a real Prometheus, is
tests/deploy/test_dashboard_prometheus.py.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DASHBOARD = HERE / "goodspeed.json"
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
SERIES = re.compile(r"goodspeed:[A-Za-z0-9_:]+")
# Grafana variables as a test or promtool must see them: all models, a window of some samples.
VARIABLES = {"$model_name": ".*", "$__rate_interval": "1m"}


def dashboard_exprs(dashboard: dict) -> list[str]:
    """Every target expression of every panel, rows' nested panels included."""
    exprs = []
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            exprs.extend(t["expr"] for t in inner.get("targets", []) if t.get("expr"))
    return exprs


def substitute(expr: str, variables: dict[str, str] = VARIABLES) -> str:
    for name, value in variables.items():
        expr = expr.replace(name, value)
    return expr


def rule_exprs() -> list[str]:
    exprs = []
    for path in sorted(RULES_DIR.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            exprs.extend(rule["expr"] for rule in group["rules"])
    return exprs


def exported_series() -> set[str]:
    """Sample names a scrape of EngineMetrics can contain (e.g. x_total, h_bucket, h_sum)."""
    sys.path.insert(0, str(ROOT))
    from server.metrics import EngineMetrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in EngineMetrics("check").registry.collect()
        for suffix in suffixes[family.type]
    }


def unknown_series(exprs: list[str], exported: set[str]) -> list[tuple[str, str]]:
    return [(name, expr) for expr in exprs for name in SERIES.findall(expr) if name not in exported]


def promql_rule_file(exprs: list[str]) -> str:
    rules = [{"record": f"goodspeed_dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    return yaml.safe_dump({"groups": [{"name": "dashboard_queries", "rules": rules}]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="check the Grafana dashboard and alert rules")
    parser.add_argument("--promql-rules", type=Path, help="write dashboard queries as rules here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from make_dashboard import render

    problems = []
    if DASHBOARD.read_text() != render():
        problems.append(f"{DASHBOARD.name} differs from make_dashboard.py: rerun the generator")
    dashboard = [substitute(e) for e in dashboard_exprs(json.loads(DASHBOARD.read_text()))]
    for name, expr in unknown_series(dashboard + rule_exprs(), exported_series()):
        problems.append(f"{name} is not exported by server/metrics.py (in: {expr})")
    if args.promql_rules:
        args.promql_rules.write_text(promql_rule_file(dashboard))
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"dashboard: {len(dashboard)} queries; rules: {len(rule_exprs())} expressions; "
          f"{len(problems)} problems")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

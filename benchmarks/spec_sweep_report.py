"""The policy x rate sweep's report: a markdown table per workload and a latency-vs-load plot
(spec_sweep.py writes both from its results JSON)."""

from __future__ import annotations

import argparse
from pathlib import Path

POLICIES = ("off", "fixed:1", "fixed:3", "fixed:5", "goodput")
MAX_K = 5  # --num-speculative-tokens: fixed:5 and goodput may use up to 5 drafts


def cell_row(cell: dict, baseline: dict | None) -> str:
    e2e, spec = cell["e2el_ms"], cell["spec"]
    ratio = f"{e2e['mean'] / baseline['e2el_ms']['mean']:.2f}" if baseline else "-"
    drafted = spec["spec_decode_num_draft_tokens_total"]
    accepted = f"{spec['spec_decode_num_accepted_tokens_total'] / drafted:.2f}" if drafted else "-"
    k_count = spec["spec_decode_chosen_k_count"]
    mean_k = f"{spec['spec_decode_chosen_k_sum'] / k_count:.2f}" if k_count else "-"
    return (
        f"| {cell['rate']:.3f} (x{cell['multiplier']:g}) | {cell['policy']} "
        f"| {e2e['mean'] / 1000:.2f} | {ratio} | {e2e['p50'] / 1000:.2f} | {e2e['p99'] / 1000:.2f} "
        f"| {cell['ttft_ms']['mean']:.0f} | {cell['tpot_ms']['mean']:.0f} "
        f"| {cell['output_throughput']:.1f} | {accepted} | {mean_k} | {cell['num_failed']} |"
    )


def markdown(results: dict, args: argparse.Namespace) -> str:
    cells = results["cells"]
    loads = [float(c["uptime"].split()[2].rstrip(",")) for c in cells]
    by = results.get("calibration_policy", {})
    scales = ", ".join(
        f"{w} {s:.2f} s (policy {by.get(w, 'off')})" for w, s in results["calibration_s"].items()
    )
    runs = "; ".join(f"`{r['command']}` ({r['date']})" for r in results["runs"])
    lines = [
        "## Policy sweep: latency vs load (goodspeed serve, n-gram drafts, chat completions)"
        + (" — quick smoke test, not a result" if args.quick else ""),
        "",
        f"Runs: {runs}. Machine: {results['machine']}; 1-minute load average during the "
        f"cells {min(loads, default=0):.1f}-{max(loads, default=0):.1f} (other work shares "
        f"the cores: compare policies within one run, not with other pages).",
        f"{results['num_prompts']} requests per cell, max_tokens {results['max_tokens']}, greedy, "
        f"prefix caching off, up to {MAX_K} drafts. Rate = multiplier / (mean latency of one "
        f"request alone): {scales}. Latencies in seconds, TTFT/TPOT in ms; "
        "'vs off' = mean latency / policy off's at the same rate; 'accepted' = accepted / "
        "drafted tokens; 'mean k' = mean chosen k per running request per step. Plot: "
        f"`{Path(args.plot).name}`.",
    ]
    header = "| rate req/s | policy | mean | vs off | p50 | p99 | TTFT | TPOT | out tok/s "
    header += "| accepted | mean k | failed |"
    for workload in dict.fromkeys(c["workload"] for c in cells):
        lines += ["", f"### {workload}", "", header, "|" + "---|" * 12]
        mine = [c for c in cells if c["workload"] == workload]
        order = {p: i for i, p in enumerate(POLICIES)}
        for cell in sorted(mine, key=lambda c: (c["multiplier"], order.get(c["policy"], 99))):
            baseline = next(
                (b for b in mine if b["policy"] == "off" and b["multiplier"] == cell["multiplier"]),
                None,
            )
            lines.append(cell_row(cell, baseline))
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(c["workload"] for c in results["cells"]))
    figure, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.5), squeeze=False)
    policies = list(POLICIES)
    policies += sorted({c["policy"] for c in results["cells"]} - set(POLICIES))  # goodput@...
    for axis, workload in zip(axes[0], workloads):
        for policy in policies:
            cells = sorted(
                (
                    c
                    for c in results["cells"]
                    if c["workload"] == workload and c["policy"] == policy
                ),
                key=lambda c: c["rate"],
            )
            if cells:
                rates = [c["rate"] for c in cells]
                latency = [c["e2el_ms"]["mean"] / 1000 for c in cells]
                axis.plot(rates, latency, marker="o", label=policy)
        rates = sorted({c["rate"] for c in results["cells"] if c["workload"] == workload})
        axis.set(xscale="log", xlabel="request rate (req/s, Poisson)", ylabel="mean latency (s)")
        axis.set_xticks(rates, [f"{rate:.2g}" for rate in rates])
        axis.minorticks_off()
        axis.set_title(f"{workload} workload")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    loads = [float(c["uptime"].split()[2].rstrip(",")) for c in results["cells"]]
    figure.suptitle(
        f"goodspeed speculation policies, SmolLM2-135M, {results['num_prompts']} requests per "
        f"point; {results['machine']}, load average {min(loads):.1f}-{max(loads):.1f}"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)

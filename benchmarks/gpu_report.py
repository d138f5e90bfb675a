"""gpu_bench.py's markdown: decode tok/s per backend and batch size, prefill, batch-1 bounds."""

from __future__ import annotations


def markdown(results: dict, meta: dict, limits: dict) -> str:
    names = list(results)
    sizes = list(next(iter(results.values()))["decode_tok_s"])
    base = results.get("reference")
    others = [n for n in names if n != "reference"] if base else []
    header = ["batch", *(f"{n} tok/s" for n in names), *(f"{n} / reference" for n in others)]
    lines = [
        f"# GPU decode benchmark ({meta['date']})",
        "",
        f"{meta['device']}, torch {meta['torch']}, flashinfer {meta['flashinfer']}; "
        f"{meta['model']}; context {meta['context']}, {meta['steps']} steps; "
        f"command: `{meta['command']}`",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for size in sizes:
        cells = [f"{results[n]['decode_tok_s'][size]:.1f}" for n in names]
        cells += [
            f"{results[n]['decode_tok_s'][size] / base['decode_tok_s'][size]:.2f}x" for n in others
        ]
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    prefill = [n for n in names if "prefill_tok_s" in results[n]]
    lines += ["", "| backend | prefill tok/s |", "|---|---|"]
    lines += [f"| {n} | {results[n]['prefill_tok_s']:.0f} |" for n in prefill]
    if limits:
        lines += [
            "",
            f"Batch-1 step with graphs: {limits['graphs_step_ms']:.2f} ms. HBM roofline: "
            f"{limits['weight_bytes'] / 1e9:.2f} GB of weights / {limits['hbm_bytes_per_s'] / 1e12:.2f} "
            f"TB/s = {limits['roofline_ms']:.2f} ms. Launch bound: {limits['kernels_per_step']} "
            f"kernels x {limits['graph_node_us']:.2f} us per graph node = "
            f"{limits['launch_bound_ms']:.2f} ms.",
        ]
    return "\n".join(lines) + "\n"

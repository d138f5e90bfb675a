"""Figures and markdown of benchmarks/vs_llamacpp.py: per-request runs summed into a server's
row, one table per scenario with ratios to llama.cpp, and a start-up and memory table.

Pure functions over plain dicts (the JSON the benchmark writes), so the report can be rebuilt
from a saved run and tested without servers.
"""

from __future__ import annotations

import statistics
from pathlib import Path

PLAIN = "llama"  # llama.cpp without speculation: the anchor of every ratio
LLAMA_SPEC = ("llama-spec", "llama-draft")  # its speculative configs; the best one is the bar
MIB = 2**20


def decode_rate(runs: list[dict]) -> float:
    """Batch-1 decode tok/s over the runs: (tokens - 1) / (last chunk - first chunk), summed,
    so prefill and the first token are left out."""
    tokens = sum(max(0, run["tokens"] - 1) for run in runs)
    seconds = sum(run["last"] - run["first"] for run in runs)
    return tokens / seconds if seconds > 0 else 0.0


def request_stats(runs: list[dict]) -> dict:
    """Time to first token, prompt lengths (usage.prompt_tokens) and speculation counts."""
    ttft = [run["first"] - run["start"] for run in runs if run["first"]]
    return dict(
        requests=len(runs),
        ttft=ttft,
        ttft_mean=statistics.fmean(ttft) if ttft else None,
        ttft_median=statistics.median(ttft) if ttft else None,
        prompt_tokens=[run["prompt_tokens"] for run in runs],
        drafted=sum(run.get("drafted", 0) for run in runs),
        accepted=sum(run.get("accepted", 0) for run in runs),
    )


def parse_status(text: str) -> dict:
    """Resident memory in bytes from /proc/<pid>/status: VmRSS and its anonymous part (heap,
    copies) and file part (mapped model files, shared with the page cache)."""
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}
    memory = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            memory[fields[key]] = int(value.split()[0]) * 1024  # "1234 kB"
    return memory


def best_llama_spec(row: dict) -> str | None:
    """The fastest of llama.cpp's speculative configs in a scenario's row, if any ran."""
    present = [name for name in LLAMA_SPEC if name in row]
    return max(present, key=lambda name: row[name]["tok_s"]) if present else None


def ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value and base else "-"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def span(values: list[int]) -> str:
    """'min-max' of the prompt lengths, or the one length."""
    if not values:
        return "-"
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def acceptance(stats: dict) -> str:
    return f"{stats['accepted'] / stats['drafted']:.2f}" if stats.get("drafted") else "-"


def scenario_table(scenario: str, row: dict, bound: float | None) -> list[str]:
    """One scenario: a line saying what its tok/s is, then a row per server."""
    b1 = scenario.endswith("-b1")
    best = best_llama_spec(row)
    plain, spec = row.get(PLAIN, {}), row.get(best, {}) if best else {}
    measure = "decode tok/s, prefill excluded" if b1 else "generated tokens / wall time"
    head = f"**{scenario}** ({measure}"
    head += f"; best llama.cpp speculation here: {best})" if best else ")"
    lines = [
        head,
        "",
        "| server | tok/s | of bound | / llama | / best llama spec | acceptance | TTFT mean s "
        "| TTFT median s | TTFT vs llama | prompt tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, stats in row.items():
        of_bound = f"{stats['tok_s'] / bound:.0%}" if b1 and bound else "-"
        lines.append(
            f"| {name} | {stats['tok_s']:.1f} | {of_bound} | {ratio(stats['tok_s'], plain.get('tok_s'))}"
            f" | {ratio(stats['tok_s'], spec.get('tok_s'))} | {acceptance(stats)}"
            f" | {seconds(stats['ttft_mean'])} | {seconds(stats['ttft_median'])}"
            f" | {ratio(plain.get('ttft_median'), stats['ttft_median'])}"
            f" | {span(stats['prompt_tokens'])} |"
        )
    return lines


def counterpart(name: str, servers: dict) -> str:
    """The llama.cpp server to weigh a server's start-up and memory against: the one that also
    loads the draft model for those that do, else plain llama."""
    if servers[name].get("draft") and "llama-draft" in servers:
        return "llama-draft"
    return PLAIN


def resources_table(servers: dict) -> list[str]:
    """Start-up (process start to /health 200) and resident memory, each server beside its
    llama.cpp counterpart."""
    lines = [
        "**Start-up and memory** (start-up: process start to /health 200, the GGUF in the page "
        "cache; RSS: VmRSS after a warm-up request and at the end, of which anonymous = not "
        "the mapped files; ratios to the llama.cpp server loading the same files)",
        "",
        "| server | start-up s | vs llama | RSS warm MiB | RSS end MiB | anon end MiB "
        "| RSS end vs llama |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, info in servers.items():
        base = servers.get(counterpart(name, servers), {})
        end, warm = info.get("rss_end", {}), info.get("rss_warm", {})
        lines.append(
            f"| {name} | {info['startup_s']:.1f} | {ratio(info['startup_s'], base.get('startup_s'))}"
            f" | {mib(warm.get('rss'))} | {mib(end.get('rss'))} | {mib(end.get('anon'))}"
            f" | {ratio(end.get('rss'), base.get('rss_end', {}).get('rss'))} |"
        )
    return lines


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.0f}"


def bound_line(bound: dict) -> str:
    return (
        f"Batch-1 decode bound: read bandwidth {bound['bandwidth'] / 1e9:.1f} GB/s (sum of a "
        f"1 GiB float32 tensor, {bound['threads']} threads, best of {bound['repeats']}) / "
        f"{bound['bytes_per_token'] / 1e9:.3f} GB read per token (every GGUF tensor but the "
        f"token embedding, which counts only as a tied head; KV cache left out) = "
        f"**{bound['tok_s']:.1f} tok/s**. 'of bound' = tok/s / bound; speculation can pass it "
        "(several tokens per read of the weights)."
    )


def header(results: dict) -> list[str]:
    args = results["args"]
    draft = f", draft `{Path(args['draft_model']).name}`" if args.get("draft_model") else ""
    return [
        f"### goodspeed vs llama.cpp's server: `{Path(results['model']).name}`{draft} (CPU)",
        "",
        f"`{results['command']}` — {results['date']}, {results['machine']}, "
        f"{results['load_average']} at the end; {args['threads']} threads each, greedy, EOS "
        f"ignored, streamed chat completions, {args['max_tokens']} new tokens "
        f"({args['prefill_max_tokens']} in prefill-b1). b1: {args['num_prompts']} prompts one "
        f"at a time, servers taking turns; cN: {args['concurrency']} concurrent clients x "
        f"{args['rounds']} rounds. TTFT = request sent to first content chunk; TTFT vs llama "
        "= llama's median / this median (> 1: faster). prefill-b1's prompts join 2-3 copy "
        "documents (500-1000 tokens). Server flags are in the JSON.",
        "",
    ]


def markdown(results: dict) -> str:
    lines = header(results)
    if results.get("bound"):
        lines += [bound_line(results["bound"]), ""]
    bound = (results.get("bound") or {}).get("tok_s")
    for scenario, row in results["results"].items():
        lines += [*scenario_table(scenario, row, bound), ""]
    lines += resources_table(results["servers"])
    return "\n".join(lines) + "\n"

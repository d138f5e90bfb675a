"""The helpers of benchmarks/vs_llamacpp.py (the comparison with llama.cpp's server): argument
parsing, server command lines, prompt building, chunk parsing, the decode bound, the report
tables, and that a server is stopped however its block ends. No model server runs here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from benchmarks import vs_llamacpp as bench
from benchmarks import vs_llamacpp_report as report
from benchmarks.decode_bound import (
    bytes_per_token,
    decode_bound,
    gguf_bytes_per_token,
    read_bandwidth,
)


def test_a_separate_head_is_read_and_the_embedding_is_not():
    tensors = [("token_embd.weight", 1000), ("output.weight", 700), ("blk.0.ffn_up.weight", 50)]
    assert bytes_per_token(tensors) == 750


def test_a_tied_head_reads_the_whole_embedding():
    tensors = [("token_embd.weight", 1000), ("blk.0.attn_q.weight", 50), ("output_norm", 2)]
    assert bytes_per_token(tensors) == 1052


def test_smollm2_reads_every_tensor_per_token(smollm2_path):
    from engine.models.gguf_file import read_gguf

    tensors = read_gguf(smollm2_path).tensors
    assert "output.weight" not in {t.name for t in tensors}  # tied head
    assert gguf_bytes_per_token(smollm2_path) == sum(t.data.nbytes for t in tensors)


def test_bound_is_bandwidth_over_bytes_per_token():
    assert decode_bound(30e9, 1.5e9) == pytest.approx(20.0)
    assert decode_bound(30e9, 0) == 0.0


def test_read_bandwidth_measures_something():
    assert read_bandwidth(threads=1, gib=1 / 256, repeats=2) > 1e8


def test_proc_status_gives_rss_and_its_parts():
    text = "Name:\tpython\nVmRSS:\t  2048 kB\nRssAnon:\t  1024 kB\nRssFile:\t 1000 kB\n"
    assert report.parse_status(text) == dict(rss=2 << 20, anon=1 << 20, file=1000 * 1024)
    assert report.parse_status(Path(f"/proc/{os.getpid()}/status").read_text())["rss"] > 0


def test_scenarios_take_the_old_c16_name_and_refuse_unknown_ones():
    assert bench.parse_scenarios("chat-b1,code-b1,chat-c16") == ["chat-b1", "code-b1", "chat-cN"]
    with pytest.raises(ValueError, match="unknown scenarios"):
        bench.parse_scenarios("chat-b1,edit-b1")


def test_servers_default_to_those_whose_models_are_given():
    assert not set(bench.parse_servers(None, None)) & set(bench.NEEDS_DRAFT)
    assert set(bench.parse_servers(None, "d.gguf")) == set(bench.NAMES)
    with pytest.raises(ValueError, match="need --draft-model"):
        bench.parse_servers("gs-off,llama-draft", None)
    with pytest.raises(ValueError, match="unknown servers"):
        bench.parse_servers("gs-off,vllm", None)


def test_draft_servers_name_the_draft_model_and_llama_its_draft_type():
    args = bench.parse_args(
        [
            "--llama-server",
            "LS",
            "--model",
            "t.gguf",
            "--draft-model",
            "d.gguf",
            "--concurrency",
            "8",
        ]
    )
    commands = bench.server_commands(args, 0)
    assert commands["llama-draft"][-4:] == ["--spec-type", "draft-simple", "-md", "d.gguf"]
    assert commands["llama-spec"][-2:] == ["--spec-type", "ngram-mod"]
    assert commands["llama"][commands["llama"].index("-np") + 1] == "8"
    draft = commands["gs-draft"]
    assert draft[draft.index("--speculative-proposer") + 1] == "draft"
    assert draft[draft.index("--draft-model") + 1] == "d.gguf"
    assert commands["gs-auto"][-2:] == ["--draft-model", "d.gguf"]
    assert bench.scenario_name("chat-cN", args) == "chat-c8"


def test_long_prompts_join_documents_from_the_end_within_the_bounds():
    copy = [f"Repeat:\n\n{chr(97 + i) * 1000}" for i in range(10)]
    prompts = bench.long_prompts(copy, 3, low=2400, high=3800)
    assert len(prompts) == 3
    assert prompts[0].startswith(bench.LONG_PROMPT + "j" * 1000)  # the last document first
    for prompt in prompts:
        assert 2400 <= len(prompt) - len(bench.LONG_PROMPT) <= 3800


def test_prefill_prompts_of_the_copy_workload_are_long():
    if not bench.WORKLOADS["copy"].is_file():
        pytest.skip("../shared/data is not beside the repository")
    prompts = bench.scenario_prompts("long", 6)
    assert len(prompts) == 6
    assert all(2400 <= len(p) <= 3800 + len(bench.LONG_PROMPT) + 20 for p in prompts)


def test_chunks_give_times_usage_and_speculation_of_both_servers():
    run = dict(tokens=0, prompt_tokens=0, drafted=0, accepted=0, first=0.0, last=0.0)
    bench.read_chunk({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, run)
    assert run["first"] == 0.0  # a role-only chunk is no token yet
    bench.read_chunk({"choices": [{"delta": {"content": "Hi"}}]}, run)
    bench.read_chunk({"choices": [{"delta": {"content": "!"}}]}, run)
    assert 0.0 < run["first"] <= run["last"]
    usage = dict(prompt_tokens=30, completion_tokens=2)
    bench.read_chunk({"choices": [], "usage": usage | {"speculation": SPEC}}, run)
    assert (run["prompt_tokens"], run["tokens"], run["drafted"], run["accepted"]) == (30, 2, 9, 5)
    bench.read_chunk({"choices": [], "timings": {"draft_n": 12, "draft_n_accepted": 7}}, run)
    assert (run["drafted"], run["accepted"]) == (12, 7)


SPEC = {"proposer": "ngram", "draft_tokens": 9, "accepted_tokens": 5, "verify_steps": 3}


def test_decode_rate_leaves_out_the_first_token_and_ttft_is_from_the_send():
    runs = [
        dict(start=0.0, first=1.0, last=2.0, tokens=11, prompt_tokens=500),
        dict(start=5.0, first=8.0, last=9.0, tokens=21, prompt_tokens=700),
    ]
    assert report.decode_rate(runs) == pytest.approx(15.0)
    stats = report.request_stats(runs)
    assert (stats["ttft_mean"], stats["ttft_median"]) == (2.0, 2.0)
    assert stats["prompt_tokens"] == [500, 700]


def row(tok_s: float, ttft: float, drafted: int = 0, accepted: int = 0) -> dict:
    return dict(
        tok_s=tok_s,
        ttft_mean=ttft,
        ttft_median=ttft,
        prompt_tokens=[500, 900],
        drafted=drafted,
        accepted=accepted,
    )


RESULTS = dict(
    date="2026-11-25T12:00:00",
    command="python benchmarks/vs_llamacpp.py",
    machine="CPU, 2 cores",
    load_average="load average 0.1, 0.1, 0.1",
    model="/m/qwen.gguf",
    args=dict(
        draft_model="/m/draft.gguf",
        threads=2,
        max_tokens=128,
        prefill_max_tokens=32,
        num_prompts=6,
        concurrency=8,
        rounds=2,
    ),
    bound=dict(bandwidth=31e9, bytes_per_token=1e9, threads=2, repeats=5, tok_s=31.0),
    servers={
        "gs-off": dict(startup_s=3.0, rss_warm=dict(rss=2 << 30), rss_end=dict(rss=3 << 30)),
        "gs-draft": dict(startup_s=6.0, draft=True, rss_end=dict(rss=4 << 30, anon=1 << 30)),
        "llama": dict(startup_s=1.0, rss_end=dict(rss=1 << 30)),
        "llama-draft": dict(startup_s=2.0, draft=True, rss_end=dict(rss=2 << 30)),
    },
    results={
        "code-b1": {
            "gs-off": row(10.0, 4.0),
            "gs-draft": row(40.0, 4.5, drafted=100, accepted=80),
            "llama": row(20.0, 2.0),
            "llama-spec": row(30.0, 2.0),
            "llama-draft": row(25.0, 2.2),
        },
        "chat-c8": {"gs-off": row(16.0, 9.0), "llama": row(32.0, 3.0)},
    },
)


def table_row(text: str, first_cell: str, after: str) -> list[str]:
    """The cells of the first row starting with `first_cell` below the line containing `after`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    line = next(line for line in lines[start:] if line.startswith(f"| {first_cell} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_kernels_are_built_before_any_server_starts_its_clock(monkeypatch):
    """A server that compiled the native kernels would report the build as its start-up."""
    calls = []
    monkeypatch.setattr(bench, "measure_bound", lambda args: None)
    monkeypatch.setattr(bench, "read_into_page_cache", lambda paths: calls.append("page cache"))
    monkeypatch.setattr(bench, "load_native", lambda: calls.append("kernels"))
    monkeypatch.setattr(
        bench, "start_all", lambda stack, commands, args: calls.append("servers") or {}
    )
    args = bench.parse_args(["--llama-server", "LS", "--scenarios", "chat-b1"])
    bench.bench(args)
    assert calls == ["page cache", "kernels", "servers"]


def test_tables_reach_the_docs_only_under_a_named_section(tmp_path, monkeypatch):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nearlier figures\n")
    monkeypatch.setattr(bench, "bench", lambda args: RESULTS)
    common = ["--llama-server", "LS", "--out", str(tmp_path / "r.json"), "--markdown", str(doc)]
    assert bench.main(common) == 0
    assert doc.read_text() == "# Benchmarks\n\nearlier figures\n"
    assert bench.main([*common, "--section", "this-run"]) == 0
    text = doc.read_text()
    assert "earlier figures" in text
    assert text.count("<!-- this-run:begin -->") == 1 and "llama-spec" in text


def test_markdown_scenario_tables_give_ratios_to_llama_and_its_best_speculation():
    text = report.markdown(RESULTS)
    assert "best llama.cpp speculation here: llama-spec" in text
    assert "**31.0 tok/s**" in text
    cells = table_row(text, "gs-draft", "**code-b1**")
    # tok/s, of bound, / llama, / best spec, acceptance, TTFT mean, median, vs llama, prompts
    assert cells[1:] == [
        "40.0",
        "129%",
        "2.00x",
        "1.33x",
        "0.80",
        "4.50",
        "4.50",
        "0.44x",
        "500-900",
    ]
    cells = table_row(text, "gs-off", "**chat-c8**")
    assert cells[2:5] == ["-", "0.50x", "-"]  # no bound share under load, no llama spec there


def test_markdown_resources_weigh_draft_servers_against_llama_draft():
    text = report.markdown(RESULTS)
    assert table_row(text, "gs-off", "Start-up and memory")[1:] == [
        *("3.0", "3.00x", "2048", "3072", "-", "3.00x"),
    ]
    assert table_row(text, "gs-draft", "Start-up and memory")[1:] == [
        *("6.0", "3.00x", "-", "4096", "1024", "2.00x"),
    ]


HEALTH_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_server_is_stopped_when_its_block_raises(tmp_path):
    with (
        pytest.raises(RuntimeError),
        bench.running("fake", [sys.executable, "-c", HEALTH_SERVER], tmp_path) as server,
    ):
        assert server.startup_s > 0
        pid = server.pid
        raise RuntimeError("benchmark failed")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_llama_server_gets_the_family_template_a_file_lacks(monkeypatch, tmp_path):
    from engine.models import gguf_file

    path = tmp_path / "g.gguf"
    path.write_bytes(b"")
    metadata = {"general.architecture": "gemma3"}
    fake = type("F", (), {"metadata": metadata})
    monkeypatch.setattr(gguf_file, "read_gguf", lambda _: fake)
    assert bench.llama_chat_template(str(path)) == ["--no-jinja", "--chat-template", "gemma"]
    metadata["tokenizer.chat_template"] = "{{ messages }}"
    assert bench.llama_chat_template(str(path)) == []
    metadata["general.architecture"] = "llama"
    del metadata["tokenizer.chat_template"]
    assert bench.llama_chat_template(str(path)) == []
    assert bench.llama_chat_template(str(tmp_path / "missing.gguf")) == []

"""Bookkeeping of benchmarks/fuzz_api.py: answers counted by phase, failures kept once each with
a reproducing body, the issue's poison requests sent beside normal ones, and the report."""

from __future__ import annotations

import asyncio
import datetime
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.report import load_average, machine_description, write_section
from tests.server.harness import wait_until

MAX_KEPT_CHARS = 300


@dataclass
class Phase:
    name: str
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    by_route: Counter = field(default_factory=Counter)  # (route, status class) -> answers
    failures: dict = field(default_factory=dict)  # (where, kind, message) -> reproducing input


@dataclass
class Tally:
    phases: list[Phase] = field(default_factory=list)

    def phase(self, name: str) -> Tally:
        self.phases.append(Phase(name))
        return self

    @property
    def current(self) -> Phase:
        return self.phases[-1]

    @property
    def failures(self) -> list[tuple]:
        return [(p.name, key, sent) for p in self.phases for key, sent in p.failures.items()]

    def fail(self, where: str, kind: str, message: str, sent: object) -> None:
        key = (where, kind, message[:120])
        self.current.failures.setdefault(key, repr(sent)[:MAX_KEPT_CHARS])

    def send(self, call, sent: object, path: str | None = None) -> None:
        """Make one request and judge the answer: no 5xx, 4xx in OpenAI's error shape."""
        phase = self.current
        phase.cases += 1
        where = path or f"{sent.method} {sent.path}"  # a Schemathesis case knows its route
        body = getattr(sent, "body", sent)
        try:
            response = call()
        except Exception as exc:  # a reset connection, a timeout: the server misbehaved
            phase.statuses["no answer"] += 1
            return self.fail(where, "no answer", f"{type(exc).__name__}: {exc}", body)
        status = response.status_code
        phase.statuses[f"{status // 100}xx"] += 1
        phase.by_route[where, f"{status // 100}xx"] += 1
        if status >= 500:
            return self.fail(
                where, str(status), response.content[:200].decode(errors="replace"), body
            )
        if status >= 400 and not _openai_shaped(response.content):
            self.fail(where, f"{status} not OpenAI-shaped", response.content[:120].decode(), body)

    def check_alive(self, server) -> None:
        """After everything: healthy, still serving, no sequence or KV block left behind."""
        self.phase("server after the run")
        with httpx.Client(base_url=server.url, timeout=60) as client:
            self.send(lambda: client.get("/health"), "GET /health", "/health")
            normal = {"prompt": [5, 6, 7], "max_tokens": 4}
            self.send(lambda: client.post("/v1/completions", json=normal), normal, "completion")
        stats = server.async_engine.stats
        if not wait_until(lambda: stats().num_free_blocks == stats().num_total_blocks, 30):
            self.fail("engine", "leak", f"{stats().num_free_blocks} of "
                      f"{stats().num_total_blocks} KV blocks free after the run", None)  # fmt: skip
        if server.async_engine.num_in_flight:
            self.fail("engine", "leak", f"{server.async_engine.num_in_flight} in flight", None)


def _openai_shaped(content: bytes) -> bool:
    try:
        error = json.loads(content)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return set(error) == {"message", "type", "param", "code"} and bool(error["message"])


# The requests of issue 16 that failed others or got a 500; `prompt` is filled in per engine.
POISON = [
    {"temperature": 1e-50},
    {"temperature": 1e-30, "top_p": 1e-300},
    {"top_k": 10**20},
    {"top_k": 2**63 - 1},
    {"logit_bias": {"²": 1}},
    {"stop_token_ids": [10**20]},
    {"repetition_penalty": 5e-324},
    {"prompt": [5] * 300, "max_tokens": 300},  # more than the tiny engine's KV pool
    {"prompt": [[5, 6]] * 128, "n": 128},
]


async def _completion(client: httpx.AsyncClient, body: dict) -> tuple[int, str]:
    response = await client.post("/v1/completions", json=body)
    choices = response.json().get("choices") if response.status_code == 200 else None
    return response.status_code, choices[0]["text"] if choices else response.text[:200]


def poison_phase(server, tally: Tally) -> None:
    """Each poison request sent at once with 4 normal ones: the normal texts must equal a run
    without the poison, the poison must get a 4xx or a sane completion."""
    normals = [
        {"prompt": [10 + i, 20 + i, 30 + i], "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        for i in range(4)
    ]

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            alone = await asyncio.gather(*(_completion(client, b) for b in normals))
            for poison in POISON:
                body = {"prompt": [7, 8, 9], "max_tokens": 8, **poison}
                tally.current.cases += 1
                results = await asyncio.gather(*(_completion(client, b) for b in [body, *normals]))
                (status, text), beside = results[0], results[1:]
                tally.current.statuses[f"poison {status // 100}xx"] += 1
                if status >= 500:
                    tally.fail("poison", str(status), text, body)
                if beside != alone:
                    tally.fail("poison", "changed a normal request", str(beside)[:120], body)

    asyncio.run(run())


def write_report(
    tally: Tally, engine: str, minutes: float, seconds: float, out: Path, repo: Path
) -> str:
    rows = [
        f"| {p.name} | {p.cases} | "
        + ", ".join(f"{k}: {v}" for k, v in sorted(p.statuses.items()))
        + f" | {len(p.failures)} |"
        for p in tally.phases
    ]
    routes = [
        f"- {p.name}: " + ", ".join(f"{r} {c}: {n}" for (r, c), n in sorted(p.by_route.items()))
        for p in tally.phases
        if p.by_route
    ]
    failures = [f"- {phase}: {key[0]} → {key[1]}: {key[2]}; input `{sent}`"
                for phase, key, sent in tally.failures] or ["- none"]  # fmt: skip
    body = "\n".join(
        [
            f"### API fuzzing, {engine} engine",
            "",
            f"`python benchmarks/fuzz_api.py --engine {engine} --minutes {minutes:g}` "
            f"on {machine_description()} ({load_average()}), "
            f"{datetime.date.today().isoformat()}, {seconds:.0f} s, "
            f"{sum(p.cases for p in tally.phases)} cases.",
            "",
            "| phase | cases | answers | distinct failures |",
            "|---|---:|---|---:|",
            *rows,
            "",
            "Answers by route:",
            *routes,
            "",
            "Failures:",
            *failures,
        ]
    )
    write_section(out, f"fuzz-api-{engine}", body, title="# Reliability")
    bench = repo / ".bench"
    bench.mkdir(exist_ok=True)
    record = {"engine": engine, "seconds": seconds, "time": time.time(), "report": body}
    (bench / f"fuzz_api_{engine}.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {out} and {bench}/fuzz_api_{engine}.json", file=sys.stderr)
    return body

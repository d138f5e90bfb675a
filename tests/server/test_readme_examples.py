"""The README's curl and openai examples run against a real server, so they cannot rot."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.server.harness import run_server

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[2] / "README.md"
DEFAULT_BASE = "http://127.0.0.1:8000"


def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def curl_commands() -> list[str]:
    commands = []
    for block in readme_blocks("bash"):
        for command in re.split(r"\n\s*\n", block.replace("\\\n", " ")):
            if command.strip().startswith("curl"):
                commands.append(command.strip())
    return commands


@pytest.fixture(scope="module")
def server(smollm2_path):
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    config = EngineConfig.from_flat(
        {"model": "smollm2-135m-instruct", "max_model_len": 1024, "num_kv_blocks": 96}
    )
    running = run_server(LLMEngine.from_config(config))
    yield running
    running.stop()


def test_readme_has_examples():
    assert len(curl_commands()) >= 2
    assert any("OpenAI(" in block for block in readme_blocks("python"))


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("index", range(2))
def test_curl_example_answers(server, index):
    command = curl_commands()[index].replace(DEFAULT_BASE, server.api.removesuffix("/v1"))
    result = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=120, check=True
    )
    body = json.loads(result.stdout)
    assert body["choices"], body
    choice = body["choices"][0]
    assert choice.get("text") or choice.get("message", {}).get("content"), body
    assert body["usage"]["completion_tokens"] > 0


def test_openai_example_runs(server, capsys):
    [block] = [b for b in readme_blocks("python") if "OpenAI(" in b]
    exec(compile(block.replace(f"{DEFAULT_BASE}/v1", server.api), "README", "exec"), {})
    assert capsys.readouterr().out.strip()

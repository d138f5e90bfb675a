"""server/cli.py load_engine: the model loads on a short-lived thread while this thread imports
the web stack and then reads the tokenizer, which it hands to the load; a failure on either
side reaches the caller and leaves no thread waiting."""

from __future__ import annotations

import threading

import pytest

from engine.llm_engine import LLMEngine
from engine.models import tokenizer as tokenizer_module
from server.cli import load_engine
from tests.server.fake_engine import FakeEngine


class Config:
    class model:  # noqa: N801 - the shape of EngineConfig.model
        model = "tiny"


@pytest.fixture
def no_model_path(monkeypatch):
    monkeypatch.setattr("engine.models.loader.resolve_model_path", lambda path: path)


def test_the_load_gets_the_tokenizer_read_on_the_calling_thread(monkeypatch, no_model_path):
    seen = {}

    def from_path(path):
        seen["tokenizer thread"] = threading.current_thread()
        return f"tokenizer of {path}"

    def from_config(config, tokenizer=None):
        seen["load thread"] = threading.current_thread()
        seen["tokenizer"] = tokenizer.result(timeout=10)
        return FakeEngine()

    monkeypatch.setattr(tokenizer_module.Tokenizer, "from_path", staticmethod(from_path))
    monkeypatch.setattr(LLMEngine, "from_config", staticmethod(from_config))
    engine = load_engine(Config, max_num_in_flight=5)
    assert isinstance(engine.engine, FakeEngine) and engine.max_num_in_flight == 5
    assert seen["tokenizer"] == "tokenizer of tiny"
    assert seen["tokenizer thread"] is threading.current_thread()
    assert seen["load thread"] is not threading.current_thread()
    assert not seen["load thread"].is_alive()


def test_a_tokenizer_failure_ends_the_load(monkeypatch, no_model_path):
    waited = []

    def from_path(path):
        raise OSError("unreadable tokenizer")

    def from_config(config, tokenizer=None):
        waited.append(threading.current_thread())
        return tokenizer.result(timeout=10)

    monkeypatch.setattr(tokenizer_module.Tokenizer, "from_path", staticmethod(from_path))
    monkeypatch.setattr(LLMEngine, "from_config", staticmethod(from_config))
    with pytest.raises(OSError, match="unreadable tokenizer"):
        load_engine(Config)
    waited[0].join(timeout=10)
    assert not waited[0].is_alive()


def test_a_model_failure_reaches_the_caller(monkeypatch, no_model_path):
    def from_config(config, tokenizer=None):
        raise ValueError("no such model: 'tiny'")

    monkeypatch.setattr(tokenizer_module.Tokenizer, "from_path", staticmethod(lambda path: None))
    monkeypatch.setattr(LLMEngine, "from_config", staticmethod(from_config))
    with pytest.raises(ValueError, match="no such model"):
        load_engine(Config)

"""AsyncEngine on the fake engine: streaming, n > 1, aborts, admission limits, engine death."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from engine.front.async_engine import AsyncEngine, EngineDeadError, QueueFullError
from engine.front.request_stream import RequestStream
from engine.llm_engine import LLMEngine
from engine.outputs import EngineStats, RequestOutput
from engine.sampling_params import SamplingParams
from tests.server.fake_engine import FakeEngine

GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


def run(coro_fn, engine: FakeEngine | None = None, **kwargs):
    """Run `coro_fn(async_engine)` with a started AsyncEngine, then shut it down."""

    async def main():
        async_engine = AsyncEngine(engine or FakeEngine(), **kwargs)
        async_engine.start()
        try:
            return await coro_fn(async_engine)
        finally:
            await asyncio.to_thread(async_engine.shutdown)

    return asyncio.run(main())


def test_generate_streams_every_token_then_finishes():
    async def body(engine: AsyncEngine):
        return [out async for out in engine.generate("r", [1, 5, 6], GREEDY)]

    outputs = run(body)
    assert [len(o.new_token_ids) for o in outputs] == [1] * 5
    assert [o.finished for o in outputs] == [False] * 4 + [True]
    assert outputs[-1].finish_reason == "length"
    assert outputs[-1].num_output_tokens == 5


def test_n_choices_share_one_stream():
    async def body(engine: AsyncEngine):
        params = SamplingParams(n=3, max_tokens=2, seed=1, ignore_eos=True)
        return [out async for out in engine.generate("g", [1, 7], params)]

    outputs = run(body)
    finished = {o.index for o in outputs if o.finished}
    assert finished == {0, 1, 2}
    assert all(o.group_id == "g" for o in outputs)


def test_stopping_early_aborts_and_frees_blocks():
    fake = FakeEngine(step_delay=0.002)

    async def body(engine: AsyncEngine):
        params = SamplingParams(max_tokens=400, ignore_eos=True)
        async for _ in engine.generate("long", [1, 2, 3], params):
            break
        await asyncio.sleep(0.05)
        return engine.num_in_flight

    assert run(body, fake) == 0
    assert fake.num_aborted == 1
    assert fake.num_free_blocks == fake.num_total_blocks
    assert not fake.requests


def test_invalid_request_raises_value_error_and_leaves_nothing_behind():
    async def body(engine: AsyncEngine):
        with pytest.raises(ValueError, match="prompt must not be empty"):
            await engine.add_request("bad", [], GREEDY)
        with pytest.raises(ValueError, match="max_tokens"):
            await engine.add_request("big", [1], SamplingParams(max_tokens=10_000))
        return engine.num_in_flight

    assert run(body) == 0


def test_duplicate_request_id_is_refused():
    async def body(engine: AsyncEngine):
        stream = await engine.add_request("same", [1, 2], SamplingParams(max_tokens=50))
        with pytest.raises(ValueError, match="already in use"):
            await engine.add_request("same", [1, 2], GREEDY)
        stream.close()

    run(body, FakeEngine(step_delay=0.01))


def test_admission_limit_counts_sequences():
    async def body(engine: AsyncEngine):
        first = await engine.add_request("a", [1], SamplingParams(n=2, max_tokens=50))
        with pytest.raises(QueueFullError):
            await engine.add_request("b", [1], SamplingParams(n=2, max_tokens=50))
        second = await engine.add_request("c", [1], SamplingParams(max_tokens=50))
        first.close()
        second.close()

    run(body, FakeEngine(step_delay=0.01), max_num_in_flight=3)


def test_engine_death_fails_in_flight_requests_and_refuses_new_ones():
    async def body(engine: AsyncEngine):
        with pytest.raises(EngineDeadError, match="injected engine failure"):
            async for _ in engine.generate("r", [1, 2], SamplingParams(max_tokens=20)):
                pass
        assert not engine.is_healthy
        with pytest.raises(EngineDeadError):
            await engine.add_request("later", [1], GREEDY)

    run(body, FakeEngine(fail_at_step=3))


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[EngineStats, int]] = []

    def on_step(self, stats: EngineStats, outputs: Sequence[RequestOutput], now: float) -> None:
        self.calls.append((stats, len(outputs)))


class _Broken:
    def on_step(self, stats, outputs, now) -> None:
        raise RuntimeError("metrics bug")


def test_stat_loggers_see_every_step_and_cannot_kill_the_engine():
    recorder = _Recorder()

    async def body(engine: AsyncEngine):
        outputs = [o async for o in engine.generate("r", [1, 2], GREEDY)]
        return outputs, engine.is_healthy, engine.stats()

    outputs, healthy, stats = run(body, stat_loggers=[_Broken(), recorder])
    assert healthy
    assert sum(n for _, n in recorder.calls) == len(outputs) == 5
    assert recorder.calls[-1][0].num_steps_total == 5
    assert stats.num_free_blocks == stats.num_total_blocks


def test_abort_all_ends_streams_with_an_error():
    async def body(engine: AsyncEngine):
        stream = await engine.add_request("r", [1], SamplingParams(max_tokens=400))
        engine.abort_all("going away")
        with pytest.raises(EngineDeadError, match="going away"):
            async for _ in stream:
                pass
        return await engine.wait_until_idle(timeout=1)

    fake = FakeEngine(step_delay=0.005)
    assert run(body, fake)
    assert fake.num_free_blocks == fake.num_total_blocks


def test_from_config_loads_the_engine_on_a_thread_that_has_exited(monkeypatch):
    """Model loading must not leave an OpenMP pool on the caller's thread (engine_worker.py)."""
    loaders: list[threading.Thread] = []

    def fake_from_config(config, tokenizer=None):
        loaders.append(threading.current_thread())
        return FakeEngine()

    monkeypatch.setattr(LLMEngine, "from_config", staticmethod(fake_from_config))
    engine = AsyncEngine.from_config(None, max_num_in_flight=3)
    assert isinstance(engine.engine, FakeEngine)
    assert engine.max_num_in_flight == 3
    assert loaders[0] is not threading.current_thread()
    assert not loaders[0].is_alive()


def test_from_config_raises_what_loading_raised(monkeypatch):
    def failing(config, tokenizer=None):
        raise ValueError("no such model: 'nope'")

    monkeypatch.setattr(LLMEngine, "from_config", staticmethod(failing))
    with pytest.raises(ValueError, match="no such model"):
        AsyncEngine.from_config(None)


def test_closing_a_stream_aborts_only_what_has_not_finished():
    async def body():
        closed: list[str] = []
        done = RequestStream("done", 1, closed.append)
        done.put(RequestOutput("done", [1], [2], [2], finished=True, finish_reason="stop"))
        done.close()
        open_ = RequestStream("open", 2, closed.append)
        open_.put(RequestOutput("open", [1], [2], [2], finished=True, finish_reason="stop"))
        open_.close()  # one of its two choices is still running
        open_.close()  # a second close is a no-op
        return closed

    assert asyncio.run(body()) == ["open"]

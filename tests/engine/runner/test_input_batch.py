"""build_model_input's written-out row for a plain decode (one token, no drafts) packs exactly
what the general path packs, in batches that mix it with prefill chunks, drafted chains and
prompt-logprob requests."""

from __future__ import annotations

import dataclasses

import torch

from engine.outputs import Drafts
from engine.runner import input_batch
from tests.engine.factories import FakeModel, make_requests, make_scheduler


def packed(sched, drafts, general: bool, monkeypatch):
    if general:
        monkeypatch.setattr(input_batch, "_plain_decode", lambda scheduled: False)
    try:
        return input_batch.build_model_input(sched, drafts, block_size=8)
    finally:
        monkeypatch.undo()


def assert_same(a, b) -> None:
    for name in ("input_ids", "positions", "logits_indices"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for field in dataclasses.fields(a.metadata):
        x, y = getattr(a.metadata, field.name), getattr(b.metadata, field.name)
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, field.name
    assert a.requests == b.requests


def test_the_plain_decode_row_equals_the_general_path(monkeypatch):
    scheduler = make_scheduler(num_blocks=128, block_size=8, max_num_batched_tokens=40)
    requests = make_requests(5, prompt_len=9, max_tokens=30)
    requests += make_requests(1, prompt_len=6, id_prefix="p", prompt_logprobs=1, max_tokens=30)
    model = FakeModel(seed=1, accept=lambda request, k: min(k, 1))
    for request in requests:
        scheduler.add_request(request)
    seen_plain = seen_mixed = 0
    for step in range(12):
        plan = {"r1": 2, "r3": 3} if step % 2 else {}
        sched = scheduler.schedule(plan)
        chains = {
            s.request_id: [7] * s.num_draft_tokens for s in sched.scheduled if s.num_draft_tokens
        }
        drafts = Drafts(chains=chains)
        fast = packed(sched, drafts, False, monkeypatch)
        general = packed(sched, drafts, True, monkeypatch)
        assert_same(fast, general)
        plain = [
            s for s in sched.scheduled if s.num_new_tokens == 1 and input_batch._plain_decode(s)
        ]
        seen_plain += len(plain)
        seen_mixed += bool(plain) and len(plain) < len(sched.scheduled)
        scheduler.update(sched, model.execute(sched))
    assert seen_plain > 20 and seen_mixed > 3

"""Models with several end-of-sequence ids: any of them stops a request, and min_tokens blocks
all of them; generation_config.json's list adds to config.json's id."""

from __future__ import annotations

import json

import torch

from engine.models.hf_loader import hf_config
from engine.outputs import ModelOutput, RequestStepOutput
from engine.request import RequestStatus
from engine.sample.batch_verify import sampling_row
from engine.sample.sampler import Sampler
from tests.engine.factories import make_requests, make_scheduler


def _emit(out, tokens_by_id):
    outputs = {
        s.request_id: RequestStepOutput(s.request_id, tuple(tokens_by_id.get(s.request_id, ())))
        for s in out.scheduled
    }
    return ModelOutput(outputs=outputs)


def test_any_eos_id_stops_the_request():
    scheduler = make_scheduler()
    first, second = make_requests(2, prompt_len=4)
    for request in (first, second):
        request.eos_token_ids = (2, 9)
        scheduler.add_request(request)
    out = scheduler.schedule({})
    scheduler.update(out, _emit(out, {"r0": (9,), "r1": (5,)}))
    assert first.status is RequestStatus.FINISHED_STOPPED and first.output_token_ids == [9]
    assert second.status is RequestStatus.RUNNING
    out = scheduler.schedule({})
    scheduler.update(out, _emit(out, {"r1": (2,)}))
    assert second.status is RequestStatus.FINISHED_STOPPED
    assert scheduler.block_manager.num_free_blocks == 64


def test_min_tokens_blocks_every_eos_id():
    (request,) = make_requests(1, prompt_len=4, min_tokens=3)
    request.eos_token_ids = (2, 9)
    logits = torch.zeros(1, 16)
    logits[0, 2] = logits[0, 9] = 10.0  # both EOS ids would win without the block
    probs = Sampler().process(logits, [sampling_row(request)])
    assert probs[0, 2] == 0 and probs[0, 9] == 0 and probs[0].sum() == 1


def test_generation_config_eos_list_adds_to_config(tmp_path):
    config = {
        "vocab_size": 32,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "eos_token_id": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert hf_config(tmp_path).eos_token_ids == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2, 11]}))
    assert hf_config(tmp_path).eos_token_ids == (2, 7, 11)

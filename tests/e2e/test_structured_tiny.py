"""Structured output through the whole engine on a tiny random Llama with the character
tokenizer: outputs obey their grammar, and speculation stays lossless under a grammar
(greedy and seeded sampled output token-identical with speculation off, chains and trees).

The prompts repeat a document the schema accepts, so n-gram drafts are mostly JSON: some are
accepted, some cut at the first token the grammar refuses, some rejected by the target.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import GuidedDecoding, SamplingParams
from engine.structured.matcher import GrammarMatcher
from tests.conftest import build_tiny_llama
from tests.tiny_tokenizer import save_char_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "ok", "n", "tags"],
    "additionalProperties": False,
}
DOC = '{"name": "abc", "ok": true, "n": 12, "tags": ["a", "b"]}'
PROMPTS = [DOC * 3, "x" + DOC * 2 + '{"name": "', "hello"]
JSON = GuidedDecoding("json", json.dumps(SCHEMA))
ENGINES = {
    "off": {},
    "chain": dict(proposer="ngram", spec_policy="fixed:4", num_speculative_tokens=4),
    "tree": dict(proposer="ngram", spec_policy="fixed:4", spec_tree_nodes=4),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_char_tokenizer(build_tiny_llama(tmp_path_factory.mktemp("tiny-structured")))


@pytest.fixture(scope="module")
def llms(model_dir) -> dict[str, LLM]:
    base = dict(model=str(model_dir), num_kv_blocks=96, threads=1)
    return {
        name: LLM(config=EngineConfig.from_flat({**base, **flags}))
        for name, flags in ENGINES.items()
    }


def run(llm: LLM, params: SamplingParams):
    return llm.generate(PROMPTS, params, use_tqdm=False)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=80, temperature=0, guided=JSON),
        SamplingParams(max_tokens=80, temperature=0.8, seed=7, guided=JSON, n=2),
    ],
    ids=["greedy", "seeded-n2"],
)
def test_json_schema_output_is_valid_and_lossless_under_speculation(llms, params):
    results = {name: run(llm, params) for name, llm in llms.items()}
    reference = [o.output_token_ids for o in results["off"]]
    for name in ("chain", "tree"):
        assert [o.output_token_ids for o in results[name]] == reference, name
    for output in results["off"]:
        assert output.finish_reason == "stop"
        jsonschema.validate(json.loads(output.text), SCHEMA)
    assert sum(o.spec.num_draft_tokens for o in results["chain"]) > 0
    assert sum(o.spec.num_draft_tokens for o in results["tree"]) == 0  # trees: chains only


def test_drafts_are_cut_where_the_grammar_refuses_them(llms, monkeypatch):
    cuts: list[tuple[int, int]] = []  # (draft length, tokens kept)
    valid_prefix = GrammarMatcher.valid_prefix

    def recording(self, draft_ids):
        kept = valid_prefix(self, draft_ids)
        cuts.append((len(draft_ids), kept))
        return kept

    monkeypatch.setattr(GrammarMatcher, "valid_prefix", recording)
    params = SamplingParams(max_tokens=60, temperature=0, guided=JSON)
    (output,) = llms["chain"].generate(['{"name": "abc", ' * 4], params, use_tqdm=False)
    jsonschema.validate(json.loads(output.text), SCHEMA)
    assert any(kept < drafted for drafted, kept in cuts)  # the prompt repeats a key
    assert any(kept > 0 for _, kept in cuts)


@pytest.mark.parametrize(
    ("guided", "check"),
    [
        (GuidedDecoding("choice", '["red", "green", "blue"]'), lambda t: t in {"red", "green", "blue"}),
        (GuidedDecoding("regex", r"[a-c]{2}-\d{3}"), lambda t: len(t) == 6 and t[2] == "-"),
        (GuidedDecoding("grammar", 'start: "(" num ")"\nnum: /[0-9]{1,3}/'),
         lambda t: t.startswith("(") and t.endswith(")")),
    ],
)  # fmt: skip
def test_choice_regex_and_lark_grammars(llms, guided, check):
    for name in ("off", "chain"):
        params = SamplingParams(max_tokens=20, temperature=1.0, seed=3, guided=guided, n=3)
        for output in run(llms[name], params):
            assert output.finish_reason == "stop" and check(output.text), output.text

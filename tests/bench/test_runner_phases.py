"""runner_phases.py: the runner's parts timed per step without changing what the step returns,
and the summary's grouping by first token count."""

from __future__ import annotations

import engine.runner.model_runner as model_runner_module
from benchmarks.runner_phases import PHASES, RunnerPhases, first_counts, phase_summary
from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.runner.input_batch import build_model_input
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
REPEATING = [[7, 8, 9, 10, 11] * 8, [20, 21, 22] * 10]  # n-gram matches: drafts to verify


def make_llm(model_dir) -> LLM:
    flat = dict(model=str(model_dir), dtype="float32", num_kv_blocks=128, block_size=16)
    flat.update(speculative_proposer="ngram", spec_policy="fixed:3")
    return LLM(config=EngineConfig.from_flat(flat))


def test_phases_are_timed_per_step_and_the_tokens_do_not_change(tiny_model_dir):
    plain = [o.output_token_ids for o in make_llm(tiny_model_dir).generate(REPEATING, GREEDY)]
    llm = make_llm(tiny_model_dir)
    runner = llm.engine.runner
    phases = RunnerPhases(runner).install()
    taken = []
    execute = runner.execute

    def recorded(*args, **kwargs):
        output = execute(*args, **kwargs)
        taken.append((output, phases.take()))
        return output

    runner.execute = recorded
    try:
        timed = [o.output_token_ids for o in llm.generate(REPEATING, GREEDY)]
    finally:
        runner.execute = execute
        phases.uninstall()
    assert timed == plain
    drafted = [t for o, t in taken if any(s.num_draft_tokens for s in o.outputs.values())]
    assert drafted, "the repeating prompts should have been verified with drafts"
    for _, step in taken:
        parts = step["phases"]
        assert set(parts) == {*PHASES, "other"}
        assert parts["pack"] > 0 and parts["verify"] > 0 and parts["logits"] > 0
        assert parts["other"] > 0  # the parts nest in the step, none counted twice
        assert step["graph"] is None and step["first_replay"] is False  # no graphs on CPU
    assert "execute" not in vars(runner) and "verify" not in vars(runner.verifier)
    assert model_runner_module.build_model_input is build_model_input


def _step(requests, tokens, drafts, measured, other):
    phases = dict.fromkeys(PHASES, 0.0) | {"other": other}
    return dict(
        requests=requests,
        tokens=tokens,
        drafts=drafts,
        eager=0,
        measured=measured,
        phases=phases,
        graph=None,
        first_replay=False,
    )


def test_first_counts_mark_the_first_step_of_each_request_and_token_count():
    steps = [_step(16, 20, 4, 0.005, 3.0), _step(16, 20, 4, 0.002, 0.1), _step(8, 20, 4, 0.002, 0)]
    assert first_counts(steps) == [True, False, True]


def test_the_summary_compares_first_token_counts_with_repeats_at_the_largest_batch():
    steps = [
        _step(16, 20, 4, 0.006, 3.5),
        _step(16, 20, 4, 0.0025, 0.2),
        _step(16, 32, 16, 0.005, 2.8),
        _step(16, 32, 16, 0.0026, 0.3),
        _step(16, 16, 0, 0.0022, 0.1),  # no drafts: in neither group
        _step(4, 8, 4, 0.009, 9.0),  # a smaller batch: only among the slowest
    ]
    summary = phase_summary(steps, top=2)
    assert summary["requests"] == 16
    assert summary["drafting"]["first"]["steps"] == 2
    assert summary["drafting"]["repeat"]["steps"] == 2
    assert summary["drafting"]["first"]["other"] > summary["drafting"]["repeat"]["other"]
    assert [s["requests"] for s in summary["slowest"]] == [4, 16]
    assert summary["slowest"][1]["first_count"] is True

"""Engine flags reach the config: --enforce-eager turns decode CUDA graphs off."""

from __future__ import annotations

import argparse

import pytest

from engine.arg_utils import add_engine_arguments, config_from_args


def parse(*argv: str):
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_cuda_graphs_are_on_by_default_and_enforce_eager_turns_them_off() -> None:
    assert parse().device.cuda_graphs is True
    assert parse("--enforce-eager").device.cuda_graphs is False


def test_weights_flag_reaches_the_model_config_and_is_validated() -> None:
    assert parse().model.weights == "auto"
    assert parse("--weights", "float32").model.weights == "float32"
    assert parse("--weights", "gguf").model.weights == "gguf"
    with pytest.raises(ValueError, match="weights must be one of"):
        parse("--weights", "int8")

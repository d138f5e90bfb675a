"""The chain cap's default follows the device (engine/config.py: CHAIN_CAP_CPU, CHAIN_CAP_GPU)."""

import pytest

from engine.config import CHAIN_CAP_CPU, CHAIN_CAP_GPU, EngineConfig, SpecConfig
from engine.runner.graphs import MAX_GRAPHED_DRAFTS, graph_shapes


def test_an_unset_chain_cap_is_the_devices():
    assert EngineConfig().spec.num_speculative_tokens == CHAIN_CAP_CPU
    cuda = EngineConfig.from_flat({"device": "cuda", "speculative_proposer": "ngram"})
    assert cuda.spec.num_speculative_tokens == CHAIN_CAP_GPU
    assert SpecConfig().chain_cap == CHAIN_CAP_CPU  # no device known
    assert CHAIN_CAP_CPU > CHAIN_CAP_GPU


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_chain_cap_given_is_kept_on_every_device(device):
    config = EngineConfig.from_flat({"device": device, "num_speculative_tokens": 3})
    assert config.spec.num_speculative_tokens == 3 and config.spec.chain_cap == 3
    assert config.replace(max_num_seqs=4).spec.num_speculative_tokens == 3


def test_a_gpus_default_chains_are_graph_captured():
    # Verification replays CUDA graphs up to MAX_GRAPHED_DRAFTS drafts; the GPU's default cap
    # stays within them, so its chains are not pushed onto the eager path.
    config = EngineConfig.from_flat({"device": "cuda", "speculative_proposer": "ngram"})
    assert CHAIN_CAP_GPU <= MAX_GRAPHED_DRAFTS
    assert graph_shapes(config).max_query_len == 1 + CHAIN_CAP_GPU

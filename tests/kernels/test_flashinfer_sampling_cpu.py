"""The host-side parts of kernels.flashinfer_sampling: when the torch sampler must be used, and
the tensors handed to FlashInfer's kernels. The kernels themselves run in test_flashinfer_gpu."""

from __future__ import annotations

import sys

import torch

from kernels.flashinfer_sampling import point_mass_draft_probs, top_k_tensor, torch_sampling_reason

CUDA = torch.device("cuda")  # only a device name here; nothing is allocated on it


def test_seeds_min_p_and_cpu_force_the_torch_sampler(monkeypatch) -> None:
    cpu_reason = torch_sampling_reason([None], [0.0], torch.device("cpu"))
    assert cpu_reason is not None and "not CUDA" in cpu_reason
    seed_reason = torch_sampling_reason([None, 7], [0.0, 0.0], CUDA)
    assert seed_reason is not None and "seed" in seed_reason
    min_p_reason = torch_sampling_reason([None], [0.05], CUDA)
    assert min_p_reason is not None and "min_p" in min_p_reason
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # makes `import flashinfer` fail
    import_reason = torch_sampling_reason([None], [0.0], CUDA)
    assert import_reason is not None and "does not import" in import_reason


def test_top_k_off_means_the_whole_vocabulary() -> None:
    got = top_k_tensor([0, -1, 5, 300, 256], 256, torch.device("cpu"))
    assert got.dtype == torch.int32
    assert got.tolist() == [256, 256, 5, 256, 256]


def test_point_mass_draft_probs_are_one_hot_on_the_drafts() -> None:
    draft_ids = torch.tensor([[3, 0], [1, 1]])
    probs = point_mass_draft_probs(draft_ids, 5)
    assert probs.shape == (2, 2, 5) and probs.dtype == torch.float32
    assert torch.equal(probs.argmax(-1), draft_ids)
    assert torch.equal(probs.sum(-1), torch.ones(2, 2))

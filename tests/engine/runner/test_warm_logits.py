"""The lm_head warm-up after graph capture (engine/runner/graphs.py warm_logits): every row
count a step may gather runs once, in the model's dtype, on the given device."""

import torch
from torch import nn

from engine.runner.graphs import model_dtype, warm_logits


class LogitsCounter(nn.Module):
    """A model whose compute_logits records the shapes and dtypes it is given."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = nn.Parameter(torch.ones(4, dtype=dtype))
        self.calls: list[tuple[tuple[int, ...], torch.dtype]] = []

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self.calls.append((tuple(hidden.shape), hidden.dtype))
        return hidden.float()


def test_every_row_count_up_to_the_largest_runs_once_in_the_models_dtype():
    model = LogitsCounter(torch.bfloat16)
    warm_logits(model, hidden_size=4, max_rows=7, device=torch.device("cpu"))
    assert model.calls == [((rows, 4), torch.bfloat16) for rows in range(1, 8)]


def test_the_models_dtype_is_its_first_floating_weights():
    model = nn.Sequential(nn.Embedding(3, 2), nn.Linear(2, 2))
    model.half()
    assert model_dtype(model) == torch.float16

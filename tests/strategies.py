"""Hypothesis strategies for hostile-but-fair inputs, shared by the property tests and the long
fuzzing run (benchmarks/fuzz_api.py): values a client can put in JSON, biased towards the
edges where numerics break (0, subnormals, huge magnitudes, NaN, 2**63, ids past the vocab)."""

from __future__ import annotations

import math

from hypothesis import strategies as st

EDGE_INTS = (0, 1, -1, 2, 255, 256, 2**31 - 1, 2**31, 2**53, 2**63 - 1, 2**63, -(2**63), 10**20)
EDGE_FLOATS = (
    0.0,
    -0.0,
    5e-324,
    1e-50,
    1e-30,
    1e-6,
    1e-5,
    0.5,
    1.0,
    2.0,
    100.0,
    1e30,
    1.7976931348623157e308,
    math.inf,
    -math.inf,
    math.nan,
)

edge_ints = st.sampled_from(EDGE_INTS) | st.integers(-(2**70), 2**70) | st.integers(-3, 300)
edge_floats = st.sampled_from(EDGE_FLOATS) | st.floats() | st.floats(-3, 3)
numbers = edge_ints | edge_floats | edge_floats.map(lambda x: -x)
json_scalars = st.none() | st.booleans() | numbers | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
# Keys of logit_bias as a client sends them: digits (ASCII or not), signs, junk.
bias_keys = (
    edge_ints.map(str)
    | st.sampled_from(["²", "١٢", "٣", "0x10", " 5", "5 ", "1e3", "", "-0", "9" * 5000])
    | st.text(max_size=6)
)
token_ids = st.integers(0, 255) | edge_ints


def _maybe_bad(good: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a plausible value (edges included), sometimes an edge number, rarely any JSON."""
    return st.one_of(*[good] * 6, numbers, json_values)


# Per SamplingParams field, plausible values; _maybe_bad mixes in the hostile ones.
SAMPLING_FIELDS: dict[str, st.SearchStrategy] = {
    "n": st.integers(1, 3),
    "temperature": st.sampled_from([0.0, 5e-324, 1e-50, 1e-30, 1e-6, 1e-5, 1e-3, 0.7, 100.0])
    | st.floats(0, 2),
    "top_p": st.sampled_from([1e-300, 1e-8, 0.5, 1.0]) | st.floats(0, 1, exclude_min=True),
    "top_k": st.sampled_from([-1, 0, 1, 5, 255, 256, 10**6, 2**31 - 1]),
    "min_p": st.floats(0, 1),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.sampled_from([0.01, 0.5, 1.0, 2.0]) | st.floats(0.01, 2),
    "logit_bias": st.dictionaries(st.integers(0, 255), st.floats(-100, 100), max_size=4),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "max_tokens": st.integers(1, 8),
    "min_tokens": st.integers(0, 4),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 255), max_size=3),
    "logprobs": st.integers(0, 20),
}


@st.composite
def sampling_kwargs(draw) -> dict:
    """A random subset of SamplingParams fields, each plausible or hostile."""
    names = draw(st.sets(st.sampled_from(sorted(SAMPLING_FIELDS)), max_size=4))
    return {name: draw(_maybe_bad(SAMPLING_FIELDS[name])) for name in sorted(names)}

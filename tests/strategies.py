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
_ODD_KEYS = st.sampled_from(["²", "١٢", "٣", "0x10", " 5", "5 ", "1e3", "", "-0", "9" * 5000])
bias_keys = _ODD_KEYS | _ODD_KEYS | edge_ints.map(str) | st.text(max_size=6)
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


def from_schema(schema: dict) -> st.SearchStrategy:
    """Plausible JSON values of a JSON schema (an OpenAPI request body): the right structure
    and types, leaves in small everyday ranges, no nulls where something else is allowed."""
    if "anyOf" in schema:
        branches = [s for s in schema["anyOf"] if s.get("type") != "null"] or schema["anyOf"]
        return st.one_of([from_schema(s) for s in branches])
    if "const" in schema or "enum" in schema:
        return st.sampled_from(schema.get("enum") or [schema["const"]])
    kind = schema.get("type")
    if kind == "object":
        return _object(schema)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), min_size=1, max_size=3)
    return _PLAUSIBLE.get(kind, json_scalars)


_PLAUSIBLE = {
    "number": st.floats(0, 1) | st.integers(0, 2),
    "integer": st.integers(0, 8),
    "string": st.text(min_size=1, max_size=12),
    "boolean": st.booleans(),
    "null": st.none(),
}


def _object(schema: dict) -> st.SearchStrategy:
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):  # a map such as logit_bias: token ids as keys
        return st.dictionaries(st.integers(0, 63).map(str), from_schema(extra), max_size=3)
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    return st.fixed_dictionaries(
        {k: from_schema(v) for k, v in properties.items() if k in required},
        optional={k: from_schema(v) for k, v in properties.items() if k not in required},
    )


def hostile_value(schema: dict) -> st.SearchStrategy:
    """A value a hostile client might put where `schema` is expected: an edge number or
    token-id key, a wrong type, or a plausible value after all."""
    edges = {"number": numbers, "integer": edge_ints, "string": st.sampled_from(EDGE_STRINGS)}
    kinds = [schema.get("type")] + [s.get("type") for s in schema.get("anyOf", ())]
    choices = [edges[k] for k in kinds if k in edges]
    if any(k == "array" for k in kinds):
        choices.append(st.lists(edge_ints | numbers, min_size=1, max_size=3))
    if any(k == "object" for k in kinds):
        odd_map = st.dictionaries(
            bias_keys, numbers | st.integers(-100, 100), min_size=1, max_size=3
        )
        choices += [odd_map, odd_map]
    return st.one_of(*choices, json_values, from_schema(schema))


EDGE_STRINGS = (
    "",
    "²",
    "\x00",
    "é" * 3,
    "a" * 300,
    "</s>",
    "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
)


@st.composite
def hostile_bodies(draw, schema: dict, max_hostile: int = 2, omit: tuple[str, ...] = ()) -> dict:
    """A plausible body (without the `omit` fields, which are valid only with others) with up
    to `max_hostile` of its fields, present or not, made hostile."""
    body = {k: v for k, v in draw(from_schema(schema)).items() if k not in omit}
    properties = schema.get("properties", {})
    names = draw(st.lists(st.sampled_from(sorted(properties)), max_size=max_hostile, unique=True))
    for name in names:
        body[name] = draw(hostile_value(properties[name]))
    return body


# Fields a plausible body leaves out: each is refused unless another field says otherwise
# (stream_options needs stream, best_of must equal n, suffix is not supported).
CONDITIONAL_FIELDS = ("stream_options", "best_of", "suffix")

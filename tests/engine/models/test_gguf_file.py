"""The lean GGUF reader agrees with gguf.GGUFReader on metadata and tensor storage."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.models.gguf_file import SkippedArray, read_gguf

Q = gguf.GGMLQuantizationType


def write_sample(path):
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("sample.u32", 7)
    writer.add_int64("sample.i64", -3)
    writer.add_float32("sample.f32", 0.1)
    writer.add_float64("sample.f64", 0.25)
    writer.add_bool("sample.flag", True)
    writer.add_string("sample.text", "héllo")
    writer.add_array("sample.ints", [1, 2, 3])
    writer.add_array("sample.floats", [0.5, 1.5])
    writer.add_array("sample.words", ["a", "bb", "ççç", ""])
    writer.add_uint32("sample.after_words", 11)  # parsed correctly only if the skip is right
    tensors = {
        "f32": (rng.standard_normal((3, 64)).astype(np.float32), Q.F32),
        "f16": (rng.standard_normal((5, 32)).astype(np.float32), Q.F16),
        "norm": (rng.standard_normal(64).astype(np.float32), Q.F32),
        "q8": (rng.standard_normal((4, 64)).astype(np.float32), Q.Q8_0),
        "q4": (rng.standard_normal((2, 96)).astype(np.float32), Q.Q4_1),
        "bf16": (rng.standard_normal((2, 16)).astype(np.float32), Q.BF16),
    }
    for name, (array, kind) in tensors.items():
        writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_metadata_and_tensors_match_gguf_reader(tmp_path):
    path = write_sample(tmp_path / "s.gguf")
    ours = read_gguf(path)
    reference = gguf.GGUFReader(path)
    for key, field in reference.fields.items():
        if key.startswith("GGUF."):
            continue
        expected = field.contents()
        if isinstance(ours.metadata[key], SkippedArray):
            assert ours.metadata[key].length == len(expected), key
        else:
            assert ours.metadata[key] == pytest.approx(expected), key
    assert ours.metadata["sample.after_words"] == 11
    assert ours.metadata["sample.text"] == "héllo"
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for mine, theirs in zip(ours.tensors, reference.tensors, strict=True):
        assert mine.ggml_type == theirs.tensor_type
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape
        assert np.array_equal(mine.data, theirs.data), mine.name
        dequantised = gguf.quants.dequantize(mine.data, Q(mine.ggml_type))
        assert dequantised.reshape(mine.shape).shape == mine.shape


def test_rejects_non_gguf_files(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(32))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(path)


def test_find_strings_indexes_the_skipped_array(tmp_path):
    ours = read_gguf(write_sample(tmp_path / "s.gguf"))
    found = ours.find_strings("sample.words", ["bb", "ççç", "", "zz", "a"])
    assert found == {"a": 0, "bb": 1, "ççç": 2, "": 3}
    assert ours.find_strings("sample.ints", ["a"]) == {}

"""Incremental detokenization: no broken UTF-8 released, stop strings held back and cut."""

from engine.output.detokenizer import IncrementalDetokenizer


class ByteTokenizer:
    """Token id = one byte, so multi-byte characters span several tokens."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def run(text: str, **kw) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(ByteTokenizer(), ids("prompt: "), **kw)
    deltas = [detok.add_tokens([t]) for t in ids(text)]
    deltas.append(detok.add_tokens([], finished=True))
    return deltas, detok


def test_multibyte_characters_never_split():
    deltas, detok = run("héllo wörld ✓ 日本")
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == "héllo wörld ✓ 日本"
    assert detok.text == "héllo wörld ✓ 日本"


def test_stop_string_cuts_text_and_is_excluded():
    deltas, detok = run("one two STOP three", stop=("STOP",))
    assert "".join(deltas) == "one two "
    assert detok.stop_string == "STOP"


def test_stop_string_included_when_asked():
    deltas, _ = run("one two STOP three", stop=("STOP",), include_stop_str_in_output=True)
    assert "".join(deltas) == "one two STOP"


def test_partial_stop_prefix_is_held_back_then_released():
    detok = IncrementalDetokenizer(ByteTokenizer(), [], stop=("END",))
    released = "".join(detok.add_tokens([t]) for t in ids("abc EN"))
    assert released == "abc "  # "EN" could still become "END"
    released += detok.add_tokens(ids("D?"))
    assert released == "abc " and detok.stop_string == "END"


def test_held_back_prefix_released_when_the_request_finishes():
    detok = IncrementalDetokenizer(ByteTokenizer(), [], stop=("END",))
    released = "".join(detok.add_tokens([t]) for t in ids("abc EN"))
    assert released == "abc "
    assert detok.add_tokens([], finished=True) == "EN"
    last = IncrementalDetokenizer(ByteTokenizer(), [], stop=("END",))
    assert last.add_tokens(ids("abc E"), finished=True) == "abc E"


def test_held_back_prefix_released_when_it_diverges():
    detok = IncrementalDetokenizer(ByteTokenizer(), [], stop=("END",))
    released = "".join(detok.add_tokens([t]) for t in ids("xx EN and more"))
    assert released == "xx EN and more"
    assert detok.stop_string is None


def test_earliest_of_several_stop_strings_wins():
    deltas, detok = run("alpha beta gamma", stop=("gamma", "beta"))
    assert "".join(deltas) == "alpha "
    assert detok.stop_string == "beta"

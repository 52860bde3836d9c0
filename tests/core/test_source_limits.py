"""The size limit of a manifest file: counted in bytes of UTF-8, the limit itself accepted,
one byte more refused at 1:1 with the size and the limit (``yaml-limit``)."""

from __future__ import annotations

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import MAX_BYTES, load_documents, too_large


def test_a_file_too_large_says_its_size_and_the_limit() -> None:
    assert too_large("big.yaml", 600_000) == Diagnostic(
        "big.yaml",
        1,
        1,
        "yaml-limit",
        "the file has 600,000 bytes; at most 524,288 are accepted",
    )


def test_a_stream_read_up_to_the_limit_says_more_than() -> None:
    found = too_large("<stdin>", MAX_BYTES + 1, at_least=True)
    assert str(found) == (
        "<stdin>:1:1: yaml-limit: the file has more than 524,288 bytes; "
        "at most 524,288 are accepted"
    )


def test_the_limit_is_accepted_and_one_byte_more_refused() -> None:
    at_limit = "# " + "x" * (MAX_BYTES - 3) + "\n"
    assert len(at_limit.encode()) == MAX_BYTES
    assert load_documents(at_limit, "f.yaml") == ([], [])
    over = "# " + "x" * (MAX_BYTES - 2) + "\n"
    assert load_documents(over, "f.yaml") == ([], [too_large("f.yaml", MAX_BYTES + 1)])


def test_the_size_is_counted_in_bytes_not_characters() -> None:
    # A quarter of the limit in characters, four bytes each, and a little more.
    text = "a: " + "\U0001f600" * (MAX_BYTES // 4)
    assert len(text) < MAX_BYTES
    documents, errors = load_documents(text, "f.yaml")
    assert documents == []
    assert errors == [too_large("f.yaml", MAX_BYTES + 3)]

"""The YAML loader: where each key and value of a document stands (every later error points
there), how a scalar was written, what it refuses and at which position (a key that is not
a scalar, a tag it does not construct, a character YAML does not allow, an undefined
alias), which documents of a file are empty, and the bounds on nesting and on what aliases
expand to, each at its exact limit."""

from __future__ import annotations

import pytest

from interlock.core import source
from interlock.core.diagnostics import Diagnostic
from interlock.core.source import MAX_DEPTH, MAX_VALUES, Document, Span, load_documents

TEXT = """\
a: 1
b:
  - x
  - 'q'
  - "d"
c: |
    line1
    line2
d: >-
  folded
e: {k: v}
"""


def one(text: str) -> Document:
    documents, errors = load_documents(text, "f.yaml")
    assert errors == []
    (document,) = documents
    return document


def test_every_value_and_key_has_its_position_and_style() -> None:
    document = one(TEXT)
    assert document.data == {
        "a": 1,
        "b": ["x", "q", "d"],
        "c": "line1\nline2\n",
        "d": "folded",
        "e": {"k": "v"},
    }
    assert document.values == {
        (): Span(1, 1),
        ("a",): Span(1, 4),
        ("b",): Span(3, 3),
        ("b", 0): Span(3, 5),
        ("b", 1): Span(4, 5, "'"),
        ("b", 2): Span(5, 5, '"'),
        ("c",): Span(6, 4, "|", 5),
        ("d",): Span(9, 4, ">", 3),
        ("e",): Span(11, 4),
        ("e", "k"): Span(11, 8),
    }
    assert document.keys == {
        ("a",): Span(1, 1),
        ("b",): Span(2, 1),
        ("c",): Span(6, 1),
        ("d",): Span(9, 1),
        ("e",): Span(11, 1),
        ("e", "k"): Span(11, 5),
    }
    assert (document.path, document.index, document.start) == ("f.yaml", 0, Span(1, 1))


def test_a_block_scalar_at_the_end_of_the_file_has_no_content_column() -> None:
    assert one("c: |").values[("c",)] == Span(1, 4, "|", 0)


def test_a_path_not_in_the_document_falls_back_to_its_closest_parent() -> None:
    document = one(TEXT)
    # A value asked for: its own position, else its parent's.
    assert document.where(("b", 1)) == Span(4, 5, "'")
    assert document.where(("b", 7, "x")) == Span(3, 3)
    # A key asked for: the key where there is one, else the value there (a list item has
    # no key), else the parent's key.
    assert document.where(("e", "k"), key=True) == Span(11, 5)
    assert document.where(("b", 1), key=True) == Span(4, 5, "'")
    assert document.where(("e", "k", "deep"), key=True) == Span(11, 5)
    # Nothing known on the way: the document's own position.
    assert document.where(("zz", 1)) == Span(1, 1)
    assert document.diag(("e", "k"), "r", "m", key=True) == Diagnostic("f.yaml", 11, 5, "r", "m")
    assert document.diag(("e", "k"), "r", "m") == Diagnostic("f.yaml", 11, 8, "r", "m")


def test_a_path_nowhere_known_falls_back_to_the_root_then_to_the_start() -> None:
    document = Document("f.yaml", 0, {}, values={(): Span(2, 3)}, start=Span(1, 1))
    assert document.where(("spec", "states")) == Span(2, 3)
    assert document.where(("spec",), key=True) == Span(2, 3)


def test_a_document_with_no_position_for_its_root_falls_back_to_its_start() -> None:
    document = Document("f.yaml", 2, {}, start=Span(7, 1))
    assert document.where(("spec", "states")) == Span(7, 1)
    assert document.where(()) == Span(7, 1)


def test_empty_documents_are_skipped_and_the_others_keep_their_index() -> None:
    documents, errors = load_documents("---\n~\n---\nnull\n---\n---\nx: 1\n", "f.yaml")
    assert errors == []
    assert [(d.index, d.data, d.start) for d in documents] == [(3, {"x": 1}, Span(7, 1))]
    # A document that is a null written otherwise is not empty: it is a value to check.
    documents, errors = load_documents("NULL\n", "f.yaml")
    assert [d.data for d in documents] == [None]
    for empty in ("", "~\n", "null\n", "--- \n...\n"):
        assert load_documents(empty, "f.yaml") == ([], [])


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("? [a, b]\n: 1\nc: 2\n", "1:3: wrong-type: a key must be a scalar"),
        ("a: 1\n<<: {b: 2}\n", "2:1: unsupported: merge keys (<<) are not supported"),
        ("a: 1\nb: 2\na: 3\n", "3:1: duplicate-key: duplicate key 'a' (first defined at line 1)"),
        (
            "a: !!python/object:os.system x\n",
            "1:4: yaml-syntax: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/object:os.system'",
        ),
        ("a: &x 1\nb: *y\n", "2:4: yaml-syntax: found undefined alias 'y'"),
        ("a: [1, 2\nb: 3\n", "2:2: yaml-syntax: expected ',' or ']', but got ':'"),
    ],
)
def test_what_the_loader_refuses_and_where(text: str, found: str) -> None:
    _, errors = load_documents(text, "f.yaml")
    assert [str(e) for e in errors] == [f"f.yaml:{found}"]


def test_the_rest_of_a_mapping_is_kept_after_a_refused_key() -> None:
    documents, errors = load_documents("? [a, b]\n: 1\nc: 2\n<<: {d: 3}\ne: 4\n", "f.yaml")
    assert [e.rule for e in errors] == ["wrong-type", "unsupported"]
    assert [d.data for d in documents] == [{"c": 2, "e": 4}]


def test_a_character_yaml_does_not_allow_is_refused_with_the_reader_s_message() -> None:
    _, errors = load_documents("a: \x07\n", "f.yaml")
    assert len(errors) == 1
    assert str(errors[0]).startswith("f.yaml:1:1: yaml-syntax: unacceptable character #x0007")


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ("!!int many", "1:4: yaml-syntax: 'many' is not a valid !!int"),
        ("!!float x", "1:4: yaml-syntax: 'x' is not a valid !!float"),
        ("!!bool maybe", "1:4: yaml-syntax: 'maybe' is not a valid !!bool"),
        ("!!timestamp soon", "1:4: yaml-syntax: 'soon' is not a valid !!timestamp"),
    ],
)
def test_a_scalar_its_explicit_tag_cannot_read_is_refused_where_it_stands(
    value: str, found: str
) -> None:
    documents, errors = load_documents(f"a: {value}\n---\nb: !!int 2\n", "f.yaml")
    assert [str(e) for e in errors] == [f"f.yaml:{found}"]
    assert [(d.index, d.data) for d in documents] == [(1, {"b": 2})]


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("2026-01-31", "2026-01-31"),
        ("2026-01-31 10:00:00", "2026-01-31T10:00:00Z"),
        ("2026-01-31T10:00:00Z", "2026-01-31T10:00:00Z"),
        ("2026-01-31T10:00:00.25-05:30", "2026-01-31T10:00:00.250000-05:30"),
    ],
)
def test_an_explicit_timestamp_is_the_rfc_3339_text_json_carries(written: str, value: str) -> None:
    # Implicit ones stay the strings written; the tag gives a checked time, as text (a
    # manifest's values are JSON: a date object reached the run as whatever its encoder made).
    documents, errors = load_documents(f"a: !!timestamp {written}\nb: {written}\n", "f.yaml")
    assert errors == []
    assert documents[0].data == {"a": value, "b": written}


def test_every_duplicate_key_of_a_mapping_is_reported_and_the_rest_kept() -> None:
    documents, errors = load_documents("a: 1\nb: 2\na: 3\nb: 4\nc: 5\n", "f.yaml")
    assert [str(e) for e in errors] == [
        "f.yaml:3:1: duplicate-key: duplicate key 'a' (first defined at line 1)",
        "f.yaml:4:1: duplicate-key: duplicate key 'b' (first defined at line 2)",
    ]
    assert [d.data for d in documents] == [{"a": 1, "b": 2, "c": 5}]


def test_a_document_refused_while_building_does_not_stop_the_next() -> None:
    documents, errors = load_documents("a: !!binary 12\n---\nb: 1\n", "f.yaml")
    assert [str(e) for e in errors] == [
        "f.yaml:1:4: yaml-syntax: failed to decode base64 data: Incorrect padding"
    ]
    assert [(d.index, d.data) for d in documents] == [(1, {"b": 1})]


def nested(depth: int) -> str:
    """A document of ``depth`` nested flow lists around a scalar."""
    return "[" * depth + "1" + "]" * depth + "\n"


def test_the_nesting_limit_is_accepted_and_one_level_more_refused() -> None:
    # Each list is a level and so is the scalar inside: the one too deep is refused where
    # it starts.
    (document,) = load_documents(nested(MAX_DEPTH - 1), "f.yaml")[0]
    assert isinstance(document.data, list)
    documents, errors = load_documents(nested(MAX_DEPTH), "f.yaml")
    assert documents == []
    assert [str(e) for e in errors] == [
        f"f.yaml:1:{MAX_DEPTH + 1}: yaml-limit: nesting deeper than {MAX_DEPTH} levels"
    ]


def nested_after_sibling(depth: int) -> str:
    """A list in a list holding ``[0]`` and then ``depth`` nested lists around a scalar: the
    scalar stands at level ``depth + 3``."""
    return "[[[0], " + "[" * depth + "1" + "]" * depth + "]]\n"


def test_the_nesting_limit_counts_from_where_a_value_stands_after_its_siblings() -> None:
    # [0] and the scalar in it are done before the next sibling starts, at their level.
    (document,) = load_documents(nested_after_sibling(MAX_DEPTH - 3), "f.yaml")[0]
    assert document.data[0][0] == [0]
    text = nested_after_sibling(MAX_DEPTH - 2)
    documents, errors = load_documents(text, "f.yaml")
    assert documents == []
    assert [str(e) for e in errors] == [
        f"f.yaml:1:{text.index('1') + 1}: yaml-limit: nesting deeper than {MAX_DEPTH} levels"
    ]


def expanding(extra: int) -> str:
    """A list holding 99 times (by an alias) a list of 9 scalars, and ``extra`` scalars
    more: 1 + 99 * 10 + extra values once the aliases are expanded."""
    shared = "&s [" + ", ".join(["x"] * 9) + "]"
    return "[" + ", ".join([shared] + ["*s"] * 98 + ["y"] * extra) + "]\n"


def test_the_expansion_limit_is_accepted_and_one_value_more_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A smaller limit, so that the document at the limit is quick to build.
    monkeypatch.setattr(source, "MAX_VALUES", 1000)
    (document,) = load_documents(expanding(9), "f.yaml")[0]
    assert len(document.data) == 99 + 9
    assert document.data[98] == ["x"] * 9
    documents, errors = load_documents("a: 1\n---\n" + expanding(10) + "---\nb: 2\n", "f.yaml")
    assert [str(e) for e in errors] == [
        "f.yaml:3:1: yaml-limit: the document expands to more than 1,000 values "
        "(aliases repeat what they point at)"
    ]
    assert [d.data for d in documents] == [{"a": 1}, {"b": 2}]


def test_a_billion_laughs_is_refused_without_being_expanded() -> None:
    laughs = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for level in "bcdefghi":
        previous = chr(ord(level) - 1)
        laughs.append(f"{level}: &{level} [" + ", ".join([f"*{previous}"] * 10) + "]")
    documents, errors = load_documents("\n".join(laughs) + "\n", "f.yaml")
    assert documents == []
    assert [str(e) for e in errors] == [
        f"f.yaml:1:1: yaml-limit: the document expands to more than {MAX_VALUES:,} values "
        "(aliases repeat what they point at)"
    ]


def expanding_mapping(scalars: int) -> str:
    """A mapping of 89 keys holding (by an alias) a list of 9 scalars and ``scalars`` keys
    holding one: 1 + 89 * (1 + 10) + 2 * scalars values, keys counted."""
    shared = "&s [" + ", ".join(["x"] * 9) + "]"
    pairs = [f"k0: {shared}"] + [f"k{i}: *s" for i in range(1, 89)]
    pairs += [f"y{i}: y" for i in range(scalars)]
    return "{" + ", ".join(pairs) + "}\n"


def test_a_mapping_counts_its_keys_and_values_against_the_expansion_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(source, "MAX_VALUES", 1000)
    (document,) = load_documents(expanding_mapping(10), "f.yaml")[0]
    assert len(document.data) == 89 + 10
    assert document.data["k88"] == ["x"] * 9
    documents, errors = load_documents(expanding_mapping(11), "f.yaml")
    assert documents == []
    assert [str(e) for e in errors] == [
        "f.yaml:1:1: yaml-limit: the document expands to more than 1,000 values "
        "(aliases repeat what they point at)"
    ]


MERGED = """\
defaults: &d {agent: scorer, retries: 2, input: {a: 1}}
more: &m {retries: 5, timeout: 30s}
step:
  <<: [*d, *m]
  retries: 1
  name: second
"""


def test_merge_keys_merge_for_the_formats_whose_yaml_takes_them() -> None:
    """What a mapping writes wins over what it merges; of several sources the earlier
    wins; a merged key is where its anchor wrote it (kubectl and most YAML readers
    merge, the native language does not)."""
    docs, errors = load_documents(MERGED, "m.yaml", merge=True)
    assert errors == []
    [doc] = docs
    assert doc.data["step"] == {
        "agent": "scorer",
        "retries": 1,
        "input": {"a": 1},
        "timeout": "30s",
        "name": "second",
    }
    assert (doc.where(("step", "retries")).line, doc.where(("step", "agent")).line) == (5, 1)
    assert (doc.where(("step", "timeout")).line, doc.where(("step", "input", "a")).line) == (2, 1)
    assert [(m.line, m.col) for m in doc.merges] == [(4, 3)]
    assert load_documents(MERGED, "m.yaml")[1][0].rule == "unsupported"  # native: refused


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("a: &a {x: 1}\nb:\n  <<: *a\n  y: 1\n  y: 2\n", "5:3: duplicate-key: duplicate key 'y'"),
        ("a: &a [1]\nb:\n  <<: *a\n", "1:8: wrong-type: a merge key (<<) takes a mapping"),
        ("b:\n  <<: 3\n", "2:7: wrong-type: a merge key (<<) takes a mapping"),
    ],
)
def test_a_merge_keeps_the_mapping_rules(text: str, error: str) -> None:
    _, errors = load_documents(text, "m.yaml", merge=True)
    assert [str(e)[: len(error) + 7] for e in errors] == [f"m.yaml:{error}"], errors

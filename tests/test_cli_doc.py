"""docs/cli.md says what the CLI's parser takes: every command has a heading, every flag
of a command is named in its section, and every ``interlock ...`` command line written in
the docs (headings, inline code, shell blocks, in every page and the README) names a
command that exists with flags that command takes. Nothing runs: the parser is read."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from interlock.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
CLI_DOC = ROOT / "docs" / "cli.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

CONNECTION = {
    "--server",
    "-s",
    "--creds",
    "--nkey",
    "--user",
    "--password",
    "--token",
    "--tls-ca",
    "--tls-cert",
    "--tls-key",
    "--prefix",
}
"""The connection flags, documented once in the page's Connection table."""


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


@cache
def commands() -> dict[str, argparse.ArgumentParser]:
    """Every command by its words (``pause workflow``), a command with subcommands included
    when it also runs alone (``runs``, ``partitions``)."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        subs = _subcommands(parser)
        runs_alone = not any(
            isinstance(a, argparse._SubParsersAction) and a.required for a in parser._actions
        )
        if words and (not subs or runs_alone):
            out[" ".join(words)] = parser
        for name, child in subs.items():
            walk(child, (*words, name))

    walk(build_parser(), ())
    return out


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def _is_output_format(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    """``--output json|yaml|table`` and its ``--json``, described once for every reading
    command at the top of the page (not ``-o FILE`` of the commands that write a file, nor
    the ``--json`` of a command that has no other formats)."""
    formats = any(
        a.dest == "output" and set(a.choices or ()) >= {"json", "table"} for a in parser._actions
    )
    return formats and action.dest in ("output", "json")


def sections() -> dict[str, str]:
    """Each command of the page by its words, and the text of every section whose heading
    names it (heading and body, to the next heading, after the text its chapter opens with:
    ``## Credentials`` says what every ``creds`` command takes)."""
    text = CLI_DOC.read_text(encoding="utf-8")
    out: dict[str, str] = {}
    chapter = ""
    for found in re.finditer(r"^(#{2,4}) (.*?)\n(.*?)(?=^#{2,4} |\Z)", text, re.M | re.S):
        level, heading, body = found[1], found[2], found[3]
        if level == "##":
            chapter = body
        for code in re.findall(r"`(interlock [^`]+)`", heading):
            for variant in _alternatives(code):
                words = resolve(variant)[0]
                if words is not None and heading not in out.get(words, ""):
                    out[words] = out.get(words, chapter) + heading + "\n" + body
    return out


def _alternatives(code: str) -> list[str]:
    """``interlock get workflow|run|agent NAME`` as each command it names."""
    variants = [""]
    for word in code.split():
        parts = word.split("|") if re.fullmatch(r"[a-z-]+(\|[a-z-]+)+", word) else [word]
        variants = [f"{v} {p}".strip() for v in variants for p in parts]
    return variants


def resolve(line: str) -> tuple[str | None, list[str]]:
    """The command an ``interlock ...`` line names (the longest one its words spell) and
    the words after it; ``None`` when its first word is no command."""
    words = re.sub(r"[\[\]{}()|,;]", " ", line).split()[1:]
    while words and words[0].split("=", 1)[0] in CONNECTION:  # `interlock --server URL runs`
        words = words[1:] if "=" in words[0] else words[2:]
    known = commands()
    command = None
    taken = 0
    for n in range(1, min(len(words), 3) + 1):
        if " ".join(words[:n]) in known:
            command, taken = " ".join(words[:n]), n
    return command, words[taken:]


START = re.compile(r"(?:^|(?<=bin/)|(?<=\$ )|(?<=\$\()|(?<=xargs -n1 ))interlock (?=[a-z])")
"""Where a command line starts: at the start of a piece of a line, after a path or a
prompt, or as what ``xargs`` runs (``from interlock import`` and ``-n interlock`` are not)."""


def _commands_in(line: str) -> Iterator[str]:
    for piece in re.split(r"\s(?:\|\|?|&&|;)\s|`", line):
        for found in START.finditer(piece.strip()):
            yield piece.strip()[found.start() :].split("  #")[0].split(" # ")[0].strip()


def command_lines() -> Iterator[tuple[str, str]]:
    """Every ``interlock WORD ...`` a reader is shown: inline code, and the lines of
    shell blocks, with the page it is on."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        name = str(page.relative_to(ROOT))
        for block in re.findall(r"```(?:sh|bash|console|shell)?\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                for command in _commands_in(line):
                    yield name, command
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for code in re.findall(r"`([^`\n]+)`", prose):
            for command in _commands_in(code):
                yield name, command


def _flag_words(rest: list[str]) -> set[str]:
    named = set()
    for word in rest:
        found = re.match(r"(--?[a-zA-Z][\w-]*)", word.strip("'\"`.:"))
        if found and not re.fullmatch(r"-\d.*", word):
            named.add(found[1])
    return named


def test_the_page_has_a_section_per_command() -> None:
    missing = sorted(set(commands()) - set(sections()))
    assert missing == [], f"commands with no heading in docs/cli.md: {missing}"


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_flag_of_a_command_is_in_its_section(command: str) -> None:
    section = sections().get(command, "")
    parser = commands()[command]
    missing = sorted(
        action.option_strings[-1]
        for action in parser._actions
        if action.option_strings
        and not set(action.option_strings) & (CONNECTION | {"--help"})
        and not _is_output_format(parser, action)
        and not any(
            re.search(rf"`[^`]*{re.escape(flag)}(?![\w-])[^`]*`", section)
            for flag in action.option_strings
        )
    )
    assert missing == [], f"interlock {command}: flags not in its section of docs/cli.md"


def test_the_exit_codes_table_has_a_row_for_every_command() -> None:
    """Each command's codes: a row names it, or its group (``tokens``, ``creds``)."""
    text = CLI_DOC.read_text(encoding="utf-8")
    table = text.split("Each command's codes", 1)[1].split("\n\n", 2)[1]
    named = set()
    for row in table.splitlines()[2:]:
        cell = re.split(r"(?<!\\)\|", row)[1].replace("\\|", "|")
        for code in re.findall(r"`([^`]+)`", cell):
            for variant in _alternatives(f"interlock {code}"):
                named.add(resolve(variant)[0] or variant.split()[1])
    groups = named - set(commands())  # `tokens`: every tokens command
    missing = [c for c in commands() if c not in named and c.split()[0] not in groups]
    assert missing == []


def test_the_connection_table_names_every_connection_flag() -> None:
    text = CLI_DOC.read_text(encoding="utf-8")
    table = text.split("## Connection", 1)[1].split("\n## ", 1)[0]
    rows = "\n".join(line for line in table.splitlines() if line.startswith("| `"))
    named = set(re.findall(r"`(--?[a-z][\w-]*)", rows))
    taken = flags(commands()["runs"]) & (CONNECTION | named)
    assert named == taken == CONNECTION


def test_every_command_line_in_the_docs_names_a_command_and_its_flags() -> None:
    wrong = []
    for page, line in command_lines():
        first = line.split()[1]
        command, rest = resolve(line)
        if command is None:
            groups = {words.split()[0] for words in commands()}
            if re.fullmatch(r"[a-z][a-z-]*", first) and first not in groups:
                wrong.append(f"{page}: `{line}`: no command {first!r}")
            continue
        known = flags(commands()[command]) | CONNECTION
        unknown = sorted(_flag_words(rest) - known)
        if unknown:
            wrong.append(f"{page}: `{line}`: interlock {command} takes no {', '.join(unknown)}")
    assert wrong == []


def test_every_variable_the_code_reads_is_in_the_docs_and_no_other() -> None:
    """``INTERLOCK_*``: each the processes read is named in a page, and a page names none
    that nothing reads (the tests' own included; ``INTERLOCK_TLS_*`` in prose is left)."""
    name = re.compile(r"INTERLOCK_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])")

    def read_in(*folders: str) -> set[str]:
        return {
            found
            for folder in folders
            for path in (ROOT / folder).rglob("*.py")
            for found in name.findall(path.read_text(encoding="utf-8"))
        }

    named = {found for page in PAGES for found in name.findall(page.read_text(encoding="utf-8"))}
    assert sorted(read_in("orchestrator", "agents") - named) == [], "read, in no page"
    assert sorted(named - read_in("orchestrator", "agents", "tests")) == [], "read by nothing"


@pytest.mark.parametrize("command", sorted(commands()))
def test_the_values_a_section_gives_a_flag_are_its_choices(command: str) -> None:
    """``--status running|completed|...``, ``--role operator|publisher|reader``: each value
    written is one the parser takes."""
    section = sections().get(command, "")
    wrong = []
    for action in commands()[command]._actions:
        if not action.option_strings or not action.choices:
            continue
        for flag in action.option_strings:
            pattern = re.escape(flag) + r"[ =]([a-z0-9-]+(?:\|[a-z0-9-]+)+)"
            for written in re.findall(pattern, section):
                wrong += [(flag, v) for v in written.split("|") if v not in action.choices]
    assert wrong == []

"""The README's "Transcripts" section: its Python examples run, and its claims hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eventstore import (
    Message,
    Role,
)
from eventstore.cli.transcript_text import describe_message

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end >= 0 else len(README)]


SECTION = _section("Transcripts")
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", SECTION, re.S)


def test_the_section_has_its_examples() -> None:
    assert len(PYTHON_BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_each_python_example_runs(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # an empty directory, as a reader starts
    namespace: dict[str, object] = {}
    exec(compile(PYTHON_BLOCKS[index], f"README Transcripts example {index}", "exec"), namespace)


def test_the_rich_message_example_reads_as_the_section_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    exec(PYTHON_BLOCKS[0], {})
    from eventstore import SessionStore

    with SessionStore(".eventstore") as store:
        msgs = store.load_transcript_messages("agent-1")
    assert [c.name for m in msgs for c in m.tool_calls] == ["Bash"]
    assert '→ Bash#t1 {"command":"ls"}' in describe_message(msgs[1])
    assert describe_message(msgs[2]).endswith("← t1: README.md setup.py")
    assert '`→ Bash#t1 {"command":"ls"}`' in SECTION


def test_the_claude_code_example_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(PYTHON_BLOCKS[1], namespace)  # it asserts the byte-for-byte round trip itself
    report = namespace["report"]
    assert report.appended == {namespace["sid"]: 3} and report.malformed == []  # type: ignore[attr-defined]
    assert "assert exported == path.read_bytes()" in PYTHON_BLOCKS[1]


def test_the_paging_example_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(PYTHON_BLOCKS[2], namespace)
    assert [m.content for m in namespace["newest"]] == [f"turn {i}" for i in range(80, 100)]  # type: ignore[attr-defined]


def test_plain_messages_are_unchanged_by_the_new_fields() -> None:
    assert Message(Role.USER, "x") == Message(role=Role.USER, content="x")


def test_no_event_or_projection_version_changed() -> None:
    """The section says no version changed: old readers and snapshots stay valid."""
    from eventstore import MessagesAppended
    from projections import TranscriptProjection

    assert MessagesAppended.VERSION == 1 and TranscriptProjection.version == 1
    assert "no event version changed" in SECTION

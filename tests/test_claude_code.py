"""Claude Code transcripts: import (one session per sessionId, every line verbatim,
messages mirrored with their tool calls), export byte for byte, idempotent re-import
without a bound, duplicates kept, malformed lines reported, following a growing file."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import (
    InvalidArgumentError,
    Role,
    SessionStore,
    ToolResultBlock,
)
from eventstore.integrations import claude_code
from eventstore.integrations.claude_code import (
    BATCH_LINES,
    LINE_MAX_DEPTH,
    ClaudeCodeLine,
    TranscriptFollower,
    export_transcript,
    follow_transcripts,
    import_transcript,
    open_store,
    to_message,
    transcript_files,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "claude_code"
PROJECT = FIXTURES / "projects" / "-home-dev-kvcache"
S1 = "0b7e4f5c-2d1a-4c3b-9e8f-7a6b5c4d3e2f"
S2 = "5f3c9a10-8b2e-4d7f-a1c6-e9d8b7a6f504"
FILE1 = PROJECT / f"{S1}.jsonl"
FILE2 = PROJECT / f"{S2}.jsonl"
ODD = FIXTURES / "odd.jsonl"
MESSAGES_S1 = 18  # user, assistant and system lines of FILE1 (its summary is none)


@pytest.fixture
def cc(tmp_path: Path) -> Iterator[SessionStore]:
    with open_store(tmp_path / "store") as s:
        yield s


def exported(store: SessionStore, sid: str) -> bytes:
    return b"".join(export_transcript(store, sid))


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


# -- round trip ----------------------------------------------------------------------------


def test_a_project_directory_round_trips_byte_for_byte(cc: SessionStore) -> None:
    reports = [import_transcript(cc, f) for f in transcript_files(FIXTURES / "projects")]
    assert [r.malformed for r in reports] == [[], []]
    assert sorted(cc.list_sessions()) == [S1, S2]
    assert exported(cc, S1) == FILE1.read_bytes()
    # the resumed session's file opens with three of S1's lines: they belong to S1
    assert exported(cc, S2) == b"".join(lines_of(FILE2)[3:])
    assert reports[1].appended == {S1: 0, S2: 4} and reports[1].already == 3


def test_the_round_trip_holds_after_restart_and_compaction(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with open_store(root) as s:
        import_transcript(s, FILE1)
    with open_store(root) as s:
        assert exported(s, S1) == FILE1.read_bytes()
        s.compact(
            S1, archive=False, force=True
        )  # the lines live on in the snapshot, not the archive
    with open_store(root) as s:
        assert exported(s, S1) == FILE1.read_bytes()
        assert import_transcript(s, FILE1).appended == {S1: 0}
        assert s.verify(S1).ok


def test_a_store_that_does_not_know_the_lines_keeps_them_through_compaction(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    with open_store(root) as s:
        import_transcript(s, FILE1)
        seq = s.last_seq(S1)
    with SessionStore(root) as plain:  # e.g. `eventstore compact` without the integration
        plain.compact(S1, archive=False, force=True)
    with open_store(root) as s:
        assert exported(s, S1) == FILE1.read_bytes()
        assert import_transcript(s, FILE1).appended == {S1: 0}
        assert s.last_seq(S1) == seq


def test_each_kept_line_is_an_event_holding_the_line_inline(cc: SessionStore) -> None:
    import_transcript(cc, FILE1)
    events = list(cc.read_events(S1, types=[ClaudeCodeLine]))
    assert [e.original() + b"\n" for e in events if isinstance(e, ClaudeCodeLine)] == lines_of(
        FILE1
    )
    log_line = (cc.root / "sessions" / S1 / "log.jsonl").read_bytes().splitlines()[1]
    doc = msgspec.json.decode(log_line)  # jq-readable: the line is an object, not a string
    assert doc["type"] == "claude_code_line" and doc["line"]["sessionId"] == S1


# -- idempotence and duplicates --------------------------------------------------------


def test_re_import_appends_nothing(cc: SessionStore) -> None:
    for f in transcript_files(FIXTURES):
        import_transcript(cc, f)
    seqs = {sid: cc.last_seq(sid) for sid in cc.list_sessions()}
    for f in transcript_files(FIXTURES):
        report = import_transcript(cc, f)
        assert sum(report.appended.values()) == 0
        assert report.already == report.lines - len(report.malformed)
    assert {sid: cc.last_seq(sid) for sid in cc.list_sessions()} == seqs


def test_re_import_is_unbounded_far_past_the_idempotency_window(
    cc: SessionStore, tmp_path: Path
) -> None:
    n = 2 * BATCH_LINES + 500  # more lines than the 1,000 idempotency keys remembered
    f = tmp_path / "big.jsonl"
    f.write_text(
        "".join(
            f'{{"type":"user","sessionId":"big","uuid":"u{i}",'
            f'"message":{{"role":"user","content":"turn {i}"}}}}\n'
            for i in range(n)
        )
    )
    assert import_transcript(cc, f).appended == {"big": n}
    seq = cc.last_seq("big")
    assert import_transcript(cc, f).appended == {"big": 0}
    assert cc.last_seq("big") == seq
    assert len(cc.load_transcript_messages("big")) == n
    assert exported(cc, "big") == f.read_bytes()


def test_a_repeated_uuid_with_other_content_and_a_repeated_line_are_all_kept(
    cc: SessionStore,
) -> None:
    import_transcript(cc, FILE1)
    lines = exported(cc, S1).splitlines()
    uuids = [msgspec.json.decode(ln).get("uuid") for ln in lines]
    streamed = [ln for ln, u in zip(lines, uuids, strict=True) if uuids.count(u) > 1]
    assert len({msgspec.json.decode(ln)["uuid"] for ln in streamed}) == 2  # two repeated uuids
    assert len(streamed) == 4 and len(set(streamed)) == 3  # one of them is an exact repeat
    texts = [m.content for m in cc.load_transcript_messages(S1)]
    assert "I'll add an OrderedDict" in texts
    assert "I'll add an OrderedDict and evict the oldest key on put." in texts


def test_a_file_growing_by_a_repeated_line_keeps_the_new_copy(
    cc: SessionStore, tmp_path: Path
) -> None:
    line = b'{"type":"summary","summary":"s","leafUuid":"x"}\n'
    f = tmp_path / "s.jsonl"
    f.write_bytes(line)
    import_transcript(cc, f)
    f.write_bytes(line * 3)
    assert import_transcript(cc, f).appended == {"s": 2}
    assert import_transcript(cc, f).appended == {"s": 0}
    assert exported(cc, "s") == line * 3


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(
                st.text(max_size=6), st.integers() | st.text(max_size=8) | st.none(), max_size=4
            ),
            st.sampled_from(["", " ", "\t", "\r", " \r"]),
            st.sampled_from(["", " ", "\t  "]),
        ),
        max_size=12,
    ),
    st.data(),
)
def test_any_object_lines_round_trip_and_re_import_appends_nothing(
    tmp_path_factory: pytest.TempPathFactory,
    lines: list[tuple[dict[str, object], str, str]],
    data: st.DataObject,
) -> None:
    """Arbitrary objects, repeats, whitespace around them, CRLF endings: what is
    exported is the file, and importing it again (or any prefix of it) adds nothing."""
    encoded = [
        (lead + msgspec.json.encode(obj).decode() + trail + "\n").encode()
        for obj, trail, lead in lines
    ]
    encoded += data.draw(st.lists(st.sampled_from(encoded), max_size=3)) if encoded else []
    tmp = tmp_path_factory.mktemp("cc")
    f = tmp / "sess.jsonl"
    f.write_bytes(b"".join(encoded))
    with open_store(tmp / "store") as s:
        prefix = data.draw(st.integers(0, len(encoded)))
        f.write_bytes(b"".join(encoded[:prefix]))
        import_transcript(s, f)
        f.write_bytes(b"".join(encoded))
        report = import_transcript(s, f)
        assert report.malformed == []
        if encoded:
            assert exported(s, "sess") == b"".join(encoded)
            seq = s.last_seq("sess")
            assert import_transcript(s, f).appended == {"sess": 0}
            assert s.last_seq("sess") == seq


def test_concurrent_importers_of_one_file_keep_each_line_once(tmp_path: Path) -> None:
    root = tmp_path / "store"
    errors: list[BaseException] = []

    def importer() -> None:
        try:
            with open_store(root) as s:  # a store each: they share only the files
                for _ in range(3):
                    import_transcript(s, FILE1)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=importer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with open_store(root) as s:
        assert exported(s, S1) == FILE1.read_bytes()
        assert len(s.load_transcript_messages(S1)) == MESSAGES_S1


# -- malformed lines ---------------------------------------------------------------------


def test_malformed_lines_are_reported_with_file_and_line_and_skipped(cc: SessionStore) -> None:
    report = import_transcript(cc, ODD)
    got = [(m.path, m.line, m.reason.split(":")[0]) for m in report.malformed]
    assert got == [
        (str(ODD), 2, "not JSON"),
        (str(ODD), 3, "not a JSON object (a list)"),
        (str(ODD), 4, "not a JSON object (a str)"),
        (str(ODD), 5, "blank line"),
        (str(ODD), 7, "not JSON"),
        (str(ODD), 8, "not JSON"),
    ]
    data = ODD.read_bytes()
    for m in report.malformed:  # offsets point at the line's first byte
        assert data[m.offset - 1 : m.offset] == b"\n"
        assert data[m.offset :].split(b"\n", 1)[0] == data.splitlines()[m.line - 1]
    odd_lines = lines_of(ODD)
    # the objects were kept: whitespace and CRLF verbatim; the last line gains its newline
    assert exported(cc, S1) == odd_lines[0] + odd_lines[5] + odd_lines[9] + b"\n"
    assert exported(cc, "odd") == odd_lines[8]  # no sessionId: the file's session


def test_an_unusable_session_id_is_reported_and_the_rest_imported(
    cc: SessionStore, tmp_path: Path
) -> None:
    f = tmp_path / "f.jsonl"
    f.write_bytes(
        b'{"type":"user","sessionId":"","message":{"role":"user","content":"a"}}\n'
        b'{"type":"user","sessionId":7,"message":{"role":"user","content":"b"}}\n'
        b'{"type":"user","sessionId":"ok","message":{"role":"user","content":"c"}}\n'
    )
    report = import_transcript(cc, f)
    assert [(m.line, m.reason.split(":")[0]) for m in report.malformed] == [
        (1, "bad sessionId"),
        (2, "bad sessionId"),
    ]
    assert [m.content for m in cc.load_transcript_messages("ok")] == ["c"]


def test_a_message_that_cannot_be_mirrored_is_still_kept_verbatim(
    cc: SessionStore, tmp_path: Path
) -> None:
    f = tmp_path / "f.jsonl"
    # a timestamp whose UTC offset has seconds cannot be stored (it would not read back)
    line = (
        b'{"type":"user","sessionId":"s","timestamp":"2026-03-01T09:00:00+01:00:30",'
        b'"message":{"role":"user","content":"x"}}\n'
    )
    f.write_bytes(line)
    report = import_transcript(cc, f)
    assert report.malformed == [] and [m.line for m in report.unmirrored] == [1]
    assert exported(cc, "s") == line
    assert cc.load_transcript_messages("s") == []


def _deep_line(levels: int) -> bytes:
    """A user line (no message) nesting exactly `levels` levels of arrays and objects."""
    return b'{"type":"user","sessionId":"s","x":' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}"


@pytest.mark.parametrize(
    "levels", [LINE_MAX_DEPTH - 1, LINE_MAX_DEPTH, LINE_MAX_DEPTH + 1, 982, 1000]
)
def test_a_line_nested_too_deep_is_skipped_with_its_place_and_the_good_lines_import(
    tmp_path: Path, levels: int
) -> None:
    """A line nesting deeper than LINE_MAX_DEPTH is reported (file, line, offset) and
    skipped like any malformed line, and every good line imports; what imports exports
    byte for byte, from this store and a fresh one (0.1.0: 1,000 deep killed the import
    with a traceback, none of its good lines imported; ~982 imported, then `export`
    crashed)."""
    good = [
        b'{"type":"user","sessionId":"s","message":{"role":"user","content":"a"}}\n',
        b'{"type":"assistant","sessionId":"s","message":{"role":"assistant","content":"b"}}\n',
    ]
    deep = _deep_line(levels) + b"\n"
    f = tmp_path / "s.jsonl"
    f.write_bytes(good[0] + deep + good[1])
    kept = levels <= LINE_MAX_DEPTH
    with open_store(tmp_path / "store") as s:
        report = import_transcript(s, f)
        if kept:
            assert report.malformed == [] and report.appended == {"s": 3}
        else:
            [bad] = report.malformed
            assert (bad.path, bad.line, bad.offset) == (str(f), 2, len(good[0]))
            assert f"nests {levels} levels" in bad.reason and str(LINE_MAX_DEPTH) in bad.reason
            assert report.appended == {"s": 2}
        assert [m.content for m in s.load_transcript_messages("s")] == ["a", "b"]
    want = f.read_bytes() if kept else b"".join(good)
    with open_store(tmp_path / "store") as s:
        assert exported(s, "s") == want
        s.compact("s", force=True)
    with open_store(tmp_path / "store") as s:
        assert exported(s, "s") == want


def test_a_message_too_deep_to_mirror_is_kept_verbatim_and_reported(
    cc: SessionStore, tmp_path: Path
) -> None:
    """A line within LINE_MAX_DEPTH whose message would nest past what a transcript line
    holds (its `uuid` is mirrored three levels deeper) is kept, not mirrored."""
    deep_uuid = b"[" * (LINE_MAX_DEPTH - 2) + b"]" * (LINE_MAX_DEPTH - 2)
    line = (
        b'{"type":"user","sessionId":"s","uuid":' + deep_uuid
        + b',"message":{"role":"user","content":"x"}}\n'
    )  # fmt: skip
    f = tmp_path / "s.jsonl"
    f.write_bytes(line)
    report = import_transcript(cc, f)
    assert report.malformed == [] and [m.line for m in report.unmirrored] == [1]
    assert "nests" in report.unmirrored[0].reason
    assert exported(cc, "s") == line and cc.load_transcript_messages("s") == []


# JSON that Python's json reads and msgspec does not: what Node writes for a string cut
# inside an emoji (a lone surrogate escape), and numbers past a double's range
NODE_LINES = [
    b'{"type":"user","sessionId":"s","message":{"role":"user","content":"cut \\ud83d"}}',
    b'{"type":"user","sessionId":"s","message":{"role":"user","content":"\\udc00 low"}}',
    b'{"type":"assistant","sessionId":"s","message":{"role":"assistant","content":[{"type":'
    b'"tool_use","id":"t","name":"n","input":{"big":1e400,"neg":-1E+999,"ok":"\\ud83d\\ude00"}}]}}',
    b'{"type":"summary","sessionId":"s","n":1e400}',
]


def test_valid_json_msgspec_cannot_read_imports_and_exports_byte_for_byte(
    tmp_path: Path,
) -> None:
    """A lone surrogate escape or a number like 1e400 is valid JSON: the line is imported
    and exported byte for byte (also after compaction, and by a store that does not know
    Claude Code lines, which reads and verifies the log); its message is mirrored as Node
    reads it: a lone surrogate is U+FFFD, a number past a double's range null (0.1.0:
    skipped as "not JSON: Input data was truncated", and the export differed)."""
    f = tmp_path / "s.jsonl"
    f.write_bytes(b"\n".join(NODE_LINES) + b"\r\n")
    with open_store(tmp_path / "store") as s:
        report = import_transcript(s, f)
        assert report.malformed == [] and report.unmirrored == []
        assert report.appended == {"s": 4}
        assert exported(s, "s") == f.read_bytes()
        got = s.load_transcript_messages("s")
        assert [m.content for m in got] == ["cut \ufffd", "\ufffd low", ""]
        assert got[2].tool_calls[0].input == {"big": None, "neg": None, "ok": "\U0001f600"}
    with SessionStore(tmp_path / "store") as plain:  # the log decodes for every reader
        assert plain.verify("s").ok and len(list(plain.read_events("s"))) == 5
        assert plain.compact("s", force=True).compacted
    with open_store(tmp_path / "store") as s:
        assert exported(s, "s") == f.read_bytes()
        assert import_transcript(s, f).appended == {"s": 0}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.text(st.characters() | st.characters(categories=["Cs"]), max_size=12),
    number=st.sampled_from(
        ["1e400", "-1e400", "1E+309", "2e-400", "123456789012345678901234567890"]
        + ["1" + "0" * 5000, "-" + "9" * 4301]  # (past Python's int digit limit)
    ),
    ascii_only=st.booleans(),
)
def test_any_string_and_number_python_reads_round_trips(
    tmp_path_factory: pytest.TempPathFactory, text: str, number: str, ascii_only: bool
) -> None:
    """Any string (lone surrogates too, escaped as Python and Node write them) and any
    number: the line exports byte for byte, and the mirrored content is the string with
    each lone surrogate U+FFFD."""
    content = json.dumps(text, ensure_ascii=ascii_only)
    if not ascii_only and any("\ud800" <= c <= "\udfff" for c in text):
        content = json.dumps(text)  # (a raw lone surrogate has no UTF-8: Node escapes it)
    line = (
        '{"type":"user","sessionId":"s","n":' + number
        + ',"message":{"role":"user","content":' + content + "}}\n"
    ).encode()  # fmt: skip
    tmp = tmp_path_factory.mktemp("cc")
    f = tmp / "s.jsonl"
    f.write_bytes(line)
    with open_store(tmp / "store") as s:
        assert import_transcript(s, f).malformed == []
        assert exported(s, "s") == line
        [m] = s.load_transcript_messages("s")
        read = json.loads(content)  # (an escaped high and low surrogate read as one pair)
        assert m.content == "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in read)


@pytest.mark.parametrize(
    "line",
    [b'{"n":NaN}', b'{"n":Infinity}', b'{"s":"\xed\xa0\xbd"}', b'{"s":"\xff"}', b'{"a":1,}'],
    ids=["nan", "infinity", "utf8-encoded-surrogate", "invalid-utf8", "trailing-comma"],
)
def test_what_is_not_json_stays_malformed(cc: SessionStore, tmp_path: Path, line: bytes) -> None:
    """Python's json reads these too, but they are not JSON (or not UTF-8): skipped."""
    f = tmp_path / "s.jsonl"
    f.write_bytes(line + b"\n")
    [bad] = import_transcript(cc, f).malformed
    assert bad.reason.startswith("not JSON")


def test_a_plainly_opened_store_learns_claude_code_lines(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "plain") as plain:
        import_transcript(plain, FILE1)
        assert exported(plain, S1) == FILE1.read_bytes()
        assert plain.verify(S1).problems == []


# -- the mirrored transcript -------------------------------------------------------------


def test_messages_are_mirrored_with_tool_calls_results_times_and_metadata(
    cc: SessionStore,
) -> None:
    import_transcript(cc, FILE1)
    msgs = cc.load_transcript_messages(S1)
    assert len(msgs) == MESSAGES_S1  # user/assistant/system lines; summary lines are not messages
    first = msgs[0]
    assert first.role is Role.USER and first.content.startswith("Add LRU eviction")
    assert first.created_at is not None and first.created_at.isoformat().startswith(
        "2026-03-01T09:00:01"
    )
    assert first.metadata == {
        "uuid": f"{S1[:8]}-0000-4000-8000-000000000001",
        "parentUuid": None,
        "isSidechain": False,
    }
    calls = [c for m in msgs for c in m.tool_calls]
    assert [(c.name, c.id) for c in calls] == [
        ("Bash", "toolu_01Bash"),
        ("Read", "toolu_02Read"),
        ("Edit", "toolu_03Edit"),
        ("Task", "toolu_04Task"),
    ]
    assert calls[0].input == {
        "command": "ls src && wc -l src/cache.py",
        "description": "List the sources",
    }
    results = [(m.role, r) for m in msgs for r in m.tool_results]
    ids = [c.id for c in calls]
    assert [r.tool_use_id for _, r in results] == ids[:1] + ids  # the file repeats the first
    assert all(role is Role.TOOL for role, _ in results)
    assert results[0][1].content == "cache.py\nserver.py\n212 src/cache.py"
    assert [r.is_error for _, r in results] == [False, False, False, True, False]
    assert msgs[1].blocks[0].thinking == "Look at the cache module first."  # type: ignore[union-attr]
    image = next(m for m in msgs if any(b.__class__.__name__ == "ImageBlock" for b in m.blocks))
    assert image.content == "Here is the failing run:"
    assert image.blocks[1].source.startswith("sha256:")  # type: ignore[union-attr]
    assert msgs[-2].role is Role.SYSTEM and "hooks" in msgs[-2].content
    assert [m.metadata.get("isSidechain") for m in msgs].count(True) == 2
    assert msgs[2].metadata["model"] == "claude-sonnet-4-20250514"


def test_to_message_leaves_out_what_does_not_fit() -> None:
    assert to_message({"type": "summary", "summary": "x"}) is None
    assert to_message({"type": "user"}) is None
    assert to_message({"type": "user", "message": {"content": 5}}) is None
    m = to_message(
        {
            "type": "assistant",
            "timestamp": "not a time",
            "message": {
                "content": [
                    {"type": "redacted_thinking", "data": "x"},
                    {"type": "tool_use", "id": 1, "name": None, "input": [1]},
                    "not a block",
                ]
            },
        }
    )
    assert m is not None and m.created_at is None
    assert [(c.id, c.name, c.input) for c in m.tool_calls] == [("", "", {})]
    tool = to_message(
        {
            "type": "user",
            "message": {
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": {"a": 1}}]
            },
        }
    )
    assert tool is not None and tool.role is Role.TOOL
    assert tool.blocks == [ToolResultBlock(tool_use_id="t", content='{"a":1}')]


def test_mirrored_messages_and_their_lines_are_one_atomic_batch(cc: SessionStore) -> None:
    import_transcript(cc, FILE2)
    batches: list[list[str]] = [[]]
    for ev in cc.read_events(S2):
        batches[-1].append(type(ev).__name__)
        if ev.more == 0:
            batches.append([])
    assert batches[0] == ["ClaudeCodeLine"] * 4 + ["MessagesAppended"]


# -- following a file Claude Code is writing ---------------------------------------------


def test_a_follower_imports_a_partial_last_line_only_once_complete(
    cc: SessionStore, tmp_path: Path
) -> None:
    lines = lines_of(FILE1)
    f = tmp_path / f"{S1}.jsonl"
    follower = TranscriptFollower(cc, f)
    f.write_bytes(lines[0] + lines[1][:50])
    assert follower.poll().appended == {S1: 1}
    with f.open("ab") as out:
        out.write(lines[1][50:-1])  # all but the newline: still incomplete
    assert follower.poll().lines == 0
    with f.open("ab") as out:
        out.write(b"\n" + b"".join(lines[2:]))
    report = follower.poll()
    assert report.appended == {S1: len(lines) - 1} and report.malformed == []
    assert follower.poll().lines == 0
    assert exported(cc, S1) == FILE1.read_bytes()


def _replace_file(f: Path, data: bytes, how: str) -> None:
    if how == "renamed-over":  # an editor's or a sync tool's save: another inode
        tmp = f.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, f)
    else:  # truncated and rewritten: the same inode
        with f.open("r+b") as out:
            out.truncate(0)
            out.write(data)


@pytest.mark.parametrize("how", ["renamed-over", "rewritten-in-place"])
def test_a_followed_file_replaced_by_a_longer_one_is_read_again_from_its_start(
    cc: SessionStore, tmp_path: Path, how: str
) -> None:
    """A followed file replaced by a longer one with other lines is read again from its
    start: every line of the new file imports, no fragment is reported, nothing is
    doubled (0.1.0: resumed at the old byte offset, so the new file's first lines were
    never imported and a fragment was reported as malformed)."""
    old = b"".join(lines_of(FILE1)[:3])
    new = FILE2.read_bytes() + b"".join(lines_of(FILE1)[3:6])
    assert len(new) > len(old)
    f = tmp_path / f"{S1}.jsonl"
    f.write_bytes(old)
    follower = TranscriptFollower(cc, f)
    assert follower.poll().appended == {S1: 3}
    _replace_file(f, new, how)
    report = follower.poll()
    assert report.malformed == [] and report.lines == len(lines_of(f))
    assert import_transcript(cc, f).appended == {S1: 0, S2: 0}  # every new line is held
    assert exported(cc, S1).startswith(old)  # and the old ones were kept
    assert follower.poll().lines == 0


@pytest.mark.parametrize("how", ["renamed-over", "rewritten-in-place"])
def test_a_followed_file_replaced_by_itself_and_more_goes_on_where_it_was(
    cc: SessionStore, tmp_path: Path, how: str
) -> None:
    """A replacement holding the same bytes first (a copy that grew) is read on from
    where the follower was: the lines before are not read, nor reported, again."""
    lines = lines_of(FILE1)
    old = lines[0] + b"not json\n" + lines[1]
    f = tmp_path / f"{S1}.jsonl"
    f.write_bytes(old)
    follower = TranscriptFollower(cc, f)
    assert len(follower.poll().malformed) == 1
    _replace_file(f, old + b"".join(lines[2:]), how)
    report = follower.poll()
    assert report.malformed == [] and report.lines == len(lines) - 2
    assert exported(cc, S1) == FILE1.read_bytes()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(min_value=1, max_value=4000), min_size=1, max_size=8))
def test_a_follower_fed_in_arbitrary_pieces_ends_equal_to_a_one_shot_import(
    tmp_path_factory: pytest.TempPathFactory, cuts: list[int]
) -> None:
    data = FILE1.read_bytes()
    tmp = tmp_path_factory.mktemp("follow")
    f = tmp / f"{S1}.jsonl"
    f.write_bytes(b"")
    with open_store(tmp / "store") as s:
        follower = TranscriptFollower(s, f)
        pos = 0
        for cut in cuts:
            pos = min(len(data), pos + cut)
            f.write_bytes(data[:pos])
            assert follower.poll().malformed == []
        f.write_bytes(data)
        follower.poll()
        assert exported(s, S1) == data
        assert len(s.load_transcript_messages(S1)) == MESSAGES_S1


def test_follow_transcripts_picks_up_appended_lines_and_new_files_until_stopped(
    cc: SessionStore, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    lines1, lines2 = lines_of(FILE1), lines_of(FILE2)
    stop = threading.Event()
    seen: list[int] = []

    def writer() -> None:
        f1 = project / FILE1.name
        for ln in lines1:
            with f1.open("ab") as out:  # written in two pieces, as a slow writer would
                out.write(ln[:7])
                out.flush()
                time.sleep(0.002)
                out.write(ln[7:])
        (project / FILE2.name).write_bytes(b"".join(lines2))  # a session started meanwhile
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if cc.last_seq(S2) and b"".join(export_transcript(cc, S2)) == b"".join(lines2[3:]):
                break
            time.sleep(0.01)
        stop.set()

    t = threading.Thread(target=writer)
    t.start()
    totals = follow_transcripts(
        cc, [project], poll_interval=0.005, stop=stop, on_poll=lambda r: seen.append(r.lines)
    )
    t.join()
    assert exported(cc, S1) == FILE1.read_bytes()
    assert exported(cc, S2) == b"".join(lines2[3:])
    assert sum(r.lines for r in totals.values()) == len(lines1) + len(lines2)
    assert all(r.malformed == [] for r in totals.values())
    assert sum(seen) == len(lines1) + len(lines2)


def test_follow_transcripts_stops_when_idle_and_waits_for_a_missing_file(
    cc: SessionStore, tmp_path: Path
) -> None:
    f = tmp_path / "later.jsonl"
    t0 = time.monotonic()
    totals = follow_transcripts(cc, [f], poll_interval=0.01, idle_timeout=0.1)
    assert 0.1 <= time.monotonic() - t0 < 5
    assert totals == {}
    for bad in (0, 1e-320, float("nan"), float("inf"), True, "1"):
        with pytest.raises(InvalidArgumentError, match="poll_interval"):
            follow_transcripts(cc, [f], poll_interval=bad)  # type: ignore[arg-type]


# -- attacks -------------------------------------------------------------------------------


def _cc_lines(sid: str) -> list[bytes]:
    return [
        (
            f'{{"type":"user","sessionId":"{sid}","uuid":"u1","parentUuid":null,'
            '"timestamp":"2026-03-01T09:00:00.000Z","message":{"role":"user","content":"hi"}}'
        ).encode(),
        (
            f'{{"type":"assistant","sessionId":"{sid}","uuid":"u2","parentUuid":"u1",'
            '"timestamp":"2026-03-01T09:00:02.000Z",'
            '"message":{"role":"assistant","content":"hello"}}'
        ).encode(),
    ]


def _import_prefix_then_whole(tmp_path: Path, full: bytes, cut: int, sid: str) -> Any:
    path = tmp_path / f"{sid}.jsonl"
    store = claude_code.open_store(tmp_path / f"store-{cut}")
    path.write_bytes(full[:cut])  # Claude Code is still writing the file
    claude_code.import_transcript(store, path)
    path.write_bytes(full)  # the whole file, imported again
    claude_code.import_transcript(store, path)
    return store


def test_claude_code_a_crlf_file_imported_mid_write_keeps_each_line_once(
    tmp_path: Path,
) -> None:
    """README: "Re-import appends nothing"; the k-th copy of a line is new only if the
    session holds fewer than k. A CRLF file imported while its last line lacks only its
    `\\r\\n`, then imported whole, must hold each line once."""
    sid = "c0ffee00-0000-4000-8000-000000000001"
    full = b"".join(line + b"\r\n" for line in _cc_lines(sid))
    with _import_prefix_then_whole(tmp_path, full, len(full) - 2, sid) as store:
        exported = list(claude_code.export_transcript(store, sid))
        # the line read before its `\r\n` may be kept without its `\r`, but only once
        assert [x.rstrip(b"\r\n") for x in exported] == _cc_lines(sid), "a line was kept twice"
        assert len(store.load_transcript_messages(sid)) == 2


def test_claude_code_an_lf_file_truncated_at_every_byte_then_whole_is_imported_once(
    tmp_path: Path,
) -> None:
    """Coverage: for every cut of an LF file, importing the cut file and then the whole
    one gives exactly what one import of the whole file gives."""
    sid = "c0ffee00-0000-4000-8000-000000000002"
    full = b"".join(line + b"\n" for line in _cc_lines(sid))
    for cut in range(len(full) + 1):
        with _import_prefix_then_whole(tmp_path, full, cut, sid) as store:
            assert b"".join(claude_code.export_transcript(store, sid)) == full, cut
            assert len(store.load_transcript_messages(sid)) == 2, cut
            assert store.verify(sid).ok


# -- attacks: arbitrary bytes, an importer killed mid-import, lines far longer than a read --


REPO = Path(__file__).resolve().parent.parent


def _is_object(line: bytes) -> bool:
    try:
        return isinstance(msgspec.json.decode(line), dict)
    except msgspec.DecodeError:
        return False


_line_pieces = st.one_of(
    st.binary(max_size=30),
    st.sampled_from(
        [b'{"type":"summary","summary":"s"}', b"[]", b"{", b'"x"', b"{}", b" {} ", b"\xff", b"\r"]
    ),
    st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=5), max_size=3).map(
        msgspec.json.encode
    ),
)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_line_pieces, max_size=10), st.booleans())
def test_arbitrary_bytes_never_stop_an_import(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[bytes], final_newline: bool
) -> None:
    data = b"\n".join(pieces) + (b"\n" if final_newline and pieces else b"")
    tmp = tmp_path_factory.mktemp("bytes")
    f = tmp / "s.jsonl"
    f.write_bytes(data)
    with open_store(tmp / "store") as store:
        report = import_transcript(store, f)
        lines = data.split(b"\n")
        if data.endswith(b"\n") or not data:
            lines.pop()
        objects = [ln for ln in lines if _is_object(ln)]
        assert sorted(m.line for m in report.malformed) == [
            i + 1 for i, ln in enumerate(lines) if not _is_object(ln)
        ]
        got = b"".join(b"".join(export_transcript(store, sid)) for sid in store.list_sessions())
        assert sorted(got.splitlines()) == sorted(objects)
        assert import_transcript(store, f).appended in ({}, {"s": 0})


_IMPORTER = textwrap.dedent(
    """
    import sys
    from eventstore.integrations.claude_code import import_transcript, open_store
    with open_store(sys.argv[1]) as store:
        import_transcript(store, sys.argv[2])
    """
)


@pytest.mark.slow
def test_an_importer_killed_at_random_moments_leaves_nothing_doubled(tmp_path: Path) -> None:
    n = 12_000
    f = tmp_path / "long.jsonl"
    f.write_text(
        "".join(
            f'{{"type":"assistant","sessionId":"long","uuid":"u{i % 7000}","message":'
            f'{{"role":"assistant","content":[{{"type":"text","text":"turn {i}"}},'
            f'{{"type":"tool_use","id":"t{i}","name":"Bash",'
            f'"input":{{"command":"echo {i}"}}}}]}}}}\n'
            for i in range(n)
        )
    )
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(1729)
    kills = 0
    log = root / "sessions" / "long" / "log.jsonl"

    def log_size() -> int:
        try:
            return log.stat().st_size
        except FileNotFoundError:
            return 0

    for _ in range(6):
        # killed once the log has grown by a random amount: a moment in the import itself,
        # however fast or slow the machine is
        grow = rng.randint(1, 400_000)
        start = log_size()
        proc = subprocess.Popen([sys.executable, "-c", _IMPORTER, str(root), str(f)], env=env)
        deadline = time.monotonic() + 60
        while proc.poll() is None and log_size() - start < grow:
            if time.monotonic() > deadline:
                break
            time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    with open_store(root) as store:
        import_transcript(store, f)
        assert b"".join(export_transcript(store, "long")) == f.read_bytes()
        assert len(store.load_transcript_messages("long")) == n
        assert store.verify("long").ok
    assert kills >= 1  # the first import is killed before it has grown the log by 400 kB


def test_a_line_far_longer_than_a_read_round_trips(tmp_path: Path) -> None:
    big = msgspec.json.encode(
        {
            "type": "user",
            "sessionId": "big",
            "message": {"role": "user", "content": "x" * 3_000_000},
        }
    )
    f = tmp_path / "big.jsonl"
    f.write_bytes(b'{"type":"summary","summary":"s"}\n' + big + b"\n")
    with open_store(tmp_path / "store") as store:
        report = import_transcript(store, f)
        assert report.appended == {"big": 2}
        assert b"".join(export_transcript(store, "big")) == f.read_bytes()
        assert len(store.load_transcript_messages("big")[0].content) == 3_000_000

"""Rich transcript messages: tool calls and results, names, content blocks, a time per
message, metadata; and that old lines and old callers (role + content) read and write
byte for byte as before."""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import rich_messages

from eventstore import (
    ImageBlock,
    InvalidRecordError,
    Message,
    MessagesAppended,
    Role,
    SessionStore,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from eventstore.cli.app import main as cli_main
from eventstore.cli.transcript_text import (
    describe_block,
    describe_message,
)
from eventstore.format.codec import EventCodec
from eventstore.records import text_of

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
LOGS = FIXTURES / "logs"


def _call() -> Message:
    return Message(
        role=Role.ASSISTANT,
        content="listing the repo",
        blocks=[
            ThinkingBlock(thinking="the user wants the files", signature="sig=="),
            TextBlock(text="listing the repo"),
            ToolUseBlock(id="toolu_01", name="Bash", input={"command": "ls", "timeout": 5}),
        ],
        created_at=datetime(2026, 3, 1, 9, 30, tzinfo=timezone(timedelta(hours=1))),
        metadata={"model": "claude-x", "usage": {"input_tokens": 12, "output_tokens": 40}},
    )


def _result() -> Message:
    return Message(
        role=Role.TOOL,
        content="",
        name="Bash",
        blocks=[ToolResultBlock(tool_use_id="toolu_01", content="README.md\nsetup.py")],
    )


# -- backwards compatibility: old lines and old callers, byte for byte -------------------

# Written by the code before rich messages existed (role + content only): the same event
# must encode to exactly these bytes now, hash included.
GOLDEN_LINE = (
    b'{"type":"messages_appended","seq":7,"ts":"2026-03-01T08:00:00Z","key":"k1",'
    b'"messages":[{"role":"user","content":""},'
    b'{"role":"assistant","content":"\xc3\xbcn\xc3\xaf \\"q\\"\\n\xe2\x9c\x93"},'
    b'{"role":"tool","content":"{\\"ok\\":true}"},{"role":"system","content":"s"}],'
    b'"h":"cf66e719a3842d99"}\n'
)
GOLDEN_MESSAGES = [
    Message(Role.USER, ""),  # positional, as old callers may write it
    Message(role=Role.ASSISTANT, content='ünï "q"\n✓'),
    Message(Role.TOOL, '{"ok":true}'),
    Message(Role.SYSTEM, "s"),
]
GOLDEN_TS = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def test_old_callers_write_the_golden_line_byte_for_byte() -> None:
    ev = MessagesAppended(messages=GOLDEN_MESSAGES)
    data, _, _ = EventCodec().encode_batch([ev], 7, "9f2c0d1e6a7b3c45", GOLDEN_TS, "k1")
    assert data == GOLDEN_LINE


def test_the_golden_line_reads_as_plain_messages_and_encodes_back() -> None:
    codec = EventCodec()
    ev = codec.decode_line(GOLDEN_LINE.rstrip(b"\n"), 0, "golden")
    assert isinstance(ev, MessagesAppended)
    assert ev.messages == GOLDEN_MESSAGES
    for m in ev.messages:
        assert (m.name, m.blocks, m.created_at, m.metadata) == (None, [], None, {})
    body = codec.encode_unhashed(msgspec.structs.replace(ev, h=""))
    assert body[:-1] == GOLDEN_LINE[: GOLDEN_LINE.index(b',"h":')]


def _make_fixtures_module() -> Any:
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_fixtures"] = module
    spec.loader.exec_module(module)
    return module


def test_the_golden_session_is_rewritten_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fixtures/logs/complete.jsonl was written by the old code through the session API;
    the same calls now write the same bytes (every message line, every hash)."""
    make = _make_fixtures_module()
    with make.clock():  # the fixture script's own clock
        data = make.write_session(tmp_path / "store")
    assert data == (LOGS / "complete.jsonl").read_bytes()
    assert data.count(b'"type":"messages_appended"') == 3


def test_old_lines_load_as_messages_with_every_new_field_at_its_default(
    store: SessionStore, install_log: Any
) -> None:
    install_log("complete.jsonl")
    msgs = store.load_transcript_messages("golden")
    assert [m.role for m in msgs] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert all(m == Message(role=m.role, content=m.content) for m in msgs)


# -- rich messages round trip ------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(rich_messages)
def test_a_rich_message_round_trips_through_the_codec(message: Message) -> None:
    codec = EventCodec()
    data, _, _ = codec.encode_batch([MessagesAppended(messages=[message])], 1, "", GOLDEN_TS, None)
    ev = codec.decode_line(data.rstrip(b"\n"), 0, "t")
    assert isinstance(ev, MessagesAppended)
    assert ev.messages == [message]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.lists(rich_messages, min_size=1, max_size=3), min_size=1, max_size=4))
def test_rich_messages_round_trip_through_the_store_and_compaction(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[Message]]
) -> None:
    root = tmp_path_factory.mktemp("rich")
    flat = [m for batch in batches for m in batch]
    with SessionStore(root) as store:
        for batch in batches:
            store.append_transcript_messages("s", batch)
        assert store.load_transcript_messages("s") == flat
    with SessionStore(root) as fresh:  # read back from the file, not the cache
        assert fresh.load_transcript_messages("s") == flat
        fresh.compact("s", force=True)
    with SessionStore(root) as after:  # read back from the snapshot
        assert after.load_transcript_messages("s") == flat
        assert after.transcript_at("s", seq=len(batches)) == flat
        assert after.verify("s").ok


def test_an_unset_field_is_absent_from_the_line_and_a_set_one_present(store: SessionStore) -> None:
    store.append_transcript_messages("s", [Message(Role.USER, "hi"), _call(), _result()])
    line = next(
        ln for ln in (store.root / "sessions" / "s" / "log.jsonl").read_bytes().splitlines()
    )
    doc = msgspec.json.decode(line)
    plain, call, result = doc["messages"]
    assert plain == {"role": "user", "content": "hi"}
    assert list(call) == ["role", "content", "blocks", "created_at", "metadata"]
    assert call["blocks"][2] == {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "Bash",
        "input": {"command": "ls", "timeout": 5},
    }
    assert call["created_at"] == "2026-03-01T09:30:00+01:00"
    assert result == {
        "role": "tool",
        "content": "",
        "name": "Bash",
        "blocks": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "README.md\nsetup.py"}
        ],
    }


def test_tool_calls_and_tool_results_list_their_blocks_in_order() -> None:
    m = Message(
        role=Role.ASSISTANT,
        content="",
        blocks=[
            ToolUseBlock(id="a", name="Read"),
            TextBlock(text="x"),
            ToolResultBlock(tool_use_id="a", content="ok"),
            ToolUseBlock(id="b", name="Edit", input={"path": "f"}),
        ],
    )
    assert [c.id for c in m.tool_calls] == ["a", "b"]
    assert [r.tool_use_id for r in m.tool_results] == ["a"]
    assert Message(Role.USER, "x").tool_calls == []
    assert text_of(m.blocks) == "x"


def test_a_loaded_rich_message_is_the_callers_own(store: SessionStore) -> None:
    store.append_transcript_messages("s", [_call(), _result()])
    loaded = store.load_transcript_messages("s")
    loaded[0].metadata["usage"]["input_tokens"] = 999
    loaded[0].blocks.clear()
    with pytest.raises(AttributeError):  # blocks are frozen
        loaded[1].blocks[0].content = "changed"  # type: ignore[misc, union-attr]
    assert store.load_transcript_messages("s") == [_call(), _result()]


def test_a_loaded_rich_message_is_the_callers_own_blocks_and_inputs(
    store: SessionStore,
) -> None:
    store.append_transcript_messages("s", [_call()])
    loaded = store.load_transcript_messages("s")
    loaded[0].blocks[2].input["command"] = "rm -rf /"  # type: ignore[union-attr]
    loaded[0].blocks.append(TextBlock(text="more"))
    assert store.load_transcript_messages("s") == [_call()]


def test_a_loaded_plain_message_has_containers_of_its_own_and_shares_its_text(
    store: SessionStore,
) -> None:
    store.append_transcript_messages("s", [Message(Role.USER, "a" * 1000)])
    one, two = store.load_transcript_messages("s")[0], store.load_transcript_messages("s")[0]
    assert one == two and one is not two
    assert one.blocks is not two.blocks and one.metadata is not two.metadata
    assert one.content is two.content  # a str cannot change: not copied


@pytest.mark.parametrize(
    ("message", "where"),
    [
        (Message(Role.USER, "x", created_at=datetime(2026, 1, 1)), "created_at"),  # naive
        (Message(Role.USER, "x", metadata={"k": (1, 2)}), "metadata"),  # a tuple reads back a list
        (Message(Role.USER, "x", metadata={"k": {1, 2}}), "messages[0]"),  # a set is not JSON
        (Message(Role.USER, "x", blocks=[{"type": "text", "text": "x"}]), "blocks"),  # type: ignore[list-item]
        (
            Message(
                Role.USER, "x", blocks=[ToolUseBlock(id="a", name="b", input={"f": float("nan")})]
            ),
            "blocks",
        ),
        (Message(Role.USER, "x", name=3), "name"),  # type: ignore[arg-type]
        (Message(Role.USER, "x", blocks=(TextBlock(text="t"),)), "blocks"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_rich_message_is_refused_and_nothing_is_written(
    store: SessionStore, message: Message, where: str
) -> None:
    with pytest.raises(InvalidRecordError, match=r"messages\[0\]") as info:
        store.append_transcript_messages("s", [Message(Role.USER, "ok"), message][1:])
    assert where in str(info.value)
    assert store.last_seq("s") == 0


# -- the readable form -------------------------------------------------------------------


def test_describe_message_shows_text_calls_results_thinking_and_images() -> None:
    assert describe_message(Message(Role.USER, "hello")) == "hello"
    assert describe_message(_call()) == (
        "listing the repo  [thinking] the user wants the files"
        '  → Bash#toolu_01 {"command":"ls","timeout":5}'
    )
    assert describe_message(_result()) == "Bash:  ← toolu_01: README.md\nsetup.py"
    failed = ToolResultBlock(
        tool_use_id="t9",
        content=[
            TextBlock(text="no such file"),
            ImageBlock(source="sha256:ab", media_type="image/png"),
        ],
        is_error=True,
    )
    assert describe_block(failed) == "← t9 (error): no such file  [image/png sha256:ab]"
    assert describe_block(ImageBlock(source="https://x/y.png")) == "[image https://x/y.png]"


def test_describe_message_keeps_text_blocks_that_differ_from_content() -> None:
    m = Message(Role.ASSISTANT, "summary", blocks=[TextBlock(text="full answer")])
    assert describe_message(m) == "summary  full answer"
    only_blocks = Message(Role.ASSISTANT, "", blocks=[TextBlock(text="a"), TextBlock(text="b")])
    assert describe_message(only_blocks) == "a  b"


def test_cli_transcript_shows_tool_calls_and_results(
    store: SessionStore, capsys: pytest.CaptureFixture[str]
) -> None:
    store.append_transcript_messages("s", [Message(Role.USER, "what is here?"), _call(), _result()])
    assert cli_main(["transcript", str(store.root), "s", "--full"]) == 0
    out = capsys.readouterr().out
    assert "→ Bash#toolu_01" in out and '"command":"ls"' in out
    assert "← toolu_01: README.md" in out
    assert cli_main(["transcript", str(store.root), "s", "--json"]) == 0
    doc = msgspec.json.decode(capsys.readouterr().out)
    assert doc[1]["blocks"][2]["name"] == "Bash"
    assert doc[2]["name"] == "Bash"


def test_messages_and_blocks_are_not_tracked_by_the_cyclic_gc(tmp_path: Path) -> None:
    """A loaded transcript adds nothing for the collector to walk (gc=False): a cold
    load of thousands of messages runs no collection passes over them."""
    import gc

    from eventstore.records import (
        ImageBlock,
        TextBlock,
        ThinkingBlock,
        ToolResultBlock,
    )

    rich = Message(
        Role.ASSISTANT,
        "t",
        blocks=[
            TextBlock("t"),
            ThinkingBlock("th"),
            ImageBlock("sha256:00"),
            ToolUseBlock("c1", "Bash", {"command": "ls"}),
            ToolResultBlock("c1", [TextBlock("ok")]),
        ],
        metadata={"k": [1, 2]},
    )
    with SessionStore(tmp_path / "s") as store:
        store.append_transcript_messages("s", [Message(Role.USER, "plain"), rich])
    with SessionStore(tmp_path / "s") as store:
        loaded = store.load_transcript_messages("s")
    assert loaded[1] == rich
    assert not any(gc.is_tracked(m) for m in loaded)
    assert not any(gc.is_tracked(b) for b in loaded[1].blocks)
    # nor do the events a load decodes them from
    from eventstore.format.codec import EventCodec
    from eventstore.format.events import MessagesAppended

    line = msgspec.json.encode(MessagesAppended(messages=[rich], seq=1, h="0" * 16))
    (ev,) = EventCodec().decoder(frozenset({"messages_appended"})).decode_lines(line + b"\n")
    assert type(ev) is MessagesAppended and not gc.is_tracked(ev)


@pytest.mark.parametrize("page", [{}, {"last": 2}, {"start": 0, "limit": 2}])
def test_changing_a_loaded_message_never_changes_the_store(
    tmp_path: Path, page: dict[str, int]
) -> None:
    """A message is frozen, but its blocks and metadata are a list and dicts: whatever
    a caller does to them, plain or rich, the next load returns what the log holds."""
    from eventstore.records import TextBlock

    plain = Message(Role.USER, "plain")
    rich = Message(
        Role.ASSISTANT, "r", blocks=[ToolUseBlock("c", "Bash", {"a": 1})], metadata={"k": 1}
    )
    with SessionStore(tmp_path / "s") as store:
        store.append_transcript_messages("s", [plain, rich])
        for _ in range(2):  # a cold load, then a warm one
            got = store.load_transcript_messages("s", **page)
            assert got == [plain, rich]
            got[0].blocks.append(TextBlock("injected"))
            got[0].metadata["x"] = 1
            got[1].blocks.append(TextBlock("injected"))
            got[1].blocks[0].input["a"] = 2  # type: ignore[union-attr]
            got[1].metadata["k"] = 2
        assert store.load_transcript_messages("s") == [plain, rich]
        assert store.load_transcript_messages("s", last=2) == [plain, rich]

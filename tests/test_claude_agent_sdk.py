"""The Claude Agent SDK `SessionStore` (eventstore.integrations.claude_agent_sdk): the
SDK's own conformance suite on every engine and over an open store, entries kept as the
Claude Code lines they are (exported byte for byte), deduplication by uuid, bad input."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import cli_in_process
from engines import EngineCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import lone_surrogated

pytest.importorskip("claude_agent_sdk")

from claude_agent_sdk.testing import run_session_store_conformance  # noqa: E402
from claude_agent_sdk.types import SessionKey  # noqa: E402

from eventstore import (  # noqa: E402
    InvalidArgumentError,
    InvalidRecordError,
    SessionDeletedError,
    SessionStore,
)
from eventstore.integrations.claude_agent_sdk import (  # noqa: E402
    EventStoreSessionStore,
    session_id_of,
    session_key_of,
)

T = TypeVar("T")
FILE1 = Path(__file__).parent.parent / "fixtures" / "claude_code" / "projects"
KEY: SessionKey = {"project_key": "-home-me-proj", "session_id": "0b3c-sess"}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def transcript_file() -> Path:
    return sorted(FILE1.rglob("*.jsonl"))[0]


# -- the SDK's conformance suite ---------------------------------------------------------


def test_conformance_on_every_engine(case: EngineCase, tmp_path: Path) -> None:
    """The 14 contracts of `run_session_store_conformance`, all four optional methods
    included, each on a fresh store of the engine, opened from its URL."""
    made: list[EventStoreSessionStore] = []
    n = itertools.count()

    def make() -> EventStoreSessionStore:
        where = tmp_path / f"s{next(n)}"
        where.mkdir()
        made.append(EventStoreSessionStore(case.fresh(where)))
        return made[-1]

    async def main() -> None:
        await run_session_store_conformance(make)
        for s in made:
            await s.close()

    run(main())


def test_conformance_over_an_open_store(case: EngineCase, tmp_path: Path) -> None:
    """The same over plainly opened `SessionStore`s the adapter is given (it teaches them
    its types) and leaves open."""
    stores: list[SessionStore] = []
    n = itertools.count()

    def make() -> EventStoreSessionStore:
        where = tmp_path / f"s{next(n)}"
        where.mkdir()
        stores.append(SessionStore(case.fresh(where)))
        return EventStoreSessionStore(stores[-1])

    run(run_session_store_conformance(make))
    for s in stores:
        s.list_sessions()  # still open
        s.close()


# -- the lines --------------------------------------------------------------------------


def test_entries_are_claude_code_lines_exported_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real transcript's lines, appended as entries (and the batch retried), are
    exported by `eventstore export --format claude-code` as the file's own bytes, and
    `log` and `verify` name every event (no unknown type)."""
    data = transcript_file().read_bytes()
    entries = [json.loads(line) for line in data.splitlines()]
    root = tmp_path / "store"

    async def main() -> None:
        store = EventStoreSessionStore(root)
        await store.append(KEY, entries)
        await store.append(KEY, entries)  # a retry: every entry with a uuid is held
        loaded = await store.load(KEY)
        assert loaded is not None
        assert loaded[: len(entries)] == entries
        assert all("uuid" not in e for e in loaded[len(entries) :])
        await store.close()

    run(main())
    sid = session_id_of(KEY)
    code, out, _ = cli_in_process(capsys, "export", str(root), sid, "--format", "claude-code")
    again = [ln + b"\n" for ln in data.splitlines() if "uuid" not in json.loads(ln)]
    assert code == 0 and out.encode() == data + b"".join(again)
    code, out, err = cli_in_process(capsys, "log", str(root), sid)
    assert code == 0 and "claude_sdk_summary" in out and "unknown type" not in out + err
    code, out, _ = cli_in_process(capsys, "verify", str(root), "--all", "--json")
    assert code == 0 and "unknown_type" not in out


def test_import_claude_code_and_this_store_see_one_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`eventstore import-claude-code --claude-agent-sdk` names sessions as this store
    does (project directory, sessionId): the store loads and lists what was imported,
    its append of entries the import brought writes nothing, a re-import appends
    nothing, and the export is the file's own bytes."""
    f = transcript_file()
    data = f.read_bytes()
    entries = [json.loads(line) for line in data.splitlines()]
    key: SessionKey = {"project_key": f.parent.name, "session_id": f.stem}
    root = tmp_path / "store"
    code, _, err = cli_in_process(
        capsys, "import-claude-code", str(root), str(f), "--claude-agent-sdk"
    )
    assert code == 0, err

    async def main() -> None:
        store = EventStoreSessionStore(root)
        assert await store.load(key) == entries
        [listed] = await store.list_sessions(key["project_key"])
        assert listed["session_id"] == key["session_id"]
        await store.append(key, [e for e in entries if "uuid" in e])  # held: nothing new
        await store.close()

    run(main())
    code, out, _ = cli_in_process(
        capsys, "import-claude-code", str(root), str(f), "--claude-agent-sdk", "--json"
    )
    assert code == 0 and all(sum(r["appended"].values()) == 0 for r in json.loads(out))
    sid = session_id_of(key)
    code, out, _ = cli_in_process(capsys, "export", str(root), sid, "--format", "claude-code")
    assert code == 0 and out.encode() == data


def test_a_retried_batch_is_kept_once_by_uuid(tmp_path: Path) -> None:
    """Entries whose uuid the transcript holds are not appended again (the SDK retries a
    failed batch); entries without a uuid always are."""

    async def main() -> None:
        store = EventStoreSessionStore(tmp_path / "store")
        batch = [{"type": "user", "uuid": "u1"}, {"type": "x"}, {"type": "a", "uuid": "u2"}]
        await store.append(KEY, batch)
        await store.append(KEY, batch)
        assert await store.load(KEY) == [*batch, {"type": "x"}]
        await store.close()

    run(main())


def test_an_append_judged_on_a_state_another_store_made_stale_sees_its_entries(
    tmp_path: Path,
) -> None:
    """Two store objects on one transcript (two processes): the one whose state is at
    its own last append judges the next with no read, so that state may be stale. An
    entry the other appended since is neither appended again (a retried batch) nor
    left out of the summary, and a batch whose every entry is held writes nothing."""
    root = tmp_path / "store"
    titled = {"type": "user", "uuid": "u2", "customTitle": "theirs"}

    async def main() -> None:
        mine, theirs = EventStoreSessionStore(root), EventStoreSessionStore(root)
        await mine.append(KEY, [{"type": "user", "uuid": "u1"}])
        await theirs.append(KEY, [titled])
        await mine.append(KEY, [titled, {"type": "user", "uuid": "u3"}])  # u2: a retry
        await mine.append(KEY, [{"type": "user", "uuid": "u1"}])  # held: nothing written
        assert [e["uuid"] for e in await mine.load(KEY) or []] == ["u1", "u2", "u3"]
        (summary,) = await mine.list_session_summaries(KEY["project_key"])
        assert summary["data"]["custom_title"] == "theirs"
        await mine.close()
        await theirs.close()

    run(main())
    with SessionStore(root) as plain:
        assert plain.last_seq(session_id_of(KEY)) == 6  # three lines, three summaries


def test_a_store_that_did_not_see_a_delete_appends_nothing_after_it(tmp_path: Path) -> None:
    """A transcript deleted through another store object: an append from the store whose
    state predates the delete raises SessionDeletedError, a batch of held entries (a
    retry, nothing to write on that stale state) included; nothing is written."""
    root = tmp_path / "store"

    async def main() -> None:
        mine, theirs = EventStoreSessionStore(root), EventStoreSessionStore(root)
        await mine.append(KEY, [{"type": "user", "uuid": "u1"}])
        await theirs.delete(KEY)
        for batch in ([{"type": "user", "uuid": "u1"}], [{"type": "user", "uuid": "u2"}]):
            with pytest.raises(SessionDeletedError):
                await mine.append(KEY, batch)
        assert await theirs.load(KEY) is None
        await mine.close()
        await theirs.close()

    run(main())


def test_attack_a_subagent_transcript_appended_during_a_delete_goes_with_it(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: `delete` of a main transcript listed its subagent transcripts, then
    deleted them: one a racing writer appended between the listing and the deletion
    survived the delete, an orphan whose main is gone (the SDK's own store removes every
    subkey with its main), on every engine. Now the delete lists again until a listing
    finds no new one, so what is appended during it goes with it."""
    sub: SessionKey = {**KEY, "subpath": "subagents/agent-late"}

    with SessionStore(url) as plain:
        listings = plain.list_sessions

        async def main() -> None:
            store = EventStoreSessionStore(plain)
            await store.append(KEY, [{"type": "user", "uuid": "u1"}])
            await store.append({**KEY, "subpath": "subagents/agent-1"}, [{"type": "user"}])
            racing = EventStoreSessionStore(plain)
            appended: list[bool] = []

            def listing(prefix: str | None = None) -> list[str]:
                found = listings(prefix)
                if not appended:  # once, right after the delete's first listing
                    appended.append(True)
                    asyncio.run(racing.append(sub, [{"type": "user", "uuid": "late"}]))
                return found

            monkeypatch.setattr(plain, "list_sessions", listing)
            await store.delete(KEY)
            monkeypatch.undo()
            assert appended
            assert await store.load(sub) is None
            assert await store.list_subkeys(KEY) == []
            assert plain.list_sessions() == []

        run(main())


def test_keys_map_to_sessions_and_back() -> None:
    for key in (
        KEY,
        {"project_key": "a.b/c", "session_id": "s.1", "subpath": "subagents/agent-1"},
        {"project_key": "%2E", "session_id": "é~"},
    ):
        assert session_key_of(session_id_of(key)) == key  # type: ignore[arg-type]
    assert session_key_of("langgraph-x") is None
    assert session_id_of({**KEY, "subpath": None}) == session_id_of(KEY)  # type: ignore[typeddict-item]


# -- attacks: bad input ------------------------------------------------------------------


def test_bad_keys_and_entries_are_typed_errors_and_write_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        store = EventStoreSessionStore(tmp_path / "store")
        bad_keys: list[Any] = [
            "k",
            {"project_key": "p"},
            {"project_key": "", "session_id": "s"},
            {**KEY, "subpath": ""},
            {"project_key": "p", "session_id": 7},
        ]
        for key in bad_keys:
            with pytest.raises(InvalidArgumentError):
                await store.append(key, [{"type": "x"}])
        bad_entries: list[Any] = [
            "entries",
            [{"type": "x"}, {"no": "type"}],
            [{"type": "x", "v": float("nan")}],
            [{"type": "x", "v": b"bytes"}],
            [{"type": "x", 1: "int key"}],
            [{"type": "x", "v": object()}],
        ]
        for entries in bad_entries:
            with pytest.raises(InvalidRecordError):
                await store.append(KEY, entries)
        assert store.store.list_sessions() == []
        await store.close()

    run(main())


def test_summaries_keep_every_racing_append(tmp_path: Path) -> None:
    """Appends racing on one session from several store objects: none is lost from the
    transcript, and the summary folded every one of them (expected_seq, then refold)."""
    root = tmp_path / "store"

    async def writer(w: int) -> None:
        store = EventStoreSessionStore(root)
        for i in range(10):
            await store.append(KEY, [{"type": "user", "uuid": f"{w}-{i}"}])
        await store.close()

    async def main() -> None:
        await asyncio.gather(*(writer(w) for w in range(3)))
        store = EventStoreSessionStore(root)
        loaded = await store.load(KEY)
        assert loaded is not None and len(loaded) == 30
        (summary,) = await store.list_session_summaries(KEY["project_key"])
        assert summary["session_id"] == KEY["session_id"]
        await store.close()

    run(main())
    with SessionStore(root) as plain:
        assert plain.verify(session_id_of(KEY)).ok


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    bad=lone_surrogated,
    field=st.sampled_from(["project_key", "session_id", "subpath"]),
)
def test_attack_a_lone_surrogate_in_a_key_is_a_typed_error(url: str, bad: str, field: str) -> None:
    """Attack: a key part holding a lone surrogate raised a bare `UnicodeEncodeError`
    (percent-encoding it for the session id). Now every call raises
    `InvalidArgumentError` and writes nothing."""
    key: Any = {**KEY, field: bad}

    async def main() -> None:
        store = EventStoreSessionStore(url)
        calls = [store.append(key, [{"type": "x"}]), store.load(key), store.delete(key)]
        if field == "project_key":
            calls += [store.list_sessions(bad), store.list_session_summaries(bad)]
        for call in calls:
            with pytest.raises(InvalidArgumentError):
                await call
        assert store.store.list_sessions() == []
        await store.close()

    run(main())


def test_attack_list_subkeys_of_a_bad_key_is_a_typed_error(tmp_path: Path) -> None:
    """Attack: `list_subkeys` read the key's parts by subscript, so a key missing one
    raised a bare KeyError and a key that is no dict a TypeError, where every other
    method raises InvalidArgumentError. Now it does too."""

    async def main() -> None:
        store = EventStoreSessionStore(tmp_path / "store")
        bad_keys: list[Any] = [
            None,
            "k",
            {"project_key": "p"},
            {"session_id": "s"},
            {"project_key": "", "session_id": "s"},
            {"project_key": "p", "session_id": 7},
        ]
        for key in bad_keys:
            with pytest.raises(InvalidArgumentError):
                await store.list_subkeys(key)
        assert await store.list_subkeys(KEY) == []  # a good key: none yet
        await store.close()

    run(main())

"""Encryption at rest and crypto-shredding (docs/encryption.md): `SessionStore(keys=...)`.

What it promises: no plaintext byte of an encrypted session is written (every write
path, every file); the chain covers the ciphertext, so `verify` and `migrate` work
without the key; a payload moved or rewritten does not open; wrong and missing keys
are typed errors naming the key id, with nothing written and no key material shown;
`forget_key` makes the session unreadable while `verify` still proves the chain;
`rekey` rewraps without rewriting a log. Attacks last.
"""

from __future__ import annotations

import base64
import hashlib
import os
import textwrap
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import cli_in_process, make_checkpoint, make_entry, make_features, make_manifest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventstore import (
    AutoCompact,
    EncryptedSessionError,
    KeyForgotten,
    KeyForgottenError,
    KeyMissingError,
    KeyRing,
    Message,
    Role,
    SessionDeletedError,
    SessionStore,
    WrongKeyError,
)
from eventstore.engines.base import KeyEngine
from eventstore.errors import CorruptLogError, EventStoreError, InvalidArgumentError, StorageError
from eventstore.format.chain import line_hash
from eventstore.format.crypt import decode_slot, key_id_of
from eventstore.ops.migrate import migrate_session


def test_the_agents_sdk_cold_reads_of_an_encrypted_store_decrypt_and_write_no_plaintext(
    tmp_path: Path,
) -> None:
    """A fresh store's `get_items(n)` and `pop_item` read the newest lines from the log's
    end: on an encrypted session they decrypt what they read, and nothing is in the clear."""
    import asyncio

    oa = pytest.importorskip("eventstore.integrations.openai_agents")
    root = tmp_path / "st"

    def item(k: int) -> Any:
        return {"role": "user", "content": f"{MARKER} {k}"}

    async def scenario() -> tuple[list[Any], Any, list[Any]]:
        s = oa.EventStoreSession("a", SessionStore(root, keys=ring()))
        for k in range(30):
            await s.add_items([item(k)])
        await s.close()
        s = oa.EventStoreSession("a", SessionStore(root, keys=ring()))
        newest = await s.get_items(3)
        await s.close()
        s = oa.EventStoreSession("a", SessionStore(root, keys=ring()))
        popped = await s.pop_item()
        rest = await s.get_items()
        await s.close()
        return newest, popped, rest

    newest, popped, rest = asyncio.run(scenario())
    assert [i["content"] for i in newest] == [f"{MARKER} {k}" for k in (27, 28, 29)]
    assert popped is not None and popped["content"] == f"{MARKER} 29"
    assert [i["content"] for i in rest] == [f"{MARKER} {k}" for k in range(29)]
    no_marker(root)
    with pytest.raises(KeyMissingError):  # and a store without the key reads nothing
        asyncio.run(oa.EventStoreSession("a", SessionStore(root)).get_items(3))


MARKER = "PLAINTEXT-MARKER-7f3a"
M1 = bytes(range(32))
M2 = bytes(range(32, 64))


def ring(kid: str = "m1", key: bytes = M1) -> KeyRing:
    return KeyRing({kid: key})


def every_byte(root: Path) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()]


def no_marker(root: Path) -> None:
    """No file under `root` holds the marker (raw, nor as JSON escapes it)."""
    for path, data in every_byte(root):
        assert MARKER.encode() not in data, path


def log_of(root: Path, sid: str = "s1") -> Path:
    return root / "sessions" / sid / "log.jsonl"


def fill(store: SessionStore, sid: str = "s1") -> None:
    """The session written through every write path of the session API, each with the
    marker in a field."""
    manifest = make_manifest(sid, current_objective=f"objective {MARKER}")
    features = make_features(2)
    features[0] = msgspec.structs.replace(features[0], description=f"feature {MARKER}")
    assert store.initialize_session_if_missing(sid, manifest, features)
    store.save_manifest(sid, make_manifest(sid, active_branch=f"b-{MARKER}"))
    entry = msgspec.structs.replace(make_entry(1), summary=f"progress {MARKER}")
    store.append_progress_entry(sid, entry)
    store.replace_feature_list(sid, features)
    store.update_feature_pass(sid, features[0].id, True)
    cp = msgspec.structs.replace(make_checkpoint(), note=f"note {MARKER}")
    store.record_run_checkpoint(sid, cp)
    store.append_transcript_messages(
        sid,
        [
            Message(role=Role.USER, content=f"hello {MARKER}"),
            Message(role=Role.TOOL, content=MARKER),
        ],
    )


# -- what it promises -----------------------------------------------------------------


def test_no_plaintext_byte_of_an_encrypted_session_is_written(tmp_path: Path) -> None:
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        fill(store)
        for _ in range(3):  # reads, pages and loads of every kind (a cache would be written)
            assert MARKER in store.load_bootstrap_state("s1").manifest.active_branch  # type: ignore[union-attr]
            assert store.load_transcript_messages("s1")[-1].content == MARKER
            assert store.load_transcript_messages("s1", last=1)[0].content == MARKER
        # compaction with history (an encrypted snapshot, the old log archived), a fork
        assert store.compact("s1", force=True).compacted
        store.append_transcript_messages("s1", [Message(role=Role.USER, content=MARKER)])
        assert store.fork_session("s1", "s2", at_seq=4).seq == 4
        assert store.load_transcript_messages("s1", last=1)[0].content == MARKER
        assert store.state_at("s1", seq=3).feature_list[0].description == f"feature {MARKER}"
        assert store.load_bootstrap_state("s2").manifest is not None
    no_marker(root)
    with SessionStore(root) as keyless:  # no key: no compaction (it could not encrypt)
        with pytest.raises((KeyMissingError, EncryptedSessionError)):
            keyless.compact("s1", force=True)
        assert keyless.verify("s1").ok and keyless.verify("s2").ok
    # reopened: the same state, still nothing in the clear
    with SessionStore(root, keys=ring()) as store:
        assert store.load_transcript_messages("s1")[0].content == f"hello {MARKER}"
        assert store.verify("s1").ok and store.verify("s2").ok
    no_marker(root)
    # the envelope stays readable (jq-able): types and seqs in the clear
    lines = [msgspec.json.decode(line) for line in log_of(root).read_bytes().splitlines()]
    assert [d["type"] for d in lines] == ["snapshot", "messages_appended"]
    assert all(isinstance(s, str) for s in lines[0]["states"].values())
    assert "_enc" in lines[1]


def test_an_encrypted_sessions_labels_are_in_the_clear_in_the_session_index_only(
    tmp_path: Path,
) -> None:
    """`set_labels` on an encrypted session wrote its labels, in the clear, into the
    session index (`index.sqlite3`), which pages filter by, while the page said no
    plaintext byte of an encrypted session is written anywhere: the page now lists the
    labels as visible. Their `labels_set` line, snapshots and caches stay encrypted."""
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        store.append_progress_entry("s1", make_entry(1))
        store.set_labels("s1", {"team": MARKER})
        assert store.compact("s1", force=True).compacted
        store.set_labels("s1", {"team": MARKER, "n": "2"})
        assert [i.session_id for i in store.sessions(labels={"team": MARKER})] == ["s1"]
        assert store.load("s1", "labels") == {"team": MARKER, "n": "2"}
    clear = [p.name for p, data in every_byte(root) if MARKER.encode() in data]
    assert clear and all(name.startswith("index.sqlite3") for name in clear)


def test_a_long_encrypted_snapshot_is_read_by_its_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eventstore.format import reader

    monkeypatch.setattr(reader, "LONG_SNAPSHOT", 0)  # every snapshot takes the cut path
    root = tmp_path / "st"
    with SessionStore(root, keys=ring(), auto_compact=AutoCompact(max_events=5)) as store:
        for i in range(12):
            store.append_transcript_messages(
                "s1", [Message(role=Role.USER, content=f"{MARKER} {i}")]
            )
    with SessionStore(root, keys=ring()) as store:
        got = [m.content for m in store.load_transcript_messages("s1")]
        assert got == [f"{MARKER} {i}" for i in range(12)]
        assert store.verify("s1").ok
    assert log_of(root).read_bytes().startswith(b'{"type":"snapshot"')
    no_marker(root)


def test_the_langgraph_saver_writes_no_plaintext_of_an_encrypted_store(tmp_path: Path) -> None:
    lg = pytest.importorskip("eventstore.integrations.langgraph")
    from langgraph.graph import END, START, StateGraph

    class State(dict[str, Any]):
        pass

    root = tmp_path / "st"
    store = SessionStore(root, keys=ring())
    with lg.EventStoreSaver(store) as saver:
        g: Any = StateGraph(dict)
        g.add_node("say", lambda s: {"text": f"said {MARKER}"})
        g.add_edge(START, "say")
        g.add_edge("say", END)
        out = g.compile(checkpointer=saver).invoke(
            {"text": MARKER}, {"configurable": {"thread_id": "t"}}
        )
        assert out["text"] == f"said {MARKER}"
    store.close()
    no_marker(root)


@settings(max_examples=25, deadline=None)
@given(content=st.text(min_size=0, max_size=200), name=st.one_of(st.none(), st.text(max_size=20)))
def test_an_encrypted_message_reads_back_equal(content: str, name: str | None) -> None:
    msg = Message(role=Role.ASSISTANT, content=content, name=name)
    try:
        msgspec.json.encode(msg)
    except UnicodeEncodeError:
        return  # (a lone surrogate is refused encrypted or not)
    with SessionStore("memory://", keys=ring()) as store:
        store.append_transcript_messages("s", [msg])
        assert store.load_transcript_messages("s") == [msg]
        assert store.verify("s").ok


def test_verify_proves_the_chain_without_the_key(tmp_path: Path) -> None:
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        fill(store)
        head = store.verify("s1").head_hash
    with SessionStore(root) as keyless:
        report = keyless.verify("s1")
        assert report.ok and report.head_hash == head
        with pytest.raises(KeyMissingError) as err:
            keyless.load_transcript_messages("s1")
    assert "key" in str(err.value)
    # one ciphertext byte changed: verify without the key finds it
    data = bytearray(log_of(root).read_bytes())
    i = data.index(b'"_enc":"') + 40
    data[i] = ord("A") if data[i] != ord("A") else ord("B")
    log_of(root).write_bytes(bytes(data))
    with SessionStore(root) as keyless:
        assert not keyless.verify("s1").ok


def test_wrong_or_missing_keys_are_typed_errors_that_name_the_key_and_write_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        fill(store)
    before = every_byte(root)
    errors: list[Exception] = []
    for keys, kind in ((ring("m9", M2), KeyMissingError), (ring("m1", M2), WrongKeyError)):
        with SessionStore(root, keys=keys) as store:
            with pytest.raises(kind) as err:
                store.load_bootstrap_state("s1")
            errors.append(err.value)
            with pytest.raises(kind) as err:
                store.append_transcript_messages("s1", [Message(role=Role.USER, content="x")])
            errors.append(err.value)
    with SessionStore(root) as keyless, pytest.raises(EncryptedSessionError):
        keyless.append_transcript_messages("s1", [Message(role=Role.USER, content="x")])
    assert every_byte(root) == before
    for exc in errors:
        text = str(exc)
        assert "'m1'" in text and "'s1'" in text, text
        for key in (M1, M2):
            assert key.hex() not in text and repr(key) not in text
    assert "m9" in repr(ring("m9", M2)) and M2.hex() not in repr(ring("m9", M2))


def test_forget_key_makes_the_session_unreadable_and_verify_still_passes(tmp_path: Path) -> None:
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        fill(store)
        fill(store, "other")
        log_before = log_of(root).read_bytes()
        assert store.forget_key("s1") is True
        for load in (store.load_bootstrap_state, store.load_transcript_messages):
            with pytest.raises(KeyForgottenError) as err:
                load("s1")
            assert "'s1'" in str(err.value)
        with pytest.raises(KeyForgottenError):
            store.append_transcript_messages("s1", [Message(role=Role.USER, content="x")])
        assert store.verify("s1").ok
        assert store.load_transcript_messages("other")[-1].content == MARKER  # untouched
    # the log was not rewritten: one record appended, which says what was destroyed
    after = log_of(root).read_bytes()
    assert after.startswith(log_before)
    record = msgspec.json.decode(after[len(log_before) :])
    assert record["type"] == "key_forgotten" and "_enc" not in record
    # every store opening it later, with the master key, reads nothing of it
    with SessionStore(root, keys=ring()) as store:
        with pytest.raises(KeyForgottenError) as err:
            store.load_transcript_messages("s1")
        assert err.value.session_id == "s1"
        assert store.verify("s1").ok
        assert [type(e) for e in store.read_events("s1", types=["key_forgotten"])] == [KeyForgotten]
        assert store.forget_key("s1") is True  # again: nothing more to destroy
        assert store.forget_key("never") is False
    with SessionStore(root) as keyless:
        assert keyless.verify("s1").ok


def test_rekey_rewraps_without_rewriting_a_log(tmp_path: Path) -> None:
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        fill(store)
        digest = hashlib.sha256(log_of(root).read_bytes()).hexdigest()
        assert store.rekey(ring("m2", M2)) == (1, 0)
    assert hashlib.sha256(log_of(root).read_bytes()).hexdigest() == digest
    with SessionStore(root, keys=ring()) as old, pytest.raises(KeyMissingError) as err:
        old.load_transcript_messages("s1")
    assert "'m2'" in str(err.value)
    with SessionStore(root, keys=KeyRing({"m2": M2, "m1": M1}, current="m2")) as new:
        assert new.load_transcript_messages("s1")[0].content == f"hello {MARKER}"
    no_marker(root)


def test_the_rekey_and_keygen_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    k1, k2, root = tmp_path / "m1.key", tmp_path / "m2.key", tmp_path / "st"
    assert cli_in_process(capsys, "keygen", str(k1), "--id", "m1")[0] == 0
    assert cli_in_process(capsys, "keygen", str(k2), "--id", "m2")[0] == 0
    assert os.stat(k1).st_mode & 0o777 == 0o600
    assert cli_in_process(capsys, "keygen", str(k1), "--id", "m1")[0] == 2  # never overwritten
    with SessionStore(root, keys=KeyRing.load(k1)) as store:
        fill(store)
    code, out, _ = cli_in_process(
        capsys, "rekey", str(root), "--old-key", str(k1), "--new-key", str(k2)
    )
    assert code == 0 and "rewrapped 1" in out
    code, out, _ = cli_in_process(capsys, "log", str(root), "s1", "--master-key", str(k2), "--json")
    assert code == 0 and MARKER in out
    code, _, err = cli_in_process(capsys, "log", str(root), "s1", "--master-key", str(k1))
    assert code == 2 and "'m2'" in err
    assert cli_in_process(capsys, "verify", str(root), "s1")[0] == 0  # no key needed
    no_marker(root)


@pytest.mark.parametrize("via", ["memory://crypt-migrate", None])
def test_migrate_keeps_an_encrypted_session_encrypted_and_verifiable_without_the_key(
    tmp_path: Path, via: str | None
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    with SessionStore(src, keys=ring()) as store:
        fill(store)
        head = store.verify("s1").head_hash
    # copied without any key: through a memory store, or straight to another directory
    with SessionStore(src) as a, SessionStore(dst) as b:
        if via is None:
            migrate_session(a.engine, b, "s1")
        else:
            with SessionStore(via) as mid:
                migrate_session(a.engine, mid, "s1")
                migrate_session(mid.engine, b, "s1")
        assert b.verify("s1").ok and b.verify("s1").head_hash == head
    no_marker(dst)
    assert log_of(dst).read_bytes() == log_of(src).read_bytes()
    with SessionStore(dst, keys=ring()) as store:
        assert store.load_transcript_messages("s1")[-1].content == MARKER


# -- attacks --------------------------------------------------------------------------


def _rechain(lines: list[bytes]) -> list[bytes]:
    """`lines` with every `h` recomputed: what a forger who can write the store does."""
    out, link = [], ""
    for line in lines:
        body = line[: line.rindex(b',"h":"')] + b"}"
        h = line_hash(link, body)
        out.append(body[:-1] + b',"h":"' + h.encode() + b'"}')
        link = h
    return out


def test_a_payload_moved_to_another_line_with_a_recomputed_chain_does_not_open(
    tmp_path: Path,
) -> None:
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        store.append_transcript_messages("s1", [Message(role=Role.USER, content="first")])
        store.append_transcript_messages("s1", [Message(role=Role.USER, content="second")])
    a, b = log_of(root).read_bytes().splitlines()

    def enc(line: bytes) -> bytes:
        return line[line.index(b',"_enc":"') : line.rindex(b',"h":"')]

    swapped = _rechain([a.replace(enc(a), enc(b)), b.replace(enc(b), enc(a))])
    log_of(root).write_bytes(b"\n".join(swapped) + b"\n")
    with SessionStore(root) as keyless:
        assert keyless.verify("s1").ok  # the forger's chain is whole...
    with SessionStore(root, keys=ring()) as store:
        with pytest.raises(CorruptLogError) as err:  # ...but no payload opens out of place
            store.load_transcript_messages("s1")
        assert "authenticate" in str(err.value)
        assert not store.verify("s1").ok  # with the key, verify opens each payload


def test_two_stores_creating_a_session_key_at_once_agree_on_one(tmp_path: Path) -> None:
    root = tmp_path / "st"
    a, b = SessionStore(root, keys=ring()), SessionStore(root, keys=ring())
    with a, b:
        a.append_transcript_messages("s1", [Message(role=Role.USER, content="from a")])
        b.append_transcript_messages("s1", [Message(role=Role.USER, content="from b")])
        for s in (a, b):
            assert [m.content for m in s.load_transcript_messages("s1")] == ["from a", "from b"]
    assert len(list((root / "keys").iterdir())) == 1


def test_bad_key_rings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        KeyRing({"m1": b"short"})
    with pytest.raises(InvalidArgumentError):
        KeyRing({"../x": M1})
    with pytest.raises(InvalidArgumentError):
        KeyRing({"a": M1, "b": M2})  # which is current?
    with pytest.raises(InvalidArgumentError):
        SessionStore(tmp_path / "st", keys=M1)  # type: ignore[arg-type]
    bad = tmp_path / "bad.key"
    bad.write_text("not a key")
    with pytest.raises(InvalidArgumentError) as err:
        KeyRing.load(bad)
    assert "not a key" not in str(err.value)
    # keys that are no mapping, a path that is none, a key id that is no str: these
    # raised AttributeError or TypeError; a key file that exists raised FileExistsError
    for keys in (5, [("m1", M1)], None):
        with pytest.raises(InvalidArgumentError):
            KeyRing(keys)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        KeyRing.load(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        KeyRing.write_new(tmp_path / "new.key", 5)  # type: ignore[arg-type]
    with pytest.raises(StorageError):
        KeyRing.write_new(bad, "m1")
    assert bad.read_text() == "not a key"


@settings(max_examples=25, deadline=None)
@given(key=st.binary(min_size=32, max_size=32))
def test_a_key_ring_given_the_wrong_way_round_never_echoes_the_key(key: bytes) -> None:
    """Attack: a mapping given the wrong way round, `{key: "m1"}` or `{key.hex(): "m1"}`,
    was refused with an error quoting the "id", which is the master key itself (its
    repr, or its 64 hex digits). Now an entry is named by its place, never by its id."""
    b64 = base64.b64encode(key).decode()
    for keys in ({key: "m1"}, {key.hex(): "m1"}, {b64: "m1"}, {key.hex(): key[:16]}):
        with pytest.raises(InvalidArgumentError) as err:
            KeyRing(keys)  # type: ignore[arg-type]
        text = f"{err.value} {err.value!r}"
        for secret in (key.hex(), repr(key)[2:-1], b64, key[:16].hex()):
            assert secret not in text, text


@settings(max_examples=20, deadline=None)
@given(key=st.binary(min_size=32, max_size=32), tail=st.sampled_from(["m1", "zz", "0x"]))
def test_a_key_file_with_its_fields_swapped_never_echoes_the_key(
    tmp_path_factory: pytest.TempPathFactory, key: bytes, tail: str
) -> None:
    """Attack: a key file written `eventstore-master-key <64 hex> m1` (id and key
    swapped) was refused with "key '<64 hex digits>' is not 64 hex digits": the master
    key in the error, and on the CLI's stderr. Now the error names the file only."""
    path = tmp_path_factory.mktemp("k") / "m1.key"
    path.write_text(f"eventstore-master-key {key.hex()} {tail}\n")
    with pytest.raises(InvalidArgumentError) as err:
        KeyRing.load(path)
    assert str(path) in str(err.value) and key.hex() not in str(err.value)


def test_two_key_files_of_one_id_and_different_keys_are_refused(tmp_path: Path) -> None:
    """Attack: `KeyRing.load(a, b)` (and `--master-key a --master-key b`) with two key
    files of the same id kept the second key under the first's id, silently: the ring
    named 'm1' current but wrapped new data keys with the other key, and every data key
    wrapped by the first read as WrongKeyError. Now two different keys under one id are
    refused (InvalidArgumentError, nothing opened); the same key twice is one key."""
    a, b, root = tmp_path / "a.key", tmp_path / "b.key", tmp_path / "st"
    KeyRing.write_new(a, "m1")
    KeyRing.write_new(b, "m1")
    with SessionStore(root, keys=KeyRing.load(a)) as store:
        fill(store)
    with pytest.raises(InvalidArgumentError) as err:
        KeyRing.load(a, b)
    assert "'m1'" in str(err.value) and str(b) in str(err.value)
    with SessionStore(root, keys=KeyRing.load(a, a)) as store:
        assert store.load_transcript_messages("s1")[-1].content == MARKER


@settings(max_examples=40, deadline=None)
@given(st.permutations(["good", "other-key", "damaged", "other-id"]), st.booleans())
def test_attack_unwrap_tries_every_wrap_whose_id_matches(order: list[str], whole: bool) -> None:
    """Attack: `KeyRing.unwrap` gave up (WrongKeyError) at the first wrap whose key id
    the ring holds that did not open, though a later wrap under the same id (a master
    key id reused for another key, a damaged copy) opened with the ring's key. Now
    every wrap whose id matches is tried; WrongKeyError naming the id only when none
    opens, and None when the ring holds none of the ids."""
    from eventstore.format.crypt import KeySlot, WrappedKey

    data_key = os.urandom(32)
    wraps = {
        "good": ring("m1", M1).wrap(data_key),
        "other-key": ring("m1", M2).wrap(data_key),
        "damaged": WrappedKey("m1", "not base64 !"),
        "other-id": ring("m9", M2).wrap(data_key),
    }
    kinds = order if whole else [k for k in order if k != "good"]
    slot = KeySlot("dk1", [wraps[k] for k in kinds])
    if whole:
        assert ring("m1", M1).unwrap(slot, "s1") == data_key
    else:
        with pytest.raises(WrongKeyError, match="m1"):
            ring("m1", M1).unwrap(slot, "s1")
    assert KeyRing({"m7": M1}).unwrap(slot, "s1") is None


# -- the server engines: every row, every key -------------------------------------------


def _exercise(url: str) -> None:
    """`fill` on `url`, reads, a second session forgotten, a migration from a file store."""
    with SessionStore(url, keys=ring()) as store:
        fill(store)
        fill(store, "gone")
        assert store.compact("s1", force=True).compacted  # an encrypted snapshot, history kept
        store.append_transcript_messages("s1", [Message(role=Role.USER, content=MARKER)])
        assert store.load_transcript_messages("s1", last=1)[0].content == MARKER
        assert store.load_bootstrap_state("s1").manifest is not None
        assert store.verify("s1").ok
        assert store.forget_key("gone")
        with pytest.raises(KeyForgottenError):
            store.load_transcript_messages("gone")
        assert store.verify("gone").ok


def test_no_plaintext_in_any_postgresql_row(pg_url: str, tmp_path: Path) -> None:
    import psycopg

    from eventstore.engines.postgres.engine import split_url

    _exercise(pg_url)
    src = tmp_path / "src"
    with SessionStore(src, keys=ring()) as store:
        fill(store, "migrated")
    with SessionStore(src) as a, SessionStore(pg_url) as b:
        migrate_session(a.engine, b, "migrated")  # no key needed or seen
        assert b.verify("migrated").ok
    with SessionStore(pg_url, keys=ring()) as store:
        assert store.load_transcript_messages("migrated")[-1].content == MARKER
    schema = pg_url.split("schema=")[1].split("&")[0]
    rows = 0
    with psycopg.connect(split_url(pg_url)[0], autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
        for (table,) in tables:
            for (text,) in conn.execute(f'SELECT t::text FROM "{schema}"."{table}" t'):
                rows += 1
                assert MARKER not in text and MARKER.encode().hex() not in text, table
    assert rows > 20


def test_no_plaintext_in_any_redis_key(tmp_path: Path) -> None:
    from conftest import require_redis_url

    require_redis_url()
    import redis
    from engines import fresh_redis

    url = fresh_redis()
    _exercise(url)
    prefix = url.split("prefix=")[1].split("&")[0]
    client = redis.Redis.from_url(url.split("?")[0])
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    assert len(keys) > 3
    for key in keys:
        kind = client.type(key).decode()
        read = {
            "string": client.get,
            "hash": client.hgetall,
            "list": lambda k: client.lrange(k, 0, -1),
            "zset": lambda k: client.zrange(k, 0, -1),
            "set": client.smembers,
            "stream": client.xrange,
        }[kind]
        value: Any = read(key)
        assert MARKER.encode() not in repr(value).encode(), key
        assert MARKER.encode() not in key


def test_fold_caches_of_an_encrypted_session_are_encrypted_used_and_a_forged_one_refused(
    tmp_path: Path,
) -> None:
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        fill(store)
        for i in range(300):  # enough folding for the caches to be worth keeping
            text = f"{MARKER} {i} " + "x" * 300
            store.append_transcript_messages("s1", [Message(role=Role.USER, content=text)])
        want = store.load_bootstrap_state("s1")
        n = store.last_seq("s1")
    caches = [p for p in (root / "sessions" / "s1").iterdir() if p.name.endswith(".cache")]
    assert caches  # kept, encrypted
    no_marker(root)
    with SessionStore(root, keys=ring()) as store:
        assert store.load_bootstrap_state("s1") == want
        assert store.cache_info("s1").folds["bootstrap"] == (n, n)  # read from the cache
    for path in caches:  # a forged cache (one byte of its ciphertext) is not used
        data = bytearray(path.read_bytes())
        data[-20] ^= 1
        path.write_bytes(bytes(data))
    with SessionStore(root, keys=ring()) as store:
        assert store.load_bootstrap_state("s1") == want
        assert store.load_transcript_messages("s1")[-1].content.startswith(f"{MARKER} 299 ")
    with SessionStore(root, keys=ring("m1", M2)) as wrong, pytest.raises(WrongKeyError):
        wrong.load_bootstrap_state("s1")  # a cache never stands in for the key


def test_transcript_chunks_of_an_encrypted_session_are_sealed_used_and_a_forged_one_refused(
    tmp_path: Path,
) -> None:
    """The transcript cache kept in chunks (a complete frame each, written as appends
    complete it): every chunk is sealed like any cache (no plaintext on disk), a cold
    load reads them all, and a chunk with one byte of its ciphertext changed makes the
    load fold the log."""
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        for i in range(0, 1300, 50):
            store.append_transcript_messages(
                "s1", [Message(role=Role.USER, content=f"{MARKER} {j}") for j in range(i, i + 50)]
            )
        want = store.load_transcript_messages("s1")
        n = store.last_seq("s1")
    chunks = sorted((root / "sessions" / "s1").glob("fold-transcript.*.cache"))
    assert [p.name for p in chunks] == ["fold-transcript.0.cache", "fold-transcript.1.cache"]
    no_marker(root)
    with SessionStore(root, keys=ring()) as store:
        assert store.load_transcript_messages("s1") == want
        assert store.cache_info("s1").folds["transcript"] == (n, n)  # read from the cache
    data = bytearray(chunks[1].read_bytes())
    data[-20] ^= 1
    chunks[1].write_bytes(bytes(data))
    with SessionStore(root, keys=ring()) as store:
        assert store.load_transcript_messages("s1") == want
        assert store.cache_info("s1").folds["transcript"] == (n, None)
    no_marker(root)


def test_forget_key_of_a_compacted_session_then_a_delete(url: str) -> None:
    """A compacted session's snapshot holds its states encrypted; `forget_key` still
    appends its record (a write learns the session is live from the lifecycle state,
    which a snapshot keeps plain: broken, it raised KeyForgottenError half way, the key
    destroyed and no record), reads then say the key is forgotten, `verify` passes, and
    the session can still be deleted, by a store with keys or without."""
    with SessionStore(url, keys=ring()) as store:
        fill(store)
        store.compact("s1", force=True)
        seq = store.last_seq("s1")
        assert store.forget_key("s1") is True
        assert store.last_seq("s1") == seq + 1  # its record appended
        with pytest.raises(KeyForgottenError):
            store.load_transcript_messages("s1")
        assert store.verify("s1").ok
    with SessionStore(url) as keyless:
        assert keyless.delete_session("s1")
        assert keyless.load_transcript_messages("s1") == []


def test_forget_key_removes_a_wrapped_copy_a_killed_writer_left(tmp_path: Path) -> None:
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        store.append_transcript_messages("s1", [Message(role=Role.USER, content=MARKER)])
    (slot,) = (root / "keys").iterdir()
    # what a writer killed between writing its temporary file and linking it leaves
    leftover = slot.with_name(slot.name + ".tmp-0123abcd")
    leftover.write_bytes(slot.read_bytes())
    with SessionStore(root, keys=ring()) as store:
        assert store.forget_key("s1")
    # (the lock every replacer of a slot takes holds no byte of a key)
    assert sorted(p.name for p in (root / "keys").iterdir()) == [".lock", slot.name]
    assert b'"wraps"' not in slot.read_bytes()


def test_many_writers_creating_one_session_key_at_once_agree_on_it(tmp_path: Path) -> None:
    from conftest import run_threads

    root = tmp_path / "st"
    stores = [SessionStore(root, keys=ring()) for _ in range(6)]

    def writer(store: SessionStore, i: int) -> Any:
        return lambda: store.append_transcript_messages(
            "s1", [Message(role=Role.USER, content=f"w{i}")]
        )

    assert run_threads([writer(s, i) for i, s in enumerate(stores)]) == []
    for s in stores:
        s.close()
    with SessionStore(root, keys=ring()) as store:
        assert sorted(m.content for m in store.load_transcript_messages("s1")) == [
            f"w{i}" for i in range(6)
        ]
    assert len(list((root / "keys").iterdir())) == 1


@settings(max_examples=15, deadline=None)
@given(sid=st.text(min_size=1, max_size=40).filter(lambda s: "\x00" not in s))
def test_any_session_id_gets_a_key_of_its_own(sid: str) -> None:
    from eventstore import InvalidSessionIdError

    with SessionStore("memory://", keys=ring()) as store:
        try:
            store.append_transcript_messages(sid, [Message(role=Role.USER, content=MARKER)])
        except InvalidSessionIdError:
            return
        store.append_transcript_messages("other", [Message(role=Role.USER, content="x")])
        assert store.load_transcript_messages(sid)[0].content == MARKER
        assert store.forget_key(sid)
        with pytest.raises(KeyForgottenError):
            store.load_transcript_messages(sid)
        if sid != "other":
            assert store.load_transcript_messages("other")[0].content == "x"


def test_the_report_and_serve_show_an_encrypted_session_only_with_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import http.client
    import threading

    from eventstore.report.server import HOST, ReportServer

    key, root, page = tmp_path / "m1.key", tmp_path / "st", tmp_path / "page.html"
    KeyRing.write_new(key, "m1")
    with SessionStore(root, keys=KeyRing.load(key)) as store:
        fill(store)
    before = every_byte(root)
    code, _, err = cli_in_process(capsys, "report", str(root), "s1", "-o", str(page))
    assert code == 2 and "key" in err and not page.exists()
    code, _, _ = cli_in_process(
        capsys, "report", str(root), "s1", "-o", str(page), "--master-key", str(key)
    )
    assert code == 0 and MARKER in page.read_text()  # decrypted: the caller asked, with the key
    for keys, status in ((None, 500), (KeyRing.load(key), 200)):
        srv = ReportServer(root, 0, keys)
        thread = threading.Thread(target=srv.serve_forever, daemon=True)
        thread.start()
        try:
            conn = http.client.HTTPConnection(HOST, srv.server_address[1], timeout=30)
            conn.request("GET", "/session/s1")
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
        finally:
            srv.shutdown()
            srv.server_close()
            thread.join(timeout=10)
        assert resp.status == status
        assert (MARKER.encode() in body) == (status == 200)
    assert every_byte(root) == before  # neither writes to the store


def test_signed_heads_of_an_encrypted_session_verify_without_its_data_key(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    root = tmp_path / "st"
    signing = Ed25519PrivateKey.generate()
    with SessionStore(root, keys=ring(), signing_key=signing) as store:
        fill(store)
        store.seal("s1")
    lines = [msgspec.json.decode(line) for line in log_of(root).read_bytes().splitlines()]
    seals = [d for d in lines if d["type"] == "seal"]
    assert seals and all("_enc" not in d for d in seals)  # a seal stays readable
    with SessionStore(root) as keyless:  # no data key: the chain and the seals check
        assert keyless.verify("s1", public_key=signing.public_key()).ok
    no_marker(root)


def test_the_async_store_forgets_and_rekeys(tmp_path: Path) -> None:
    import asyncio

    from eventstore.aio import AsyncSessionStore

    root = tmp_path / "st"

    async def main() -> None:
        with SessionStore(root, keys=ring()) as store:
            await run(store)

    async def run(store: SessionStore) -> None:
        async with AsyncSessionStore(store) as st:
            await st.append_transcript_messages("s1", [Message(role=Role.USER, content=MARKER)])
            await st.append_transcript_messages("s2", [Message(role=Role.USER, content=MARKER)])
            assert await st.forget_key("s1")
            with pytest.raises(KeyForgottenError):
                await st.load_transcript_messages("s1")
            assert await st.rekey(ring("m2", M2)) == (1, 1)  # s2 rewrapped, s1 forgotten

    asyncio.run(main())
    with SessionStore(root, keys=ring("m2", M2)) as store:
        assert store.load_transcript_messages("s2")[0].content == MARKER
    no_marker(root)


# -- a delete reaches the copies: deleting an encrypted session shreds its key -----------


def _slot(store: SessionStore, sid: str = "s1") -> bytes | None:
    engine = store.engine
    assert isinstance(engine, KeyEngine)
    return engine.load_key_slot(key_id_of(sid))


def _written(store: SessionStore, sid: str = "s1") -> None:
    """`fill`, then compacted with an archive and written to after: the marker is in the
    live log, the snapshot and the archive."""
    fill(store, sid)
    assert store.compact(sid, force=True).compacted
    store.append_transcript_messages(sid, [Message(role=Role.USER, content=f"late {MARKER}")])


def _logs_only(store: SessionStore, tmp_path: Path, sid: str = "s1") -> SessionStore:
    """A backup of the session's logs and archive (a file store), without its key slot:
    what a backup of the logs kept apart from the key slots holds."""
    backup = SessionStore(tmp_path / f"backup-{uuid.uuid4().hex[:8]}")
    migrate_session(store.engine, backup, sid)
    engine = backup.engine
    assert isinstance(engine, KeyEngine)
    data = engine.load_key_slot(key_id_of(sid))
    assert data is not None and engine.remove_key_slot(key_id_of(sid), data)
    return backup


def _nothing_readable(store: SessionStore, sid: str = "s1") -> list[str]:
    """Every read of the session's content either fails with a typed error or shows no
    marker; returns the names of the errors raised."""
    reads = {
        "transcript": lambda: store.load_transcript_messages(sid),
        "bootstrap": lambda: store.load_bootstrap_state(sid),
        "events": lambda: list(store.read_events(sid)),
        "state_at": lambda: store.state_at(sid, seq=3),
        "transcript_at": lambda: store.transcript_at(sid, seq=max(1, store.last_seq(sid))),
    }
    raised = []
    for name, read in reads.items():
        try:
            out = read()
        except EventStoreError as exc:
            raised.append(type(exc).__name__)
            assert MARKER not in str(exc), name
            continue
        assert MARKER not in repr(out), name
    return raised


@pytest.mark.parametrize("purge", [False, True], ids=["tombstone", "purge"])
def test_a_delete_shreds_the_key_so_no_backup_of_the_logs_opens(
    url: str, tmp_path: Path, purge: bool
) -> None:
    """After `delete_session` of an encrypted session, its logs and archive restored from
    a backup taken before the delete (the store's key slots kept as the delete left them)
    open under no API: the key is forgotten (tombstone: KeyForgottenError) or gone
    (purge: KeyMissingError), never silently a new one; the chain still verifies."""
    with SessionStore(url, keys=ring()) as store:
        _written(store)
        backup = _logs_only(store, tmp_path)
        assert store.delete_session("s1", purge=purge)
        slot = _slot(store)
        if purge:
            assert slot is None  # the id is free
        else:
            assert slot is not None and decode_slot(slot, key_id_of("s1")).forgotten is not None
            assert store.load_transcript_messages("s1") == []  # deleted: reads empty
        store.engine.remove_session("s1")  # the backup's logs back in place of the store's
        migrate_session(backup.engine, store.engine, "s1")
        assert _slot(store) == slot  # (the backup carried no slot: the store's are kept)
    with SessionStore(url, keys=ring()) as store:
        raised = _nothing_readable(store)
        want = "KeyMissingError" if purge else "KeyForgottenError"
        assert raised and set(raised) == {want}
        assert store.verify("s1").ok
    backup.close()


def test_restore_after_deleting_an_encrypted_session_gives_it_a_new_key(
    url: str, tmp_path: Path
) -> None:
    """`restore` frees the id and its forgotten slot: new events get a new key and read
    back; what was written before the delete (a backup) does not open under the new key."""
    with SessionStore(url, keys=ring()) as store:
        _written(store)
        backup = _logs_only(store, tmp_path)
        old = _slot(store)
        assert store.delete_session("s1") and store.restore("s1")
        assert _slot(store) is None
        store.append_transcript_messages("s1", [Message(role=Role.USER, content="fresh")])
        new = _slot(store)
        assert new is not None and new != old
    with SessionStore(url, keys=ring()) as store:
        assert [m.content for m in store.load_transcript_messages("s1")] == ["fresh"]
    mixed_url = f"memory://mixed-{uuid.uuid4().hex}"
    with SessionStore(mixed_url) as mixed:  # the backup's logs beside the new key slot
        migrate_session(backup.engine, mixed, "s1")
        assert isinstance(mixed.engine, KeyEngine)
        assert mixed.engine.create_key_slot(key_id_of("s1"), new)
    with SessionStore(mixed_url, keys=ring()) as mixed:
        assert set(_nothing_readable(mixed)) == {"CorruptLogError"}  # does not authenticate
    backup.close()


def test_a_store_holding_the_old_key_writes_a_restored_id_under_the_new_one(url: str) -> None:
    """A store that kept a session's data key in memory, writing to the id after another
    store deleted and restored it, rereads the slot (a new session's first write does):
    its events are under the new key, readable by every store."""
    with SessionStore(url, keys=ring()) as a, SessionStore(url, keys=ring()) as b:
        b.append_transcript_messages("s1", [Message(role=Role.USER, content=MARKER)])
        assert b.load_transcript_messages("s1")[0].content == MARKER  # b holds the key
        assert a.delete_session("s1") and a.restore("s1")
        b.append_transcript_messages("s1", [Message(role=Role.USER, content="after")])
    with SessionStore(url, keys=ring()) as c:
        assert [m.content for m in c.load_transcript_messages("s1")] == ["after"]


def test_only_a_key_slot_holding_the_given_bytes_is_removed(url: str) -> None:
    """`KeyEngine.remove_key_slot` compares and deletes: a slot replaced meanwhile stays."""
    with SessionStore(url, keys=ring()) as store:
        store.append_transcript_messages("s1", [Message(role=Role.USER, content="x")])
        engine = store.engine
        assert isinstance(engine, KeyEngine)
        dk = key_id_of("s1")
        live = engine.load_key_slot(dk)
        assert live is not None
        assert not engine.remove_key_slot(dk, live + b" ")
        assert engine.load_key_slot(dk) == live
        assert engine.remove_key_slot(dk, live) and engine.load_key_slot(dk) is None
        assert not engine.remove_key_slot(dk, live)


def test_a_rekey_never_writes_back_a_key_forgotten_after_it_read_the_slot(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: another store forgets a session's key right after `rekey` read its slot.
    The rekey does not write the destroyed key back under the new master key (it counts
    the slot among those left): the session opens under neither ring, its slot stays
    forgotten, and the other session is rewrapped."""
    dk = key_id_of("s1")
    forgot: list[bool] = []
    with SessionStore(url, keys=ring()) as store, SessionStore(url, keys=ring()) as other:
        fill(store, "s1")
        store.append_transcript_messages("s2", [Message(role=Role.USER, content="kept")])
        engine = store.engine
        assert isinstance(engine, KeyEngine)
        read = engine.load_key_slot

        def read_then_forget(slot_id: str) -> bytes | None:
            data = read(slot_id)
            if slot_id == dk and not forgot:  # the race: a forget between read and write
                forgot.append(other.forget_key("s1"))
            return data

        monkeypatch.setattr(engine, "load_key_slot", read_then_forget)
        assert store.rekey(ring("m2", M2)) == (1, 1)
        monkeypatch.undo()
    assert forgot == [True]
    for keys in (ring(), ring("m2", M2)):
        with SessionStore(url, keys=keys) as store:
            assert set(_nothing_readable(store)) == {"KeyForgottenError"}
            slot = _slot(store)
            assert slot is not None and decode_slot(slot, dk).forgotten is not None
    with SessionStore(url, keys=ring("m2", M2)) as store:
        assert [m.content for m in store.load_transcript_messages("s2")] == ["kept"]


@pytest.mark.timeout(60)  # (opened for reading, a FIFO with no writer blocks)
def test_a_fifo_planted_as_a_key_slot_is_a_typed_error_never_a_hang(tmp_path: Path) -> None:
    """A FIFO where a session's key slot (`keys/<id>`) should be: a load raises an
    EventStoreError instead of waiting forever for the FIFO's writer."""
    root = tmp_path / "store"
    with SessionStore(root, keys=ring()) as store:
        store.append_transcript_messages("s1", [Message(role=Role.USER, content="x")])
    slot = root / "keys" / key_id_of("s1")
    slot.unlink()
    os.mkfifo(slot)
    with SessionStore(root, keys=ring()) as store, pytest.raises(EventStoreError):
        store.load_transcript_messages("s1")


class _Crash(Exception):
    """A delete stopped at a step (what a kill there leaves)."""


@pytest.mark.parametrize(
    ("step", "purge"),
    [
        ("install_snapshot", False),  # tombstone durable, data not yet erased
        ("replace_key_slot", False),  # erased, key not yet destroyed
        ("replace_key_slot", True),
        ("remove_session", True),  # erased and shredded, log not yet removed
        ("remove_key_slot", True),  # log removed, forgotten slot not yet removed
    ],
)
def test_a_delete_stopped_at_any_step_leaves_no_live_session_without_its_key(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, purge: bool
) -> None:
    """The key is destroyed only after the tombstone is durable and the log erased: a
    delete stopped at any step leaves the session live and readable, or deleted; the
    delete run again finishes (the key destroyed, a backup of the logs unreadable); after
    a stopped purge, the id takes a new session with a new key."""
    with SessionStore(url, keys=ring()) as store:
        _written(store)
        want = store.load_transcript_messages("s1")
        backup = _logs_only(store, tmp_path)

        def crash(*args: object, **kw: object) -> object:
            raise _Crash(step)

        with monkeypatch.context() as m:
            m.setattr(store.engine, step, crash)
            with pytest.raises(_Crash):
                store.delete_session("s1", purge=purge)
    with SessionStore(url, keys=ring()) as store:
        t = store.tombstone_of("s1")
        if t is None and store.last_seq("s1"):
            assert store.load_transcript_messages("s1") == want  # live: its key is there
        else:
            assert store.load_transcript_messages("s1") == []  # deleted (or gone)
        store.delete_session("s1", purge=purge)  # finishes what was stopped
        slot = _slot(store)
        if purge:
            assert slot is None
            store.append_transcript_messages("s1", [Message(role=Role.USER, content="new")])
            assert [m.content for m in store.load_transcript_messages("s1")] == ["new"]
            store.delete_session("s1", purge=True)
        else:
            assert slot is not None and decode_slot(slot, key_id_of("s1")).forgotten is not None
        store.engine.remove_session("s1")
        migrate_session(backup.engine, store.engine, "s1")
    with SessionStore(url, keys=ring()) as store:
        assert _nothing_readable(store)
    backup.close()


_KEYED_DELETER = textwrap.dedent(
    """
    import sys
    from eventstore import KeyRing, SessionStore
    with SessionStore(sys.argv[1], keys=KeyRing({"m1": bytes(range(32))})) as store:
        for sid in sys.argv[2:]:
            store.delete_session(sid)
    """
)


def test_a_deleter_of_encrypted_sessions_killed_at_random_moments(tmp_path: Path) -> None:
    """After every SIGKILL of a process deleting encrypted sessions, each is live with its
    key (reads as written) or deleted (reads empty, takes no write): never live without
    its key; deleting again leaves every key destroyed."""
    import random
    import signal
    import subprocess
    import sys
    import time

    root = tmp_path / "st"
    rng = random.Random(3333)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    ids = [f"s{i:02d}" for i in range(16)]
    with SessionStore(root, keys=ring()) as store:
        for sid in ids:
            store.append_transcript_messages(sid, [Message(role=Role.USER, content=MARKER)])
    for _ in range(4):
        with SessionStore(root, keys=ring()) as store:
            left = [sid for sid in ids if store.tombstone_of(sid) is None]
        if not left:
            break
        proc = subprocess.Popen([sys.executable, "-c", _KEYED_DELETER, str(root), *left], env=env)
        time.sleep(rng.uniform(0.05, 0.8))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        with SessionStore(root, keys=ring()) as store:
            for sid in ids:
                if store.tombstone_of(sid) is None:
                    assert store.load_transcript_messages(sid)[0].content == MARKER, sid
                else:
                    assert store.load_transcript_messages(sid) == [], sid
                    with pytest.raises(SessionDeletedError):
                        store.append_transcript_messages(
                            sid, [Message(role=Role.USER, content="x")]
                        )
    with SessionStore(root, keys=ring()) as store:
        for sid in ids:
            store.delete_session(sid)
            slot = _slot(store, sid)
            assert slot is not None and decode_slot(slot, key_id_of(sid)).forgotten is not None


def test_a_fork_into_a_purged_id_is_under_its_new_key(url: str) -> None:
    """A fork starts a session: into an id another store purged, by a store that still
    holds the id's old key in memory, it rereads the slot and seals under a new key."""
    with SessionStore(url, keys=ring()) as a, SessionStore(url, keys=ring()) as b:
        b.append_transcript_messages("dst", [Message(role=Role.USER, content=MARKER)])
        b.append_transcript_messages("src", [Message(role=Role.USER, content="from src")])
        assert b.load_transcript_messages("dst")[0].content == MARKER  # b holds the key
        assert a.delete_session("dst", purge=True)
        b.fork_session("src", "dst")
    with SessionStore(url, keys=ring()) as c:
        assert [m.content for m in c.load_transcript_messages("dst")] == ["from src"]


def test_a_store_without_keys_deleting_an_encrypted_session_shreds_its_key(
    tmp_path: Path,
) -> None:
    """No master key is needed to destroy a data key: `eventstore delete` without
    `--master-key` shreds it too. (Not yet of a compacted session: a store without keys
    cannot fold the lifecycle state out of its encrypted snapshot, and refuses.)"""
    root = tmp_path / "st"
    with SessionStore(root, keys=ring()) as store:
        fill(store)
    with SessionStore(root) as keyless:
        assert keyless.delete_session("s1")
        slot = _slot(keyless)
        assert slot is not None and decode_slot(slot, key_id_of("s1")).forgotten is not None
        assert keyless.load_transcript_messages("s1") == []

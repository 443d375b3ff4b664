"""The checked prefix (eventstore.core.checked_prefix): a digest of a live log's first bytes
that passed the hash-chain check, so a cold load checks them with one SHA-256.

Attacks: an edit anywhere in the vouched-for bytes (and a flip of every 397th byte), the
log cut short below the mark, a mark that is garbage, of another session, of another
log (after compaction), or with a wrong digest or size; a line whose hash does not
check appended after a reader's prefix; a fork. Writers keep no prefix (hashing what
they append cost an eighth of an append): a load that checked the log from its start
keeps one, and so does a compaction for the snapshot it wrote. Each time the load
either returns exactly what a fully checked fold returns or raises CorruptLogError:
never a state folded from bytes the chain did not pass.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import oracle
import pytest
from conftest import (
    check_whole,
    log_path,
    make_entry,
    make_features,
    make_manifest,
    wait_child,
)
from tuning import tune

from eventstore import SessionStore
from eventstore.core import checked_prefix
from eventstore.core import fold_loop as fold_loop_module
from eventstore.engines.file.caches import cache_file_name
from eventstore.errors import CorruptLogError
from eventstore.format import reader as log_module
from eventstore.records import (
    Message,
    Role,
)

# these tests attack how a load reads and checks the log: no transcript fold cache
# stands in for it (see conftest.no_transcript_cache)
pytestmark = pytest.mark.usefixtures("no_transcript_cache")


MSG = [Message(role=Role.USER, content="u" * 300), Message(role=Role.ASSISTANT, content="a" * 900)]


def _mark_file(root: Path, sid: str = "s") -> Path:
    return log_path(root, sid).parent / cache_file_name(checked_prefix.NAME)


def _fill(store: SessionStore, sid: str = "s", turns: int = 100) -> None:
    store.initialize_session_if_missing(sid, make_manifest(sid), make_features(5))
    for i in range(turns):
        store.append_transcript_messages(sid, MSG)
        if i % 5 == 0:
            store.append_progress_entry(sid, make_entry(i))


class _Spy:
    """Counts the bytes read_lines was given as already checked, and as not."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.trusted = 0
        self.checked = 0
        real = log_module.read_lines

        def read_lines(buf: bytes, *a: Any, hashes_checked: bool = False, **kw: Any) -> Any:
            if hashes_checked:
                self.trusted += len(buf)
            else:
                self.checked += len(buf)
            return real(buf, *a, hashes_checked=hashes_checked, **kw)

        monkeypatch.setattr(fold_loop_module, "read_lines", read_lines)


@pytest.fixture
def written(root: Path) -> Path:
    """A session of ~150 KB, then a reader that checked it whole and saved its prefix."""
    with SessionStore(root) as s:
        _fill(s)
    assert not _mark_file(root).exists()  # a writer keeps none
    check_whole(root, "s")
    assert _mark_file(root).is_file()
    return root


def test_a_reader_saves_its_prefix_and_a_cold_load_trusts_it(
    written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = log_path(written, "s").stat().st_size
    kept = json.loads(_mark_file(written).read_bytes().split(b"\n")[1])
    assert kept["size"] == size  # the whole log: the reader checked every byte
    truth = oracle.truth(written, "s")
    spy = _Spy(monkeypatch)
    with SessionStore(written) as s:
        assert s.load_transcript_messages("s") == truth.transcript
        assert spy.trusted == size and spy.checked == 0


def test_a_load_checks_line_by_line_what_was_appended_after_the_prefix(
    written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(written) as other:
        other.core.caches.marks = (
            False  # a writer that keeps no prefix (another process, an old release)
        )
        other.append_transcript_messages("s", [Message(role=Role.USER, content="later")])
    spy = _Spy(monkeypatch)
    with SessionStore(written) as s:
        messages = s.load_transcript_messages("s")
    assert spy.trusted > 0 and 0 < spy.checked < 1000
    assert messages[-1].content == "later" and messages == oracle.truth(written, "s").transcript


@pytest.mark.parametrize("where", ["a message", "a progress summary", "a hash"])
def test_an_edit_in_the_vouched_bytes_is_caught(written: Path, where: str) -> None:
    log = log_path(written, "s")
    data = log.read_bytes()
    needle = {"a message": b"u" * 300, "a progress summary": b"step 50", "a hash": b'"h":"'}[where]
    at = data.index(needle, len(data) // 2) + len(needle) - 2
    edited = data[:at] + (b"v" if data[at : at + 1] != b"v" else b"w") + data[at + 1 :]
    log.write_bytes(edited)  # same length, still JSON: only the chain can tell
    with SessionStore(written) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages("s")


@pytest.mark.parametrize(
    "piece", [None, 4096], ids=["one piece", "4 KiB pieces (views, hashed aside)"]
)
def test_a_flip_of_any_byte_is_caught_or_harmless(
    written: Path, monkeypatch: pytest.MonkeyPatch, piece: int | None
) -> None:
    if piece is not None:  # pieces cut mid-batch come as views; each hashed on the side
        tune(monkeypatch, read_piece=piece)
        tune(monkeypatch, hash_aside=0)
    log = log_path(written, "s")
    data = log.read_bytes()
    truth = oracle.truth(written, "s")
    for at in range(0, len(data), 397):
        flipped = bytes([data[at] ^ 0x01])
        log.write_bytes(data[:at] + flipped + data[at + 1 :])
        try:
            with SessionStore(written) as s:
                got = s.load_bootstrap_state("s"), s.load_transcript_messages("s")
        except CorruptLogError:
            continue
        assert got == truth, f"a flip at byte {at} changed what a load returned"
    log.write_bytes(data)


def test_a_log_cut_below_the_mark_ignores_the_mark(written: Path) -> None:
    log = log_path(written, "s")
    data = log.read_bytes()
    cut = data.rindex(b"\n", 0, len(data) // 2) + 1
    log.write_bytes(data[:cut])
    with SessionStore(written) as s:
        cut_messages = s.load_transcript_messages("s")
    assert cut_messages == oracle.truth(written, "s").transcript and len(cut_messages) < 200


@pytest.mark.parametrize(
    "damage",
    ["garbage", "empty", "other session", "wrong digest", "wrong size", "shorter size", "format"],
)
def test_a_damaged_or_foreign_mark_is_ignored(written: Path, damage: str) -> None:
    mark = _mark_file(written)
    head, line, _ = mark.read_bytes().split(b"\n")
    kept = json.loads(line)
    if damage == "garbage":
        line = b"\x00not json"
    elif damage == "empty":
        line = b""
    elif damage == "other session":
        kept["session"] = "t"
    elif damage == "wrong digest":
        kept["sha256"] = "0" * 64
    elif damage == "wrong size":
        kept["size"] += 1
    elif damage == "shorter size":
        kept["size"] //= 2
    else:
        kept["format"] = 99
    if damage not in ("garbage", "empty"):
        line = json.dumps(kept).encode()
    mark.write_bytes(head + b"\n" + line + b"\n")
    truth = oracle.truth(written, "s")
    with SessionStore(written) as s:
        assert s.load_transcript_messages("s") == truth.transcript
        assert s.load_bootstrap_state("s") == truth.state


def test_verify_finds_an_edit_even_under_a_forged_mark(
    written: Path,
) -> None:
    """The threat model, pinned: the digest, like the chain, is unkeyed. An edit caught
    by the chain is also caught with a mark, unless the editor also rewrites the mark's
    digest; `verify` always checks the whole chain and still finds it."""
    log = log_path(written, "s")
    data = log.read_bytes()
    at = data.index(b"u" * 300) + 10
    edited = data[:at] + b"v" + data[at + 1 :]
    log.write_bytes(edited)
    mark = _mark_file(written)
    head, line, _ = mark.read_bytes().split(b"\n")
    kept = json.loads(line)
    import hashlib

    kept["sha256"] = hashlib.sha256(edited[: kept["size"]]).hexdigest()
    mark.write_bytes(head + b"\n" + json.dumps(kept).encode() + b"\n")
    with SessionStore(written) as s:
        assert not s.verify("s").ok


def test_a_mark_of_a_replaced_log_is_not_used(
    written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(written) as s:
        s.core.caches.marks = False  # a compactor that keeps no prefix (an older release): the mark
        s.compact("s")  # left on disk is the replaced log's
    truth = oracle.truth(written, "s")
    spy = _Spy(monkeypatch)
    with SessionStore(written) as s:
        assert s.load_transcript_messages("s") == truth.transcript
    assert spy.trusted == 0  # the old log's mark names another file: the engine drops it


def test_bytes_appended_after_a_readers_prefix_are_never_vouched_for(root: Path) -> None:
    """A reader keeps its prefix while a line whose hash does not check is appended
    behind its back, then a good append by a writer that folded it: the prefix stops
    before the bad line, so a cold load still checks that line (and fails)."""
    with SessionStore(root) as w:
        _fill(w, turns=60)
    with SessionStore(root) as r:
        r.load_transcript_messages("s")  # checked from the start: the prefix
        log = log_path(root, "s")
        lines = log.read_bytes().splitlines(keepends=True)
        last = json.loads(lines[-1])
        bad = dict(last, seq=last["seq"] + 1, h="0" * 16)
        bad.pop("key", None)
        with open(log, "ab") as fh:
            fh.write(json.dumps(bad, separators=(",", ":")).encode() + b"\n")
        r.append_progress_entry("s", make_entry(999))  # chains after the bad line
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages("s")


def test_a_writer_keeps_no_prefix(root: Path) -> None:
    """What it appends is not hashed for a prefix (an eighth of an append's cost): the
    next cold load from the start checks every line, and keeps the prefix then."""
    with SessionStore(root) as w:
        _fill(w, turns=60)
        assert w.cache_info("s").prefix is None
    assert not _mark_file(root).exists()


def test_a_reader_that_checked_a_long_log_saves_a_prefix(root: Path) -> None:
    with SessionStore(root) as w:
        w.core.caches.marks = False
        _fill(w, turns=900)  # > 1 MiB
    assert not _mark_file(root).exists()
    truth = oracle.truth(root, "s")
    s = SessionStore(root)
    assert s.load_transcript_messages("s") == truth.transcript
    assert _mark_file(root).is_file()  # after a long checked fold, not only on close
    s.close()
    with SessionStore(root) as again:
        assert again.load_transcript_messages("s") == truth.transcript


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_without_the_parents_prefix(written: Path) -> None:
    with SessionStore(written) as s:
        s.load_transcript_messages("s")
        assert s.cache_info("s").prefix is not None
        pid = os.fork()
        if pid == 0:  # the child: no prefix inherited, and its loads still check
            ok = s.cache_info("s").prefix is None and len(s.load_transcript_messages("s")) == 200
            os._exit(0 if ok else 1)
        assert wait_child(pid, 60) == 0


def test_a_load_that_uses_the_saved_prefix_does_not_rewrite_it(written: Path) -> None:
    before = os.stat(_mark_file(written)).st_ino
    with SessionStore(written) as s:
        s.load_transcript_messages("s")
        s.load_bootstrap_state("s")
    assert os.stat(_mark_file(written)).st_ino == before  # no write (and no fsync) on a load


def test_a_compaction_vouches_for_the_snapshot_it_wrote(
    written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = oracle.truth(written, "s")
    with SessionStore(written) as s:
        assert s.compact("s", force=True).compacted
    log = log_path(written, "s")
    size = log.stat().st_size
    kept = json.loads(_mark_file(written).read_bytes().split(b"\n")[1])
    assert kept["size"] == size  # the new log, the one line the compaction encoded
    spy = _Spy(monkeypatch)
    with SessionStore(written) as s:
        assert (s.load_bootstrap_state("s"), s.load_transcript_messages("s")) == truth
    assert spy.trusted == size and spy.checked == 0  # the first cold load checks no hash
    data = log.read_bytes()
    at = data.index(b"u" * 300) + 100
    log.write_bytes(data[:at] + b"v" + data[at + 1 :])  # same length, still JSON
    with SessionStore(written) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages("s")

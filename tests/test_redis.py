"""The Redis engine beyond the shipped conformance suite (which runs on it in
tests/test_engine_conformance.py, as does the model test): copying stores byte for byte,
hostile session ids, durability and what a server must be set to for "fsync", expiry,
connections killed mid-append and mid-follow, processes killed mid-append, a server
killed and restarted from its AOF, the global feed across a restart, and passwords kept
out of every message.

Needs a Redis server: EVENTSTORE_TEST_REDIS_URL (`.ci/start-redis.sh` starts one; CI
fails without it). The restart tests start servers of their own with the same
`redis-server` binary.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from conftest import cli_in_process, make_entry, require_redis_url
from engines import fresh_redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import EventStoreError, ProgressAppended, SessionStore, StorageError
from eventstore.engines.base import CachingEngine, EncodedBatch, PruningEngine, open_engine
from eventstore.engines.conformance import EngineConformance, corrupt
from eventstore.format.chain import SNAPSHOT_OPEN
from eventstore.format.codec import EventCodec
from eventstore.ops.export import export_jsonl
from eventstore.ops.seek import events_by_seq

redis = pytest.importorskip("redis")

SID = "s"


@pytest.fixture
def server() -> str:
    """The test server's URL (no prefix)."""
    return require_redis_url()


@pytest.fixture
def url(server: str) -> str:
    """A store URL with a key prefix of this test's own."""
    return fresh_redis()


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url.split("?")[0])


def _prefix(url: str) -> str:
    return url.split("prefix=")[1].split("&")[0]


def _keys_of(url: str) -> list[bytes]:
    return sorted(_client(url).scan_iter(match=f"{_prefix(url)}:*"))


def _three_appends(url: str) -> tuple[redis.Redis, Callable[[str], str]]:
    """A session of three appends, a client of its server, and the name of its key of a
    kind (`h` the head, `l` the live log list, ...)."""
    with SessionStore(url) as store:
        for i in range(3):
            store.append_progress_entry(SID, make_entry(i))

    def key(kind: str) -> str:
        return f"{_prefix(url)}:{{{SID}}}:{kind}"

    return _client(url), key


def _summaries(store: SessionStore, sid: str = SID) -> list[str]:
    return [e.summary for e in store.load_bootstrap_state(sid).recent_progress]


# -- migrate: file -> redis -> file, byte for byte --------------------------------------------


def test_migrate_file_to_redis_to_file_exports_identical_lines(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from eventstore import Message, Role

    src, back = str(tmp_path / "src"), str(tmp_path / "back")
    sids = ("plain", "compacted", "ünï ¢ødé")
    with SessionStore(src) as store:
        for sid in sids:
            for i in range(5):
                store.append_progress_entry(sid, make_entry(i, run_id=sid))
                store.append_transcript_messages(
                    sid, [Message(Role.USER, f"q{i}"), Message(Role.ASSISTANT, "a")]
                )
            if sid != "plain":
                store.compact(sid, archive=True, force=True)
                store.append_progress_entry(sid, make_entry(9, run_id="after"))
                store.compact(sid, archive=True, force=True)
                store.append_progress_entry(sid, make_entry(10, run_id="after 2"))
    assert cli_in_process(capsys, "migrate", src, url, "--all", "--quiet")[0] == 0
    assert cli_in_process(capsys, "migrate", url, back, "--all", "--quiet")[0] == 0
    assert cli_in_process(capsys, "migrate", src, url, "--all", "--quiet")[0] == 0  # idempotent

    def export(root: str, sid: str) -> bytes:
        # what `eventstore export ROOT SID --format jsonl` prints
        with SessionStore(root) as store:
            return b"".join(export_jsonl(store, sid))

    for sid in sids:
        lines = export(src, sid)
        assert lines and lines == export(url, sid) == export(back, sid)
        with SessionStore(url) as store, SessionStore(src) as orig:
            assert store.verify(sid).ok
            assert store.load_bootstrap_state(sid) == orig.load_bootstrap_state(sid)
    rc, out, _ = cli_in_process(capsys, "sessions", url)
    assert rc == 0 and all(sid in out for sid in sids)


# -- keys: hostile ids are data ---------------------------------------------------------------

HOSTILE = ["a}b", "{x}", "*", "s:{s}:h", "x\ny", "..", "~abc", "a b", "ü/../é", "z" * 1000, "{"]


def test_hostile_session_ids_are_data_never_keys(url: str) -> None:
    with SessionStore(url) as store:
        for i, sid in enumerate(HOSTILE):
            store.append_progress_entry(sid, make_entry(i))
        assert store.list_sessions() == sorted(HOSTILE)
        for i, sid in enumerate(HOSTILE):
            assert _summaries(store, sid) == [f"step {i}"]
        assert store.delete_session("{x}", purge=True) is True
        assert store.list_sessions() == sorted(set(HOSTILE) - {"{x}"})
        # the index's members hold the ids as data too: every order lists each once
        for order in ("id", "updated", "created"):
            listed = [i.session_id for i in store.sessions(order=order)]
            assert sorted(listed) == store.list_sessions(), order
        assert [i.session_id for i in store.sessions("{", order="id")] == ["{"]
    # every key but the store-wide ones (the global feed, the session index's sets) holds
    # exactly one hash tag, a session's own
    prefix = _prefix(url).encode()
    store_wide = {prefix + k for k in (b":feed", b":ix:u", b":ix:c", b":ix:i", b":ix:v")}
    for key in _keys_of(url):
        assert key in store_wide or (key.count(b"{") == 1 and key.count(b"}") == 1), key


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sids=st.lists(
        st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1),
        min_size=2,
        max_size=4,
        unique=True,
    )  # fmt: skip
)
def test_any_legal_session_id_is_its_own_session(server: str, sids: list[str]) -> None:
    url = fresh_redis()
    with SessionStore(url) as store:
        for i, sid in enumerate(sids):
            store.append_progress_entry(sid, make_entry(i))
        assert store.list_sessions() == sorted(sids)
        for i, sid in enumerate(sids):
            assert _summaries(store, sid) == [f"step {i}"]
        walked, after = [], None
        while page := store.sessions(order="id", limit=1, after=after):
            walked += [i.session_id for i in page]
            after = page[-1]
        assert walked == sorted(sids)  # the index orders ids by code point, as Python does


# -- the session index ----------------------------------------------------------------------


def test_a_store_written_before_the_index_is_indexed_on_its_first_page(url: str) -> None:
    # what a release without the index left: no sets, no index fields, no version key
    with SessionStore(url) as store:
        for i in range(5):
            store.append_progress_entry(f"s{i}", make_entry(i))
        store.set_labels("s1", {"team": "red"})
        store.compact("s2", force=True)
        before = store.sessions()
    prefix = _prefix(url)
    client = _client(url)
    client.delete(*(f"{prefix}:ix:{k}" for k in "ucvi"))
    for key in _keys_of(url):
        if key.endswith(b":h"):
            client.hdel(key, "cr", "up", "lb")
    with SessionStore(url) as store:
        assert store.sessions() == before  # rebuilt from the logs, once
        assert store.sessions(labels={"team": "red"}) == [i for i in before if i.labels]
        store.append_progress_entry("s0", make_entry(9))
        assert [i.session_id for i in store.sessions(limit=1)] == ["s0"]
    assert client.exists(f"{prefix}:ix:v") and _index_members(url) == 15


def test_only_a_store_with_unindexed_sessions_is_stale(url: str) -> None:
    from eventstore.engines.base import IndexingEngine

    with SessionStore(url) as store:  # written before any page: no rebuild needed
        store.append_progress_entry("a", make_entry(0))
    engine = open_engine(url)
    assert isinstance(engine, IndexingEngine)
    assert engine.index_stale() is False  # marked current when the first store opened
    prefix = _prefix(url)
    _client(url).delete(f"{prefix}:ix:v")
    with SessionStore(engine) as store:
        store.append_progress_entry(SID, make_entry(1))
        assert engine.index_stale() is True  # a session, no version key: may predate it
        assert [i.session_id for i in store.sessions()] == [SID, "a"]
        assert engine.index_stale() is False


def test_a_read_command_on_a_prefix_that_is_not_there_writes_no_key(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: every read command given a Redis prefix that holds nothing (a typo) left a
    key there: opening the engine marked the empty store's session index current
    (`ix:v`). A read opens it with `create=False` now, and writes no key; a writer's
    store still marks it."""
    for argv in (
        ["sessions", url],
        ["sessions", url, "--limit", "1"],
        ["verify", url, "--all"],
        ["log", url, "s"],
        ["export", url, "s"],
    ):
        cli_in_process(capsys, *argv)
        assert _keys_of(url) == [], argv
    with SessionStore(url):
        pass
    assert _keys_of(url) == [f"{_prefix(url)}:ix:v".encode()]


def test_a_rebuild_beside_writers_keeps_what_they_wrote(url: str) -> None:
    # a rebuild's entries are computed from logs a writer moves on from meanwhile: the
    # writer's newer entry (a higher seq) stays
    with SessionStore(url) as store:
        for i in range(20):
            store.append_progress_entry(f"r{i}", make_entry(i))
        stop = threading.Event()
        wrote: list[int] = []

        def write() -> None:
            with SessionStore(url) as w:
                while not stop.is_set() and len(wrote) < 200:
                    w.append_progress_entry(f"r{len(wrote) % 20}", make_entry(len(wrote)))
                    wrote.append(1)

        t = threading.Thread(target=write)
        t.start()
        try:
            for _ in range(3):
                store.rebuild_index()
        finally:
            stop.set()
            t.join()
        infos = store.sessions(order="id")
        assert [i.session_id for i in infos] == store.list_sessions()
        assert all(i.last_seq == store.last_seq(i.session_id) for i in infos)
        newest = store.sessions(limit=1)[0]
        assert newest.updated == max(i.updated for i in infos)
    assert _index_members(url) == 60


# -- durability --------------------------------------------------------------------------------


def test_fsync_is_refused_by_a_server_that_cannot_honour_it(url: str) -> None:
    from eventstore.engines.redis import RedisDurabilityError

    client = _client(url)
    before = client.config_get("appendfsync")["appendfsync"]
    try:
        for setting in ("everysec", "no"):  # on 7.2+ too for "no": WAITAOF would wait on the OS
            client.config_set("appendfsync", setting)
            with pytest.raises(RedisDurabilityError, match="appendfsync always") as info:
                SessionStore(url, durability="fsync")
            assert isinstance(info.value, EventStoreError)
            assert f"appendfsync={setting}" in str(info.value)
        client.config_set("appendfsync", "always")
        with SessionStore(url, durability="fsync") as store:
            store.append_progress_entry(SID, make_entry(1))
            assert _summaries(store) == ["step 1"]
    finally:
        client.config_set("appendfsync", before)
    with SessionStore(url) as store:  # flush: acknowledged by the server, whatever its AOF
        store.append_progress_entry(SID, make_entry(2))


# -- expiry ------------------------------------------------------------------------------------


def test_ttl_expires_a_whole_session_and_every_write_refreshes_it(server: str) -> None:
    url = fresh_redis(ttl="2")
    with SessionStore(url) as store:
        store.append_progress_entry(SID, make_entry(1))
        store.compact(SID, force=True)  # an archive key too
        store.append_progress_entry(SID, make_entry(2))
        store.append_progress_entry("other", make_entry(3))
        client = _client(url)
        keys = [k for k in _keys_of(url) if b":{s}:" in k and not k.endswith(b":k")]
        pipe = client.pipeline(transaction=True)
        for key in keys:
            pipe.pexpiretime(key)
        deadlines = pipe.execute()
        # every key of the session: one deadline, set by the same script
        assert len(keys) >= 5 and len(set(deadlines)) == 1 and deadlines[0] > 0
        time.sleep(1.0)
        store.append_progress_entry(SID, make_entry(4))  # refreshed: SID outlives "other"
        assert _gone_within(store, "other", 10)
        assert SID in store.list_sessions()
        assert _summaries(store) == ["step 1", "step 2", "step 4"]
        assert _gone_within(store, SID, 10)
    with SessionStore(url) as fresh:
        assert fresh.list_sessions() == []
        assert fresh.load_bootstrap_state(SID).recent_progress == []
        assert list(fresh.read_events(SID)) == []
        # the index's members outlive an expired session: pages pass over them and
        # write nothing (readers never write); a rebuild of the index drops them
        members = _index_members(url)
        for order in ("updated", "created", "id"):
            assert fresh.sessions(order=order) == []
        assert _index_members(url) == members == 6
        assert fresh.rebuild_index() == 0
        assert _index_members(url) == 0
        fresh.append_progress_entry(SID, make_entry(5))  # starts over at seq 1
        assert fresh.last_seq(SID) == 1
        (info,) = fresh.sessions()
        assert (info.session_id, info.last_seq, info.events) == (SID, 1, 1)


@pytest.mark.parametrize("write", ["compact", "compact-archive", "repair", "append"])
def test_attack_a_write_by_a_store_without_ttl_keeps_the_session_expiring_whole(
    server: str, write: str
) -> None:
    """Attack: a write by a store opened without `ttl=` (the CLI's `compact`, a repair)
    to a session a `ttl=` store writes made its live log anew (DEL, RPUSH), its archive
    and index with no expiry, while its head kept its own: the head expired, the rest
    stayed forever, and the next session of that id was appended onto the old log
    (verify: "sequence 1 where 4 was expected"). Now every such write gives every key of
    the session the head's expiry as it stands: one deadline for all of them."""
    url = fresh_redis()
    with SessionStore(url + "&ttl=60") as timed, SessionStore(url) as plain:
        for i in range(3):
            timed.append_progress_entry(SID, make_entry(i))
        if write == "compact":
            plain.compact(SID, force=True)
        elif write == "compact-archive":
            plain.compact(SID, archive=True, force=True)
        elif write == "repair":
            corrupt(plain.engine, SID, lambda data: data)
        else:
            plain.append_progress_entry(SID, make_entry(3))
        client = _client(url)
        keys = [k for k in _keys_of(url) if b":{s}:" in k and not k.endswith(b":k")]
        pipe = client.pipeline(transaction=True)
        for key in keys:
            pipe.pexpiretime(key)
        deadlines = dict(zip(keys, pipe.execute(), strict=True))
        assert len(set(deadlines.values())) == 1 and min(deadlines.values()) > 0, deadlines


@pytest.mark.parametrize(
    ("how", "ttl"),
    [
        ("option", 0.0004),  # under a millisecond: 0 ms, which means no expiry
        ("option", float("nan")),
        ("option", float("inf")),
        ("option", True),
        ("option", 10**16),  # a deadline PEXPIREAT takes as no integer
        ("url", str(10**14)),
    ],
)
def test_attack_a_ttl_the_server_cannot_keep_is_refused_when_the_store_opens(
    server: str, how: str, ttl: Any
) -> None:
    """Attack: `ttl=` below a millisecond was kept as 0 ms, no expiry at all (a session
    meant to vanish lived forever); NaN or infinity raised a bare ValueError or
    OverflowError; one so large that the deadline is no integer the server's PEXPIREAT
    takes failed every append with a StorageError after its line had landed (a caller's
    retry wrote it twice) and left every key without expiry. Now each is an
    InvalidArgumentError when the store opens, and nothing is written."""
    from eventstore import InvalidArgumentError

    url = fresh_redis()
    with pytest.raises(InvalidArgumentError, match="ttl"):
        if how == "url":
            open_engine(f"{url}&ttl={ttl}")
        else:
            open_engine(url, ttl=ttl)
    assert [k for k in _keys_of(url) if b":{" in k] == []
    # the bounds themselves are kept: a millisecond expires, the largest takes appends
    for ttl_s, sid in ((0.001, "brief"), (10**10, "long")):
        with SessionStore(open_engine(url, ttl=ttl_s)) as store:
            store.append_progress_entry(sid, make_entry(1))
            deadline = _client(url).pexpiretime(f"{_prefix(url)}:{{{sid}}}:h")
            assert deadline > 0 or (sid == "brief" and deadline == -2)  # (-2: gone already)
    assert (
        0
        < _client(url).pexpiretime(f"{_prefix(url)}:{{long}}:l") / 1000 - time.time()
        < 10**10 + 60
    )


def _deadlines(url: str, sid: str = SID) -> dict[bytes, int]:
    """Each key of the session (all but the repair hold) and its deadline, read in one
    MULTI (one instant of the server's)."""
    keys = [k for k in _keys_of(url) if f":{{{sid}}}:".encode() in k and not k.endswith(b":k")]
    pipe = _client(url).pipeline(transaction=True)
    for key in keys:
        pipe.pexpiretime(key)
    return dict(zip(keys, pipe.execute(), strict=True))


_TTL_STEPS = ["append", "append-plain", "compact", "keep", "keep-plain", "load", "load-plain"]


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(st.sampled_from([*_TTL_STEPS, "repair", "prune", "prune-plain"]), max_size=8))
def test_attack_every_key_of_a_session_keeps_one_deadline_whatever_writes_it(
    server: str, steps: list[str]
) -> None:
    """Attack: any sequence of writes to a session of a `ttl=` store, by it and by a
    store without `ttl=` (the CLI's compact and repair), and of fold caches kept by cold
    readers of either, a millisecond or more apart, leaves a key of the session with
    another deadline than its head (one that outlives it and lands under the next
    session of the id, or goes first and leaves half a session). Held: after every step
    each key of the session (head, live log, archive, saved, wake stream, caches, line
    index) has the one deadline, in the future."""
    url = fresh_redis()
    with SessionStore(url + "&ttl=60") as timed, SessionStore(url) as plain:
        timed.append_progress_entry(SID, make_entry(0))
        for i, step in enumerate(steps, 1):
            time.sleep(0.002)  # (the server's clock moves: a deadline set anew differs)
            store = plain if step.endswith("-plain") else timed
            if step.startswith("append"):
                store.append_progress_entry(SID, make_entry(i))
            elif step in ("compact", "keep", "keep-plain"):
                store.compact(SID, force=True, archive=step != "compact")
            elif step.startswith("load"):
                with SessionStore(store.url) as cold:  # a fresh reader: keeps its caches
                    cold.load_bootstrap_state(SID)
            elif step == "repair":
                corrupt(plain.engine, SID, lambda data: data)
            else:
                store.prune_archive(SID, store.last_seq(SID))
            deadlines = _deadlines(url)
            assert len(set(deadlines.values())) == 1, (steps[:i], deadlines)
            assert min(deadlines.values()) > 0, (steps[:i], deadlines)


_READS: dict[str, Callable[[SessionStore], object]] = {
    "load": lambda store: store.load_bootstrap_state(SID),
    "transcript": lambda store: store.load_transcript_messages(SID),
    "read_events": lambda store: list(store.read_events(SID)),
    "state_at": lambda store: store.state_at(SID, seq=2),
    "transcript_at": lambda store: store.transcript_at(SID, seq=2),
    "verify": lambda store: store.verify(SID),
    "last_seq": lambda store: store.last_seq(SID),
    "list_sessions": lambda store: store.list_sessions(),
    "sessions": lambda store: store.sessions(),
    "rebuild_index": lambda store: store.rebuild_index(),
    "feed": lambda store: store.feed(limit=10),
    "follow": lambda store: next(iter(store.follow(SID))),
    "cache_info": lambda store: store.cache_info(SID),
    "export": lambda store: list(export_jsonl(store.core, SID)),
}


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    ttl=st.sampled_from([0.001, 0.02]),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["append", "batch", "keep", "load"]),
            st.sampled_from([0.0, 0.5, 1.0, 1.5]),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_attack_writes_racing_a_tiny_ttl_never_mix_two_lives_of_a_session(
    server: str, ttl: float, steps: list[tuple[str, float]]
) -> None:
    """Attack: with the smallest ttl (a millisecond) or 20 ms, appends, batches,
    compactions that keep history and cold loads, spaced 0 to 1.5 ttls apart, so that
    the session expires between or during them: a writer that still holds the old
    life's head, a snapshot or cache of it, mixes old lines into the next life of the
    id. Held: every read sees one life, whole (seqs 1..n, each once, verify ok), or
    none; a write that lost the race fails typed."""
    url = fresh_redis()
    with SessionStore(open_engine(url, ttl=ttl)) as store:
        for i, (step, ttls) in enumerate(steps):
            time.sleep(ttl * ttls)
            try:
                if step == "append":
                    store.append_progress_entry(SID, make_entry(i))
                elif step == "batch":
                    store.append(SID, [ProgressAppended(entry=make_entry(i + k)) for k in range(3)])
                elif step == "keep":
                    store.compact(SID, force=True, archive=True)
                else:
                    with SessionStore(open_engine(url, ttl=ttl)) as cold:
                        cold.load_bootstrap_state(SID)
                seqs = [e.seq for e in store.read_events(SID)]
                report = store.verify(SID) if seqs else None
            except EventStoreError:
                continue  # (typed: the session went mid-way)
            assert seqs == list(range(1, len(seqs) + 1)), (steps[: i + 1], seqs)
            assert report is None or report.ok or not list(store.read_events(SID)), report


@pytest.mark.parametrize("ttl_of_reader", ["60", "600", None])
def test_attack_no_read_of_any_kind_moves_a_sessions_deadline(
    server: str, ttl_of_reader: str | None
) -> None:
    """Attack: every public read of a session of a `ttl=` store (a cold load that keeps
    fold caches, the history, verify, the index's pages and its rebuild, the feed, a
    follow, an export), by a store of the same `ttl=`, a longer one or none, each a few
    milliseconds after the last write, moves the deadline of some key of the session
    (a read that keeps a session alive, or one key pushed past the rest). Held: every key
    of the session keeps the deadline the last write gave it."""
    url = fresh_redis()
    with SessionStore(url + "&ttl=60") as writer:
        for i in range(3):
            writer.append_progress_entry(SID, make_entry(i))
            writer.compact(SID, force=True, archive=True)
        writer.append_progress_entry(SID, make_entry(3))
    before = _deadlines(url)
    assert len(set(before.values())) == 1 and len(before) >= 7, before
    reader_url = url if ttl_of_reader is None else f"{url}&ttl={ttl_of_reader}"
    for name, read in _READS.items():
        time.sleep(0.002)  # (the server's clock moves: a deadline set anew differs)
        with SessionStore(reader_url) as reader:
            read(reader)
        assert _deadlines(url) == before, name


@pytest.mark.parametrize("repairer", ["timed", "plain"])
def test_attack_a_session_that_expires_during_a_repair_is_not_written_back(
    server: str, repairer: str
) -> None:
    """Attack: a session of a `ttl=` store that expired while a repair held it (read,
    then idle past its deadline before the rewrite) was written back whole by the
    rewrite, from the repair's copy: a session the store had let go came back, and when
    the repair ran in a store without `ttl=` (the CLI's `eventstore repair`) its keys
    never expired at all. Now the rewrite finds no head, writes nothing and raises
    StorageError naming the session; the session stays gone, no key of it left."""
    url = fresh_redis()
    client = _client(url)
    with SessionStore(url + "&ttl=60") as timed, SessionStore(url) as plain:
        for i in range(3):
            timed.append_progress_entry(SID, make_entry(i))

        def expire(data: bytes) -> bytes:  # the session's deadline comes, mid-repair
            for key in _deadlines(url):
                client.pexpire(key, 1)
            time.sleep(0.01)
            return data

        store = timed if repairer == "timed" else plain
        with pytest.raises(StorageError, match=f"#{SID}.*expired"):
            corrupt(store.engine, SID, expire)
        assert _deadlines(url) == {}  # no key of the session, not even the one saved aside
        assert store.list_sessions() == [] and store.last_seq(SID) == 0


def _index_members(url: str) -> int:
    """How many members the store's session index sets hold, all three together."""
    client = _client(url)
    return sum(int(client.zcard(f"{_prefix(url)}:ix:{k}")) for k in "uci")


def _gone_within(store: SessionStore, sid: str, seconds: float) -> bool:
    """Whether the session expired (whole: no event readable) within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sid not in store.list_sessions():
            return store.last_seq(sid) == 0 and list(store.read_events(sid)) == []
        time.sleep(0.05)
    return False


def test_a_tombstone_on_a_ttl_store_refuses_writes_until_it_expires_with_its_session(
    server: str,
) -> None:
    """Attack: a session deleted (tombstoned, not purged) on a `ttl=` store is written
    again under its id, before and after its ttl. Before: SessionDeletedError, nothing
    written. A tombstone is a key of the session, which `ttl=` expires whole (a
    tombstone outliving it would keep every deleted id on the server for ever): after
    it, the id starts a new session at seq 1, no line of the deleted one in it."""
    from eventstore import SessionDeletedError

    url = fresh_redis(ttl="1")
    with SessionStore(url) as store:
        store.append_progress_entry(SID, make_entry(0))
        store.delete_session(SID)
        with pytest.raises(SessionDeletedError):
            store.append_progress_entry(SID, make_entry(1))
        assert store.tombstone_of(SID) is not None
        head, deadline = f"{_prefix(url)}:{{{SID}}}:h", time.monotonic() + 10
        while _client(url).exists(head) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _client(url).exists(head)  # expired, the tombstone with it
        assert store.tombstone_of(SID) is None
        store.append_progress_entry(SID, make_entry(2))
        assert [e.summary for e in store.load_bootstrap_state(SID).recent_progress] == [
            make_entry(2).summary
        ]
        assert store.last_seq(SID) == 1


def test_a_kept_cache_expires_with_its_session_and_no_read_extends_it(server: str) -> None:
    url = fresh_redis(ttl="3")
    with SessionStore(url) as store:
        store.append_progress_entry(SID, make_entry(1))
        head = store.engine.head(SID)
        assert isinstance(store.engine, CachingEngine)
        time.sleep(1.0)
        store.engine.store_cache(SID, "fold", head, [b"state"])  # kept later, by a reader
        client = _client(url)
        h, c = (k for k in _keys_of(url) if k.endswith((b":{s}:h", b":{s}:c")))
        assert client.pexpiretime(c) == client.pexpiretime(h) > 0  # not pushed back
        store.append_progress_entry(SID, make_entry(2))  # a write: one deadline for all
        assert client.pexpiretime(c) == client.pexpiretime(h) > 0
        assert _gone_within(store, SID, 10)
        assert [k for k in _keys_of(url) if b":{s}:" in k] == []
        assert store.engine.load_cache(SID, "fold") is None


# -- fold caches ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda at: b"", id="empty"),
        pytest.param(lambda at: at.rsplit(b" ", 1)[0], id="a-field-short"),
        pytest.param(lambda at: at + b" 1", id="a-field-more"),
        pytest.param(lambda at: b"x" + at, id="another-log"),
        pytest.param(lambda at: at.replace(at.split(b" ")[3], b"0" * 16), id="another-line"),
        pytest.param(lambda at: at.rsplit(b" ", 1)[0] + b" 99", id="past-the-log"),
        pytest.param(lambda at: at.rsplit(b" ", 1)[0] + b" 0", id="before-the-log"),
        pytest.param(lambda at: at.rsplit(b" ", 1)[0] + b" x", id="no-number"),
    ],
)
def test_a_cache_is_read_only_at_a_head_of_its_live_log(url: str, plant: Any) -> None:
    """A cache whose head names no point of the live log (planted, or kept by a tool
    that got it wrong) is never given back; the loads that follow fold the log and agree
    with a store that keeps no caches."""
    with SessionStore(url) as store:
        for i in range(3):
            store.append_progress_entry(SID, make_entry(i))
        engine = store.engine
        assert isinstance(engine, CachingEngine)
        engine.store_cache(SID, "fold", engine.head(SID), [b"state"])
        assert engine.load_cache(SID, "fold") is not None
    client = _client(url)
    (key,) = (k for k in _keys_of(url) if k.endswith(b":{s}:c"))
    for field, at in client.hgetall(key).items():
        if field.startswith(b"h:"):
            client.hset(key, field, plant(at))
    with SessionStore(url) as store:
        engine = store.engine
        assert isinstance(engine, CachingEngine)
        assert engine.load_cache(SID, "fold") is None
        assert engine.open_cache(SID, "fold") is None
        assert [p is None for p in engine.open_cache_parts(SID, "fold", 1)] == [True]
        with SessionStore(url, caches=False) as plain:
            assert _summaries(store) == _summaries(plain) == ["step 0", "step 1", "step 2"]


def test_every_key_of_a_session_goes_with_it_caches_included(url: str) -> None:
    with SessionStore(url) as store:
        store.append_progress_entry(SID, make_entry(1))
        store.compact(SID, force=True)  # keeps caches at the snapshot
        store.append_progress_entry(SID, make_entry(2))
    assert any(k.endswith(b":{s}:c") for k in _keys_of(url))
    with SessionStore(url) as store:
        store.delete_session(SID, purge=True)
    # all but the wake stream, which stays a minute so that followers wake and see it gone
    assert [k for k in _keys_of(url) if b":{s}:" in k] == [f"{_prefix(url)}:{{s}}:w".encode()]


# -- lines by seq: the live log's index ------------------------------------------------------


def _lines_as_read(engine: Any, sid: str = SID) -> dict[int, tuple[bytes, int, bytes]]:
    """What `lines_at` must answer for every seq, told from a read of the live log:
    each line with its offset and the last 25 bytes of the line before it (b"" for the
    log's first), none for an opening snapshot and the line after it."""
    got = engine.read(sid, None)
    data, base = bytes(got.data), got.head.base_seq
    out: dict[int, tuple[bytes, int, bytes]] = {}
    start = 0
    for j, line in enumerate(data.split(b"\n")[:-1]):
        if not (data.startswith(SNAPSHOT_OPEN) and j < 2):
            out[base + j] = (line, start, data[max(start - 25, 0) : start])
        start += len(line) + 1
    return out


def _lines_at(engine: Any, seqs: Any) -> dict[int, tuple[bytes, int, bytes]]:
    return {k: (v.line, v.offset, v.before) for k, v in engine.lines_at(SID, seqs).items()}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(st.sampled_from(["append", "batch", "compact", "keep", "repair"]), max_size=12)
)
def test_lines_by_seq_agree_with_the_log_after_any_writes(server: str, steps: list[str]) -> None:
    """Whatever appends (of one line or several), compactions (history kept or not) and
    repairs came before, every seq is answered as the live log holds it, and a tail
    answers its newest seqs so too."""
    with SessionStore(fresh_redis()) as store:
        engine = store.engine
        for i, step in enumerate(["append", *steps]):
            if step in ("append", "batch"):
                n = 1 if step == "append" else 3
                store.append(SID, [ProgressAppended(entry=make_entry(i + k)) for k in range(n)])
            elif step in ("compact", "keep"):
                store.compact(SID, force=True, archive=step == "keep")
            else:
                corrupt(engine, SID, lambda data: data)  # a repair's rewrite, same bytes
            want = _lines_as_read(engine)
            assert _lines_at(engine, range(store.last_seq(SID) + 2)) == want
            head, newest = engine.tail(SID, 4)  # the head and its newest lines, read together
            assert head == engine.head(SID)
            assert newest == engine.lines_at(SID, range(head.seq - 3, head.seq + 1))


def test_a_log_without_an_index_is_read_otherwise_until_it_is_replaced(url: str) -> None:
    """A live log written before the index existed (its `q` key missing) answers no line
    by seq, nor after appends (a search finds nothing: a LangGraph saver folds its
    thread's full index, as before the index). Compaction writes the index."""
    with SessionStore(url) as store:
        for i in range(4):
            store.append_progress_entry(SID, make_entry(i))
        (index,) = (k for k in _keys_of(url) if k.endswith(b":{s}:q"))
        _client(url).delete(index)
        store.append_progress_entry(SID, make_entry(4))
        assert store.engine.lines_at(SID, range(1, 6)) == {}
        assert store.engine.tail(SID, 3) == (store.engine.head(SID), {})  # the head still
        assert [e.seq for e in store.read_events(SID)] == [1, 2, 3, 4, 5]
        with events_by_seq(store, SID, frozenset({"progress_appended"})) as event_at:
            assert event_at is not None and event_at(2) is None
        store.compact(SID, force=True)
        for i in range(5, 8):
            store.append_progress_entry(SID, make_entry(i))
        assert _lines_at(store.engine, range(10)) == _lines_as_read(store.engine) != {}


def test_lines_of_one_long_batch_are_read_by_seq(url: str) -> None:
    """Attack: one element of the live log holding many lines (a batch of 16,000 events
    here; a repair's rewrite makes the whole log one) read by seq at once, as a cold
    `load_transcript_messages(last=N)` does in batches of up to 1,024: every line is the
    log's. (The script once counted each seq's newlines from the element's start,
    quadratic: ~12 s with the whole server blocked; `python -m bench.redis_lines_at`
    measures how the read scales, speed being a benchmark's, not a test's.)"""
    n = 16000
    with SessionStore(url) as store:
        store.append(SID, [ProgressAppended(entry=make_entry(i)) for i in range(n)])
        want = _lines_as_read(store.engine)
        got = _lines_at(store.engine, range(1, n + 1))
    assert got == want and len(got) == n


def test_a_planted_index_answers_no_other_line_than_the_log_holds(url: str) -> None:
    """An index rewritten by an outsider (seqs shifted, offsets wrong, garbage) makes
    the engine answer some lines wrongly or not at all, never fail; the reader (`seek`)
    checks each line's chain and seq, so a load and a search still agree with the log."""
    with SessionStore(url) as store:
        events = []
        for i in range(6):
            store.append(SID, [ProgressAppended(entry=make_entry(2 * i + k)) for k in range(2)])
        events = list(store.read_events(SID))
        (index,) = (k for k in _keys_of(url) if k.endswith(b":{s}:q"))
        client = _client(url)
        for planted in (["3 100", "1 5"], ["x", "y"], ["1 1 s", "2 2"]):
            client.delete(index)
            client.rpush(index, *planted, *["99 9"] * 4)
            store.engine.lines_at(SID, range(14))  # answers, or leaves out: no error
            with events_by_seq(store, SID, frozenset({"progress_appended"})) as event_at:
                assert event_at is not None
                for seq in range(1, 13):
                    assert event_at(seq) in (None, events[seq - 1])
        assert list(store.read_events(SID)) == events


_OUTSIDE_EDITS = {
    "head-deleted": lambda c, key: c.delete(key("h")),
    "log-deleted": lambda c, key: c.delete(key("l")),
    "last-append-popped": lambda c, key: c.rpop(key("l")),
    "append-pushed": lambda c, key: c.rpush(key("l"), b"{}\n"),
}


@pytest.mark.parametrize("edit", list(_OUTSIDE_EDITS))
def test_attack_no_append_builds_on_a_head_that_does_not_count_its_log(url: str, edit: str) -> None:
    """Attack: with the head hash or the live log list edited from outside (the head
    deleted, the list deleted or popped), an append went on from the head it found:
    onto the old log at seq 1 after the head was deleted, at seq 4 onto an emptied
    list, a line dropped for good, and only later reads failed. Now an append whose
    session's head does not count the live log's appends writes nothing and raises
    CorruptLogError; the log stays as the outsider left it."""
    from eventstore import CorruptLogError

    client, key = _three_appends(url)

    _OUTSIDE_EDITS[edit](client, key)
    before = client.lrange(key("l"), 0, -1), client.hgetall(key("h"))
    with SessionStore(url) as store, pytest.raises(CorruptLogError, match="from outside"):
        store.append_progress_entry(SID, make_entry(7))
    assert (client.lrange(key("l"), 0, -1), client.hgetall(key("h"))) == before


@pytest.mark.parametrize("edit", ["head-deleted", "log-deleted", "last-append-popped"])
def test_attack_no_read_answers_past_a_head_that_does_not_count_its_log(
    url: str, edit: str
) -> None:
    """Attack: with the live log list popped or deleted from outside, a cold load
    answered the lines left (two of three, or none, with the head at seq 3) and verify
    said ok: a line lost without a word; with the head deleted, the history still gave
    the old lines while loads gave none. Now every read of the live log (a cold load,
    the history, verify) checks the appends it read against the count the head keeps:
    a read raises CorruptLogError when they differ, and verify reports it."""
    from eventstore import CorruptLogError

    with SessionStore(url) as store:
        for i in range(3):
            store.append_progress_entry(SID, make_entry(i))
    _OUTSIDE_EDITS[edit](_client(url), lambda kind: f"{_prefix(url)}:{{{SID}}}:{kind}")
    with SessionStore(url) as store:
        if edit != "head-deleted":  # (no head: no session to load, nothing to count)
            with pytest.raises(CorruptLogError, match="from outside"):
                store.load_bootstrap_state(SID)
        with pytest.raises(CorruptLogError, match="from outside"):
            list(store.read_events(SID))
        report = store.verify(SID)  # reports it, as it reports every unreadable log
        assert not report.ok and "from outside" in report.problems[-1].message, report


def _compacted_twice(url: str) -> tuple[redis.Redis, Callable[[str], str]]:
    """A session with an archive (two compactions kept history) and appends after it,
    its caches kept; a client of its server and the name of its key of a kind."""
    with SessionStore(url) as store:
        for i in range(3):
            store.append_progress_entry(SID, make_entry(i))
            store.compact(SID, archive=True, force=True)
        store.append_progress_entry(SID, make_entry(3))
        store.load_bootstrap_state(SID)
    return _client(url), lambda kind: f"{_prefix(url)}:{{{SID}}}:{kind}"


@pytest.mark.parametrize("kind", ["a", "b"])
def test_attack_an_archive_without_its_bounds_is_a_typed_error_naming_the_session(
    server: str, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: the archive list (`a`) or its bounds list (`b`) deleted from outside (or
    gone apart, evicted under maxmemory) made every history read raise a bare
    ValueError ("zip() argument 2 is shorter than argument 1"): read_events, verify,
    prune_archive and follow, and the CLI printed it naming no session. Now the history
    is one unreadable segment: reads raise CorruptLogError naming the session, verify
    reports it (the CLI exits 1 naming it), and a purge clears it."""
    from eventstore import CorruptLogError

    url = fresh_redis(ttl="60")
    client, key = _compacted_twice(url)
    client.delete(key(kind))
    with SessionStore(url) as store:
        with pytest.raises(CorruptLogError, match=f"#{SID}.*archive"):
            list(store.read_events(SID))
        with pytest.raises(CorruptLogError, match=f"#{SID}.*archive"):
            store.prune_archive(SID, 3)
        with pytest.raises(CorruptLogError, match=f"#{SID}.*archive"):
            next(iter(store.follow(SID)))
        report = store.verify(SID)
        assert not report.ok and f"#{SID}" in report.problems[-1].message, report
    rc, out, _ = cli_in_process(capsys, "verify", url, SID)
    assert rc == 1 and out.startswith(f"FAILED  {SID} ") and f"#{SID}" in out
    rc, _, err = cli_in_process(capsys, "log", url, SID)
    assert rc != 0 and f"#{SID}" in err
    with SessionStore(url) as store:
        store.delete_session(SID, purge=True)
        assert [k for k in _keys_of(url) if b":{s}:" in k] == [key("w").encode()]


@pytest.mark.parametrize("kind", ["a", "b"])
def test_attack_a_delete_never_leaves_an_archive_it_cannot_pair_up(server: str, kind: str) -> None:
    """Attack: with the archive's bounds list (`b`) deleted from outside, delete_session
    (a tombstone, then the erase pruning the archive by its bounds) returned as done
    while the deleted session's archived lines stayed on the server; with the archive
    list (`a`) deleted, it failed with a StorageError quoting the prune script's Lua
    error, naming no session. Now the prune finds the two lists unpaired, drops nothing
    and raises CorruptLogError naming the session; a purge removes every key."""
    from eventstore import CorruptLogError

    url = fresh_redis(ttl="60")
    client, key = _compacted_twice(url)
    client.delete(key(kind))
    with SessionStore(url) as store:
        with pytest.raises(CorruptLogError, match=f"#{SID}.*archive"):
            store.delete_session(SID)
        engine = store.engine
        assert isinstance(engine, PruningEngine)
        with pytest.raises(CorruptLogError, match=f"#{SID}.*archive"):
            engine.prune_history(SID, 100)
        store.delete_session(SID, purge=True)
    assert [k for k in _keys_of(url) if b":{s}:" in k] == [key("w").encode()]


def test_attack_no_write_starts_a_session_over_an_archive_its_head_left(server: str) -> None:
    """Attack: a session's head and live log gone while its archive stayed (deleted from
    outside, or evicted apart under maxmemory) read as the old archive alone
    (read_events gave seqs 1..3 of a session with no head), and the next append started
    a new session at seq 1 on top of it: its history was the old archive, the new line
    hidden behind the old seq 1, and verify said ok. Now a history with an archive but
    no head is a CorruptLogError naming the session (verify reports it), an append
    there writes nothing and raises it, and a purge clears it for a fresh session."""
    from eventstore import CorruptLogError

    url = fresh_redis(ttl="60")
    client, key = _compacted_twice(url)
    client.delete(key("h"), key("l"))
    before = {k: client.dump(k) for k in _keys_of(url)}
    with SessionStore(url) as store:
        assert store.list_sessions() == [] and store.last_seq(SID) == 0
        with pytest.raises(CorruptLogError, match=f"#{SID}.*archive"):
            list(store.read_events(SID))
        with pytest.raises(CorruptLogError, match=f"#{SID}.*archive"):
            store.append_progress_entry(SID, make_entry(9))
        report = store.verify(SID)
        assert not report.ok and f"#{SID}" in report.problems[-1].message, report
    assert {k: client.dump(k) for k in _keys_of(url)} == before
    with SessionStore(url) as store:
        store.delete_session(SID, purge=True)
        store.append_progress_entry(SID, make_entry(9))
        assert [e.seq for e in store.read_events(SID)] == [1] and store.verify(SID).ok


def test_attack_a_new_session_takes_no_line_index_its_head_left(server: str) -> None:
    """Attack: a session's head and live log gone (deleted from outside, evicted) while
    its index of lines (`q`) stayed: the next session of that id found the old index
    longer than its log, so it was never extended and lines by seq answered nothing for
    the new session's whole life (or, at one length, old entries beside new ones). Now
    a session that starts afresh starts its index afresh too: every seq is answered as
    its live log holds it."""
    url = fresh_redis(ttl="60")
    client, key = _three_appends(url)
    client.delete(key("h"), key("l"))
    with SessionStore(url) as store:
        for i in range(1, 4):  # 1, 2, 3 lines
            store.append(SID, [ProgressAppended(entry=make_entry(10 * i + k)) for k in range(i)])
            want = _lines_as_read(store.engine)
            assert _lines_at(store.engine, range(store.last_seq(SID) + 2)) == want
        assert len(want) == store.last_seq(SID) == 6 and store.verify(SID).ok


@pytest.mark.parametrize("kind", ["w", "q", "c", "s"])
@pytest.mark.parametrize("write", ["append", "compact"])
def test_attack_a_write_that_meets_a_key_of_another_type_writes_nothing(
    url: str, kind: str, write: str
) -> None:
    """Attack: a key of the session (its wake stream `w`, line index `q`, caches `c`,
    saved logs `s`) replaced from outside by a string. An append failed on `w` or `q`
    after its line was pushed and its head moved (a caller that retries writes it
    twice). Every writing script checks its keys' types first: StorageError naming the
    session, and nothing written."""
    client, key = _three_appends(url)
    client.delete(key(kind))
    client.set(key(kind), "x")
    before = {k: client.dump(k) for k in client.scan_iter(match=key("*"))}
    with SessionStore(url) as store, pytest.raises(StorageError, match=f"'{SID}'.*WRONGTYPE"):
        if write == "append":
            store.append_progress_entry(SID, make_entry(3))
        else:
            store.compact(SID, force=True)
    assert {k: client.dump(k) for k in client.scan_iter(match=key("*"))} == before
    client.delete(key(kind))  # put right, the session takes writes again
    with SessionStore(url) as store:
        store.append_progress_entry(SID, make_entry(3))
        assert store.last_seq(SID) == 4 and store.verify(SID).ok


def _forge_next_batch(url: str, client: Any, key: Any) -> None:
    """Push, from outside, a batch that chains to the session's last line as an append
    would (the right seq, link and hash) without moving the head."""
    from datetime import UTC, datetime

    with SessionStore(url) as store:
        head = store.engine.head(SID)
    data, _, _ = EventCodec().encode_batch(
        [ProgressAppended(entry=make_entry(9))], head.seq + 1, head.link, datetime.now(UTC), None
    )
    client.rpush(key("l"), data)


@pytest.mark.parametrize(
    "edit", ["head-deleted", "log-deleted", "last-append-popped", "count-edited"]
)
def test_attack_verify_and_repair_never_call_a_log_its_head_does_not_count_intact(
    url: str, edit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: with the head's count of appends and the live log list made to disagree
    from outside (an append popped, the list or head deleted, the count edited), every
    read and append refused the session but `repair` said "the log is intact; nothing
    to do" (or that there was no live log), and only a purge cleared it; with the head
    deleted the CLI's verify, repair, stats and log said "unknown session" (no listing
    knows the id), and the engine's read gave an empty session, which `follow` waited
    on. Now verify reports it (the CLI too: exit 1 naming the session), the read
    refuses it, and repair, which cannot tell whether the head or the list is right,
    raises CorruptLogError naming the session and saying so, and changes nothing (the
    CLI's repair, stats, log and follow say that damage: a corrupt log, exit 2, never
    "unknown"); a purge still clears it, `eventstore delete --purge` too (it said
    "unknown session" with the head deleted)."""
    from eventstore import CorruptLogError
    from eventstore.ops import audit

    client, key = _three_appends(url)

    if edit == "count-edited":
        client.hset(key("h"), "n", 5)
    else:
        _OUTSIDE_EDITS[edit](client, key)
    before = _keys_of(url), client.lrange(key("l"), 0, -1), client.hgetall(key("h"))
    with SessionStore(url) as store:
        assert not store.verify(SID).ok
        with pytest.raises(CorruptLogError, match=f"#{SID}.*repair cannot tell"):
            audit.repair(store.core, SID)
    # (with no head, no listing knows the id: the CLI said "unknown session", exit 2,
    # where the API reports the damage; it reports what the API reports now)
    rc, out, _ = cli_in_process(capsys, "verify", url, SID)
    assert rc == 1 and out.startswith(f"FAILED  {SID} ") and f"#{SID}" in out
    with SessionStore(url) as store:
        # (with the head deleted: read as an empty session, its state empty, seq 0)
        reads = [lambda: store.engine.read(SID, None), lambda: store.load_bootstrap_state(SID)]
        if edit == "head-deleted":  # (the head itself: a head that is there is what it says)
            reads.append(lambda: store.last_seq(SID))
        for read in reads:
            with pytest.raises(CorruptLogError, match=f"#{SID}.*head"):
                read()
    for command in ("repair", "stats", "log", "follow", "state", "transcript", "export"):
        rc, _, err = cli_in_process(capsys, command, url, SID)
        assert rc == 2 and f"#{SID}: byte 0: its head counts" in err, (command, err)
        assert "repair cannot tell" in err if command == "repair" else "unknown" not in err
    for command in ("verify", "repair", "stats", "log"):
        rc, _, err = cli_in_process(capsys, command, url, "never-written")
        assert rc == 2 and "unknown session 'never-written'" in err
    assert (_keys_of(url), client.lrange(key("l"), 0, -1), client.hgetall(key("h"))) == before
    rc, out, err = cli_in_process(capsys, "delete", url, SID, "--purge")  # (not "unknown")
    assert rc == 0 and SID in out, err
    with SessionStore(url) as store:
        assert store.delete_session(SID, purge=True) is False  # (purged already)
        store.append_progress_entry(SID, make_entry(0))
        assert store.verify(SID).ok


@pytest.mark.parametrize("count", ["x", "1e3", "3.0", "-3"])
def test_attack_a_head_count_that_is_no_number_is_reported_not_a_value_error(
    url: str, count: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: the head's count of appends (`n`) edited from outside to no whole number
    made verify, repair and an append raise a bare ValueError, and a cold load a
    StorageError quoting the cache script's Lua line. Now verify reports the session
    (the CLI exits 1 naming it), repair, an append and a load raise CorruptLogError
    naming it, and nothing changes; a purge still clears it."""
    from eventstore import CorruptLogError
    from eventstore.ops import audit

    with SessionStore(url) as store:
        for i in range(3):
            store.append_progress_entry(SID, make_entry(i))
    client = _client(url)
    head = f"{_prefix(url)}:{{{SID}}}:h"
    client.hset(head, "n", count)
    before = _keys_of(url), client.lrange(head[:-1] + "l", 0, -1), client.hgetall(head)
    with SessionStore(url) as store:
        report = store.verify(SID)
        assert not report.ok and f"#{SID}" in report.problems[-1].message, report
        with pytest.raises(CorruptLogError, match=f"#{SID}"):
            audit.repair(store.core, SID)
        with pytest.raises(CorruptLogError, match=f"#{SID}"):
            store.append_progress_entry(SID, make_entry(7))
        with pytest.raises(CorruptLogError, match=f"#{SID}"):
            store.load_bootstrap_state(SID)
    rc, out, _ = cli_in_process(capsys, "verify", url, SID)
    assert rc == 1 and out.startswith(f"FAILED  {SID} ") and f"#{SID}" in out
    assert (_keys_of(url), client.lrange(head[:-1] + "l", 0, -1), client.hgetall(head)) == before
    with SessionStore(url) as store:
        store.delete_session(SID, purge=True)
        store.append_progress_entry(SID, make_entry(0))
        assert store.verify(SID).ok


@pytest.mark.parametrize("pushed", ["garbage", "a-chained-batch"])
def test_attack_repair_cuts_batches_pushed_past_the_head(url: str, pushed: str) -> None:
    """Attack: a batch pushed onto the live log list from outside, past the batches the
    head counts, left the session refused everywhere; one that chains to the last line
    as an append would (the right seq, link and hash) was even called intact by repair.
    Now, the head's own batches ending at its line, repair keeps them and cuts the rest
    (the whole original saved aside first; the pushed seq held by a `quarantined`
    record, so no number is used twice): verify is ok and appends go on."""
    from eventstore.ops import audit

    client, key = _three_appends(url)

    if pushed == "garbage":
        _OUTSIDE_EDITS["append-pushed"](client, key)
    else:
        _forge_next_batch(url, client, key)
    original = b"".join(client.lrange(key("l"), 0, -1))
    with SessionStore(url) as store:
        assert not store.verify(SID).ok
        report = audit.repair(store.core, SID)
        assert report.action == "moved_aside" and report.kept_events == 3, report
        assert report.problem is not None and report.problem.offset == report.kept_bytes
        assert report.quarantined == (4, 4)
        assert client.lrange(key("s"), 0, -1) == [original]  # saved aside whole
        assert store.verify(SID).ok
        store.append_progress_entry(SID, make_entry(3))
        assert _summaries(store) == [f"step {i}" for i in range(4)]
        assert store.verify(SID).ok


@pytest.mark.parametrize("junk", [b"x", b"{}", b"0123456789abcdefghijklm"])
def test_attack_a_cold_append_never_lands_after_a_line_too_short_to_end_one(
    url: str, junk: bytes
) -> None:
    """Attack: the live log rewritten from outside to a line too short to end with an
    `h`, then a line chained to "" as a log's first is: the read of the log's end gave
    that line the end of nothing before it, the last line checked, and a cold append
    landed on a log every fold refuses. Now the line is not read as checked: the
    append folds the log, and CorruptLogError names the session; nothing is written."""
    from datetime import UTC, datetime

    from eventstore import CorruptLogError

    with SessionStore(url) as store:
        for i in range(2):
            store.append_progress_entry(SID, make_entry(i))
        forged, _, _ = EventCodec().encode_batch(
            [ProgressAppended(entry=make_entry(9))], 2, "", datetime.now(UTC), None
        )
        corrupt(store.engine, SID, lambda _: junk + b"\n" + forged)
        before = store.engine.head(SID)
    with SessionStore(url) as store:
        with pytest.raises(CorruptLogError, match=f"#{SID}"):
            store.append_progress_entry(SID, make_entry(5))
        assert store.engine.head(SID) == before


@pytest.mark.parametrize("order", ["updated", "created", "id"])
@pytest.mark.parametrize(
    "junk", [b"", b"s", b"\xff\xfe", b"0000000000000", b"00000000000000\xff", b"a\x00b",
             b"zzzzzzzzzzzzzzs1"],
)  # fmt: skip
def test_attack_an_index_member_naming_no_session_is_passed_over_and_dropped(
    url: str, order: str, junk: bytes
) -> None:
    """Attack: a member added from outside to a set of the session index that names no
    session a store could have (empty, not UTF-8, no time before the id, a NUL) made
    every page of `sessions()` raise InvalidSessionIdError or a bare UnicodeDecodeError,
    and `rebuild_index`, the way to drop such members, raised the same. Now pages pass
    over it and write nothing, and a rebuild drops it."""
    with SessionStore(url) as store:
        for i in range(3):
            store.append_progress_entry(f"s{i}", make_entry(i))
    client = _client(url)
    zkey = f"{_prefix(url)}:ix:{order[0] if order != 'id' else 'i'}"
    client.zadd(zkey, {junk: 0})
    with SessionStore(url) as store:
        for limit in (None, 1, 2):
            page = store.sessions(order=order, limit=limit)
            assert len(page) == (3 if limit is None else limit)
        assert client.zscore(zkey, junk) is not None  # a page writes nothing
        assert store.rebuild_index() == 3
        assert client.zscore(zkey, junk) is None
        assert sorted(e.session_id for e in store.sessions(order=order)) == ["s0", "s1", "s2"]


def test_attack_repair_never_cuts_appends_a_head_taken_back_still_sizes(url: str) -> None:
    """Attack: the head's count, seq, h and link taken back from outside to an older
    append's (its size left counting the whole list) made the later, acknowledged
    appends read as batches pushed past the head, and repair cut them. The head's own
    size says the list is its log: repair cannot tell which is right and changes
    nothing (CorruptLogError naming the session)."""
    from eventstore import CorruptLogError
    from eventstore.ops import audit

    client = _client(url)
    head = f"{_prefix(url)}:{{{SID}}}:h"
    with SessionStore(url) as store:
        for i in range(5):
            store.append_progress_entry(SID, make_entry(i))
            if i == 1:
                older = client.hmget(head, ["n", "seq", "hh", "link"])
    client.hset(head, mapping=dict(zip(["n", "seq", "hh", "link"], older, strict=True)))
    before = _keys_of(url), client.lrange(head[:-1] + "l", 0, -1), client.hgetall(head)
    with SessionStore(url) as store:
        assert not store.verify(SID).ok
        with pytest.raises(CorruptLogError, match=f"#{SID}.*repair cannot tell"):
            audit.repair(store.core, SID)
    assert (_keys_of(url), client.lrange(head[:-1] + "l", 0, -1), client.hgetall(head)) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [("seq", "x"), ("seq", "-1"), ("seq", "1e3"), ("seq", "5"), ("seq", "2"),
     ("link", "x"), ("hh", "0123456789abcdef"), ("base", "x")],
)  # fmt: skip
def test_attack_a_head_edited_from_outside_is_never_built_on(
    url: str, field: str, value: str
) -> None:
    """Attack: a field of the head hash edited from outside: one that is no number made
    loads raise a bare ValueError; another seq or link was taken as the session's end,
    and the next append built on it (seq 0 after seq=-1, seq 6 onto a log ending at 3,
    a second seq 3, a line chained to "x"), corrupting a log that was whole. Now a read
    checks the head against the live log's last line (seq, h, link) as PostgreSQL's
    does, and a field that is no number is CorruptLogError too: no append lands (a
    cold write's last line is taken alone only when the head's link is its h)."""
    from eventstore import CorruptLogError

    with SessionStore(url) as store:
        for i in range(3):
            store.append_progress_entry(SID, make_entry(i))
    client = _client(url)
    log = f"{_prefix(url)}:{{{SID}}}:l"
    client.hset(f"{_prefix(url)}:{{{SID}}}:h", field, value)
    before = client.lrange(log, 0, -1)
    with SessionStore(url) as store:
        with pytest.raises(CorruptLogError):
            store.load_bootstrap_state(SID)
        with pytest.raises(EventStoreError):  # (or the read script's own error)
            store.append_progress_entry(SID, make_entry(7))
    assert client.lrange(log, 0, -1) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [("cr", "when-7f3a"), ("up", "12.5"), ("lb", "{not json 7f3a"), ("lb", '{"a": 17}')],
)
def test_attack_session_index_fields_edited_from_outside_are_a_typed_error(
    url: str, field: str, value: str
) -> None:
    """Attack: a session's index fields in its head hash (`cr`, `up`: times; `lb`: its
    labels as JSON) edited from outside made a page of `sessions()` raise a bare
    ValueError or msgspec's DecodeError. Now it is CorruptLogError naming the session
    (the fields' values are not quoted); nothing is written, and the other fields and
    the log are left as the outsider left them."""
    from eventstore import CorruptLogError

    with SessionStore(url) as store:
        for i in range(2):
            store.append_progress_entry(SID, make_entry(i))
        store.append_progress_entry("other", make_entry(0))
    client = _client(url)
    head = f"{_prefix(url)}:{{{SID}}}:h"
    client.hset(head, field, value)
    before = (client.hgetall(head), client.lrange(f"{_prefix(url)}:{{{SID}}}:l", 0, -1))
    with SessionStore(url) as store:
        with pytest.raises(CorruptLogError, match=f"#{SID}") as raised:
            store.sessions(order="id")
        assert value not in str(raised.value)
    assert (client.hgetall(head), client.lrange(f"{_prefix(url)}:{{{SID}}}:l", 0, -1)) == before


@pytest.mark.parametrize(
    ("field", "value"), [("cr", "when-7f3a"), ("cr", "12.5"), ("up", "x"), ("up", "")]
)
def test_attack_session_index_times_edited_from_outside_refuse_appends_typed(
    url: str, field: str, value: str
) -> None:
    """Attack: a session's index time (`cr`, `up`) edited from outside to no number
    made every append a StorageError quoting the append script's Lua line. Now the
    append is CorruptLogError naming the session, writes nothing (the head, the log and
    the index's sets as the outsider left them), and a purge still removes the session."""
    from eventstore import CorruptLogError

    with SessionStore(url) as store:
        for i in range(2):
            store.append_progress_entry(SID, make_entry(i))
    client = _client(url)
    head = f"{_prefix(url)}:{{{SID}}}:h"
    client.hset(head, field, value)

    def state() -> Any:
        return (
            client.hgetall(head),
            client.lrange(f"{_prefix(url)}:{{{SID}}}:l", 0, -1),
            [client.zrange(f"{_prefix(url)}:ix:{k}", 0, -1) for k in "uci"],
        )

    before = state()
    with SessionStore(url) as store:
        with pytest.raises(CorruptLogError, match=f"#{SID}.*from outside") as raised:
            store.append_progress_entry(SID, make_entry(7))
        assert "lua" not in str(raised.value).lower()
        assert state() == before
        store.delete_session(SID, purge=True)
        assert not client.exists(head)


# -- connections killed mid-append and mid-follow ----------------------------------------------


def _killer(
    server: str,
    name: str,
    stop: threading.Event,
    every: float,
    pause: bool = False,
    held: list[int] | None = None,
) -> threading.Thread:
    """A thread that kills every connection of client `name` each `every` seconds (with
    `pause`, while the server holds writes back: so a kill finds an append in flight,
    counted in `held`)."""
    client = redis.Redis.from_url(server)

    def run() -> None:
        while not stop.is_set():
            if pause:
                client.client_pause(20, all=False)
                time.sleep(0.005)
            for c in client.client_list():
                if c.get("name") == name:
                    try:
                        client.client_kill_filter(_id=c["id"])
                    except redis.ResponseError:
                        continue  # already gone
                    if held is not None and "b" in c["flags"] and c["cmd"] == "evalsha":
                        held.append(1)  # an append the pause held: killed unexecuted
            stop.wait(every)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


N_KILLED = 40  # appends under the killer: more add run time, not cases


@pytest.mark.timeout(120)
def test_client_kill_mid_append_a_keyed_retry_lands_once(server: str) -> None:
    # an append whose reply was lost, sent again as is: the script knows its own batch
    engine = open_engine(fresh_redis())
    head = EngineConformance().append(engine, 2)
    data, stamped, link = EventCodec().encode_batch(
        [ProgressAppended(entry=make_entry(3))],
        head.seq + 1,
        head.link,
        make_entry(0).created_at,
        "k",
    )
    batch = EncodedBatch(data, 3, 3, tuple(e.h for e in stamped), link, "k")
    first = engine.append(SID, batch, head)
    assert engine.append(SID, batch, head) == first  # landed once, answered twice
    assert engine.read(SID, None).data.count(b"\n") == 3
    engine.close()
    # and through the session API, with the connection killed again and again
    url = fresh_redis(client_name="victim")
    stop = threading.Event()
    # every 20 ms: the 20 ms pause lifts between kills (at 10 ms, each pause began before
    # the last ended: writes were held ~97% of the time, and whether any append landed
    # hung on the killer thread running late)
    held: list[int] = []
    killer = _killer(server, "victim", stop, 0.02, pause=True, held=held)
    retries = 0
    n = 0  # appends go on until the kills found enough of them in flight (a loaded machine)
    try:
        with SessionStore(url) as store:
            while n < N_KILLED or (len(held) < N_KILLED // 4 and n < 10 * N_KILLED):
                i, n = n, n + 1
                while True:
                    try:
                        store.append(
                            SID, [ProgressAppended(entry=make_entry(i))], idempotency_key=f"k{i}"
                        )
                        break
                    except StorageError as exc:
                        assert "may or may not" in str(exc) or "failed" in str(exc)
                        retries += 1
    finally:
        stop.set()
        killer.join()
    with SessionStore(url) as store:
        assert _summaries(store) == [f"step {i}" for i in range(n)]
        assert [e.seq for e in store.read_events(SID)] == list(range(1, n + 1))
        assert store.verify(SID).ok
        (info,) = store.sessions()  # a batch sent again is indexed once
        assert (info.session_id, info.last_seq, info.events) == (SID, n, n)
    assert _index_members(url) == 3
    assert len(held) >= N_KILLED // 4, held  # the kills did find appends in flight


def test_a_write_pause_holds_no_read_and_a_killed_append_lands_once(server: str) -> None:
    # CLIENT PAUSE WRITE (what FAILOVER does) holds scripts back unless they are read-only:
    # a read goes through, and an append held by it and killed twice is sent again until
    # the pause lifts, then lands once, with no error
    url = fresh_redis(client_name="paused")
    admin = _client(server)
    with SessionStore(url) as store:
        store.append_progress_entry(SID, make_entry(0))
        done: list[object] = []

        def append() -> None:
            try:
                store.append(SID, [ProgressAppended(entry=make_entry(1))], idempotency_key="k")
                done.append("ok")
            except BaseException as exc:  # reported below
                done.append(exc)

        admin.client_pause(60_000, all=False)
        try:
            read: list[list[str]] = []

            def cold_read() -> None:
                with SessionStore(fresh_redis_same(url)) as reader:
                    read.append(_summaries(reader))

            reader = threading.Thread(target=cold_read, daemon=True)
            reader.start()
            reader.join(10)
            assert read == [["step 0"]]  # not held back by the pause
            writer = threading.Thread(target=append)
            writer.start()
            for _ in range(2):
                time.sleep(0.3)
                for c in admin.client_list():
                    if c.get("name") == "paused" and c.get("cmd") == "evalsha":
                        admin.client_kill_filter(_id=c["id"])
            assert not done  # still held: nothing can have landed
        finally:
            admin.client_unpause()
        writer.join(30)
        assert done == ["ok"]
    with SessionStore(url) as store:
        assert _summaries(store) == ["step 0", "step 1"]
        assert [e.seq for e in store.read_events(SID)] == [1, 2]


def test_follow_across_killed_connections_misses_and_repeats_nothing(server: str) -> None:
    url = fresh_redis(client_name="follower")
    seen: list[int] = []
    stop_follow, stop_kill = threading.Event(), threading.Event()
    ready = threading.Event()

    def follow() -> None:
        with SessionStore(url) as s:
            ready.set()
            for ev in s.follow(SID, poll_interval=0.5, stop=stop_follow):
                seen.append(ev.seq)
                if ev.seq >= 60:
                    stop_follow.set()

    t = threading.Thread(target=follow)
    t.start()
    ready.wait()
    killer = _killer(server, "follower", stop_kill, 0.05)
    try:
        with SessionStore(fresh_redis_same(url)) as w:
            for i in range(60):
                w.append_progress_entry(SID, make_entry(i))
                if i % 20 == 19:
                    w.compact(SID, force=True)
                time.sleep(0.005)
        t.join(60)
    finally:
        stop_kill.set()
        killer.join()
        stop_follow.set()
    assert not t.is_alive()
    assert seen == list(range(1, 61))


def fresh_redis_same(url: str) -> str:
    """The same store as `url` without its client name (another client of it)."""
    for name in ("follower", "victim", "paused"):
        url = url.replace(f"&client_name={name}", "")
    return url


# -- passwords ---------------------------------------------------------------------------------


# 15 examples: each opens four stores, one against a closed port (three tries)
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(password=st.text(st.characters(codec="ascii", exclude_characters="\x00"), min_size=4))
def test_a_password_appears_in_no_error(server: str, password: str) -> None:
    # a marker around the drawn text: a password such as "None" or "redis" is in many a
    # message for reasons of its own
    password = f"Pw{password}wP"
    host = server.split("://")[1].split("/")[0]
    closed = _free_port()
    urls = [
        f"redis://u:{quote(password, safe='')}@{host}/0",  # a server without that password
        f"redis://:{quote(password, safe='')}@127.0.0.1:{closed}/0",  # nobody listening
        f"redis://{host}/0?password={quote(password, safe='')}&prefix=bad%20prefix",
        f"redis://:{quote(password, safe='')}@{host}/0?ttl=-3",
    ]
    for url in urls:
        with pytest.raises(EventStoreError) as info:
            SessionStore(url)
        text = f"{info.value} {info.value!r}"
        assert password not in text and quote(password, safe="") not in text, text


def test_the_cli_shows_a_redis_url_without_its_password(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    host = server.split("://")[1].split("/")[0]
    rc, out, err = cli_in_process(capsys, "sessions", f"redis://app:s3cr3t-pw@{host}/0")
    assert rc != 0 and "s3cr3t-pw" not in out + err and "***" in err


# -- processes ---------------------------------------------------------------------------------


def _writer(url: str, k: int, n: int) -> None:
    with SessionStore(url) as s:
        for i in range(n):
            s.append_progress_entry(SID, make_entry(i, run_id=f"p{k}"))
    os._exit(0)


@pytest.mark.slow
def test_four_processes_append_200_each_to_one_session(url: str) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(url, k, 200)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    with SessionStore(url) as store:
        assert [e.seq for e in store.read_events(SID)] == list(range(1, 801))
        assert store.verify(SID).ok
        entries = store.load_bootstrap_state(SID).recent_progress
        for k in range(4):
            assert [e.summary for e in entries if e.run_id == f"p{k}"] == [
                f"step {i}" for i in range(200)
            ]


def _acking_writer(url: str, k: int, acks: str, durability: str = "flush") -> None:
    """Append keyed entries until killed, writing each key to `acks` once acknowledged."""
    fd = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with SessionStore(url, durability=durability) as s:  # type: ignore[arg-type]
        i = 0
        while True:
            key = f"p{k}-{i}"
            try:
                s.append(
                    SID, [ProgressAppended(entry=make_entry(i, run_id=key))], idempotency_key=key
                )
            except StorageError:
                time.sleep(0.02)  # the server is away: the same key again
                continue
            os.write(fd, f"{key}\n".encode())
            i += 1


def _landed(url: str) -> list[str]:
    with SessionStore(url) as store:
        assert store.verify(SID).ok
        return [e.run_id for e in store.load_bootstrap_state(SID).recent_progress]


@pytest.mark.slow
def test_sigkill_of_writers_mid_append_loses_no_acknowledged_append(
    url: str, tmp_path: Path
) -> None:
    acks = str(tmp_path / "acks")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_acking_writer, args=(url, k, acks)) for k in range(3)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if os.path.exists(acks) and len(Path(acks).read_text().split()) >= 150:
            break
        time.sleep(0.05)
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    acked = Path(acks).read_text().split()
    landed = _landed(url)
    assert len(landed) == len(set(landed)), "an append landed twice"
    assert set(acked) <= set(landed), "an acknowledged append was lost"
    assert len(acked) >= 150
    with SessionStore(url) as store:  # the index agrees with the logs, every session once
        infos = store.sessions(order="id")
        assert [i.session_id for i in infos] == store.list_sessions()
        assert all(i.last_seq == store.last_seq(i.session_id) for i in infos)
        assert _index_members(url) == 3 * len(infos)


# -- a server killed and restarted from its AOF ------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnServer:
    """A redis-server of the test's own (AOF on, `appendfsync always`), killable and
    restartable on the same port and directory."""

    def __init__(self, workdir: Path) -> None:
        binary = os.environ.get("EVENTSTORE_TEST_REDIS_SERVER") or shutil.which("redis-server")
        if binary is None:
            require_redis_url()  # skips, or fails in CI
            pytest.skip("no redis-server binary")
        self.binary = binary
        self.dir = workdir
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
             str(self.dir), "--save", "", "--appendonly", "yes", "--appendfsync", "always"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis.from_url(self.url)
        for _ in range(200):
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise AssertionError("the test's redis-server did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[OwnServer]:
    server = OwnServer(tmp_path)
    yield server
    server.stop()


@pytest.mark.slow
def test_a_server_killed_and_restarted_from_its_aof_loses_nothing_acknowledged_under_fsync(
    own_server: OwnServer, tmp_path: Path
) -> None:
    acks = str(tmp_path / "acks")
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_acking_writer, args=(own_server.url, k, acks, "fsync"))
        for k in range(2)
    ]
    for p in procs:
        p.start()
    try:
        for round_ in range(2):
            want = 60 * (round_ + 1)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if os.path.exists(acks) and len(Path(acks).read_text().split()) >= want:
                    break
                time.sleep(0.02)
            with SessionStore(own_server.url) as s:
                before = s.feed(limit=100_000)
            own_server.kill()  # SIGKILL: only what reached the AOF survives
            acked = Path(acks).read_text().split()
            own_server.start()
            with SessionStore(own_server.url) as s:
                # the feed's positions survive the restart: the same entries, in order
                assert s.feed(limit=len(before)) == before
                landed = _landed(own_server.url)
                assert set(acked) <= set(landed), "an append acknowledged under fsync was lost"
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.join(10)
    acked = Path(acks).read_text().split()
    landed = _landed(own_server.url)
    assert len(landed) == len(set(landed)) and set(acked) <= set(landed)
    with SessionStore(own_server.url) as s:
        positions = [pos for pos, _, _ in s.feed(limit=100_000)]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        assert len(positions) == len(landed)


def test_attack_a_feed_reader_behind_a_trim_is_told_never_skipped(server: str) -> None:
    """Attack: with `feed_maxlen`, a reader whose position fell behind the feed's trim
    got the lines still kept after it as if they came next: the lines trimmed between
    (another session's 275 appends) were skipped without a word. Now such a read gives
    the lines up to the gap, then raises HistoryUnavailableError; a reader that kept up,
    or one reading from the start (what the feed keeps), reads on as before."""
    from eventstore import HistoryUnavailableError

    with SessionStore(fresh_redis(feed_maxlen="10")) as store:
        for i in range(3):
            store.append_progress_entry(SID, make_entry(i))
        behind = store.feed(limit=1)[0][0]
        kept_up, seen = store.feed()[-1][0], []
        for i in range(300):  # trimmed in whole nodes of the stream: a hundred at a time
            store.append_progress_entry("other", make_entry(i))
            if i % 5 == 4:  # (`~`: at least the newest 10 are kept)
                got = store.feed(after=kept_up)
                kept_up, seen = got[-1][0], seen + [e.seq for _, _, e in got]
        assert seen == list(range(1, 301))
        with pytest.raises(HistoryUnavailableError, match="trimmed"):
            store.feed(after=behind)
        oldest = store.feed(limit=10_000)  # from the start: what the feed keeps
        assert oldest[-1][2].seq == 300 and oldest[0][1:] != (SID, 1)


def test_the_engine_is_opened_by_url_and_options(url: str) -> None:
    from eventstore.engines.redis import RedisEngine, RedisFeedEngine

    engine = open_engine(url)
    assert isinstance(engine, RedisFeedEngine)
    engine.close()
    engine = open_engine(url + "&feed=0", ttl=30)
    assert isinstance(engine, RedisEngine) and not isinstance(engine, RedisFeedEngine)
    with SessionStore(engine) as store:
        store.append_progress_entry(SID, make_entry(1))
        with pytest.raises(NotImplementedError):
            store.feed()
    with pytest.raises(EventStoreError):
        open_engine(url, ttl=-1)
    with pytest.raises(EventStoreError):
        open_engine(url, bogus=1)


def test_a_unix_socket_url_opens_the_same_store(url: str) -> None:
    sock = os.environ.get("EVENTSTORE_TEST_REDIS_SOCKET")
    if not sock:
        pytest.skip("EVENTSTORE_TEST_REDIS_SOCKET is not set (.ci/start-redis.sh sets it)")
    prefix = url.split("prefix=")[1]
    with SessionStore(url) as tcp, SessionStore(f"unix://{sock}?db=0&prefix={prefix}") as unix:
        tcp.append_progress_entry(SID, make_entry(1))
        assert _summaries(unix) == ["step 1"]
        assert unix.url.startswith("unix://")

"""Writers exclude each other across processes and threads: no lost, duplicated or
reordered appends; exactly one initializer wins a race; readers never see a torn batch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from conftest import (
    in_forked_child,
    log_path,
    make_entry,
    make_features,
    make_manifest,
    run_threads,
    wait_child,
)

from eventstore import (
    Message,
    ProgressEntry,
    Role,
    SessionStore,
)
from eventstore.errors import EventStoreError, StoreClosedError
from eventstore.format.chain import line_hash, split_hash
from eventstore.format.events import (
    Event,
    MessagesAppended,
    ProgressAppended,
)
from eventstore.store import AppendResult
from projections.base import StructProjection

WORKERS = 4
PER_WORKER = 250
ROUNDS = 5
TIMEOUT = 120.0

# Each worker signals it is ready (a file), then waits for the "go" file: they all start
# together. Polling a file is only a start gate; no result depends on timing.
WORKER = textwrap.dedent(
    """
    import json, sys, time
    from datetime import UTC, datetime
    from pathlib import Path
    from eventstore import FeatureRecord, ProgressEntry, SessionManifest, SessionStore

    mode, root, wid, gate = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])

    def wait(name):
        (gate / f"ready-{name}-{wid}").touch()
        while not (gate / f"go-{name}").exists():
            time.sleep(0.0005)

    store = SessionStore(root)
    results = []
    if mode == "append":
        wait("append")
        for n in range(int(sys.argv[5])):
            store.append_progress_entry(
                "shared",
                ProgressEntry(run_id=f"w{wid}", summary=str(n), created_at=datetime.now(UTC)),
            )
    else:
        for r in range(int(sys.argv[5])):
            store = SessionStore(root)  # a fresh process view each round
            wait(str(r))
            results.append(store.initialize_session_if_missing(
                f"race-{r}",
                SessionManifest(session_id=f"race-{r}", active_branch="main",
                                current_objective=f"worker {wid}"),
                [FeatureRecord(id=f"w{wid}", category="c", description="d", steps=[],
                               passes=False)],
                ProgressEntry(run_id=f"w{wid}", summary="init"),
            ))
    print(json.dumps(results))
    """
)


def _spawn(mode: str, root: Path, gate: Path, n: int) -> list[subprocess.Popen[str]]:
    gate.mkdir(exist_ok=True)
    return [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, mode, str(root), str(w), str(gate), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(WORKERS)
    ]


def _open_gate(gate: Path, name: str, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not all((gate / f"ready-{name}-{w}").exists() for w in range(WORKERS)):
        for p in procs:
            assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "workers never got ready"
        time.sleep(0.002)
    (gate / f"go-{name}").touch()


def _finish(procs: list[subprocess.Popen[str]]) -> list[list[bool]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _check_chain(data: bytes) -> list[dict[str, object]]:
    """Parse every line; the hash chain links each line to its predecessor."""
    link = ""
    rows = []
    for line in data.splitlines():
        split = split_hash(line)
        assert split is not None
        body, h = split
        assert line_hash(link, body) == h
        link = h
        rows.append(json.loads(line))
    return rows


def test_four_processes_append_1000_entries(tmp_path: Path) -> None:
    """4 processes x 250 appends to one session: 1,000 lines, seq 1..1000 with no gap or
    duplicate, an unbroken hash chain, each process's entries in its own order; a reader
    polling meanwhile only ever sees a growing prefix of the final list."""
    root = tmp_path / "store"
    procs = _spawn("append", root, tmp_path / "gate", PER_WORKER)
    _open_gate(tmp_path / "gate", "append", procs)
    reader = SessionStore(root)
    seen: list[ProgressEntry] = []
    loads = 0
    while any(p.poll() is None for p in procs):
        now = reader.load_bootstrap_state("shared").recent_progress
        assert now[: len(seen)] == seen
        seen = now
        loads += 1
    _finish(procs)
    total = WORKERS * PER_WORKER
    rows = _check_chain(log_path(root, "shared").read_bytes())
    assert [r["seq"] for r in rows] == list(range(1, total + 1))
    assert all("more" not in r for r in rows)
    for w in range(WORKERS):
        mine = [r["entry"]["summary"] for r in rows if r["entry"]["run_id"] == f"w{w}"]
        assert mine == [str(n) for n in range(PER_WORKER)]
    final = SessionStore(root).load_bootstrap_state("shared").recent_progress
    assert len(final) == total
    assert final[: len(seen)] == seen
    # the reader that followed along agrees with a fresh one
    assert reader.load_bootstrap_state("shared").recent_progress == final
    assert reader.last_seq("shared") == total
    assert loads >= 1


def test_four_processes_race_to_initialize(tmp_path: Path) -> None:
    """4 processes call initialize_session_if_missing on a fresh session at once, for
    several rounds: exactly one True per round, and the log holds that one init batch."""
    root = tmp_path / "store"
    gate = tmp_path / "gate"
    procs = _spawn("init", root, gate, ROUNDS)
    for r in range(ROUNDS):
        _open_gate(gate, str(r), procs)
    results = _finish(procs)
    store = SessionStore(root)
    for r in range(ROUNDS):
        wins = [w for w in range(WORKERS) if results[w][r]]
        assert len(wins) == 1, (r, results)
        state = store.load_bootstrap_state(f"race-{r}")
        assert state.manifest is not None
        assert state.manifest.current_objective == f"worker {wins[0]}"
        assert [f.id for f in state.feature_list] == [f"w{wins[0]}"]
        assert [e.run_id for e in state.recent_progress] == [f"w{wins[0]}"]
        assert store.last_seq(f"race-{r}") == 3
        rows = _check_chain(log_path(root, f"race-{r}").read_bytes())
        assert [r_["seq"] for r_ in rows] == [1, 2, 3]


def test_threads_share_one_store(tmp_path: Path) -> None:
    """8 threads appending through one SessionStore (and 2 through a second instance on the
    same root): every entry once, in each thread's order, seq without gaps."""
    root = tmp_path / "store"
    shared = SessionStore(root)
    other = SessionStore(root)
    per = 60
    barrier = threading.Barrier(10)

    def work(i: int) -> None:
        store = shared if i < 8 else other
        barrier.wait()
        for n in range(per):
            store.append_progress_entry("t", make_entry(n, run_id=f"t{i}"))
            if n % 20 == 0:
                store.load_bootstrap_state("t")

    assert run_threads([partial(work, i) for i in range(10)], TIMEOUT) == []
    for store in (shared, other, SessionStore(root)):
        entries = store.load_bootstrap_state("t").recent_progress
        assert len(entries) == 10 * per
        for i in range(10):
            mine = [e.summary for e in entries if e.run_id == f"t{i}"]
            assert mine == [f"step {n}" for n in range(per)]
        assert store.last_seq("t") == 10 * per
    rows = _check_chain(log_path(root, "t").read_bytes())
    assert [r["seq"] for r in rows] == list(range(1, 10 * per + 1))


def test_threads_race_to_initialize(tmp_path: Path) -> None:
    """8 threads on one store race initialize_session_if_missing: exactly one True."""
    store = SessionStore(tmp_path / "store")
    for r in range(ROUNDS):
        barrier = threading.Barrier(8)
        results: dict[int, bool] = {}

        def work(
            i: int,
            r: int = r,
            barrier: threading.Barrier = barrier,
            results: dict[int, bool] = results,
        ) -> None:
            barrier.wait()
            results[i] = store.initialize_session_if_missing(
                f"r{r}", make_manifest(f"r{r}", current_objective=str(i)), make_features(i + 1)
            )

        assert run_threads([partial(work, i) for i in range(8)], TIMEOUT) == []
        winners = [i for i, won in results.items() if won]
        assert len(results) == 8 and len(winners) == 1
        state = SessionStore(store.root).load_bootstrap_state(f"r{r}")
        assert state.manifest is not None
        assert state.manifest.current_objective == str(winners[0])
        assert len(state.feature_list) == winners[0] + 1
        assert store.last_seq(f"r{r}") == 2


def _append_in_child(root: Path, durability: str, summaries: list[str], gate: int) -> int:
    """Fork a process that waits for a byte on `gate`, then appends `summaries` one by one
    to "shared" through a store of its own; returns its pid (exit 0: all acknowledged)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.read(gate, 1)
            with SessionStore(root, durability) as s:  # type: ignore[arg-type]
                for text in summaries:
                    s.append_progress_entry("shared", ProgressEntry("child", text))
            code = 0
        finally:
            os._exit(code)
    return pid


@pytest.mark.parametrize("durability", ["flush", "fsync"])
@pytest.mark.parametrize("how", ["rmtree", "rename", "rename-without-proc", "lock-hardlink"])
def test_a_cached_lock_excludes_after_the_session_dir_is_removed_and_recreated(
    tmp_path: Path, how: str, durability: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 item 2: a long-lived store keeps its lock descriptor between appends. The
    session directory is removed by hand (`rm -rf`, or renamed away) and recreated by
    another process; the old lock file's generation never moved, so the fast path
    "locked" an unlinked file and appended beside the process holding the real lock (a
    duplicated seq, a broken chain). Both now append at once: the log verifies, and
    every acknowledged append is in it exactly once. (Without /proc, where no kernel
    says where a descriptor points, the lock path is stat-ed instead.) Attacked: the new
    directory's lock file a hard link of the old one (`lock-hardlink`): the cached lock
    is still the file at the lock path, and the cached log, renamed away, is not."""
    if how == "rename-without-proc":

        def no_proc(path: object, *a: object, **k: object) -> str:
            raise FileNotFoundError(path)

        monkeypatch.setattr(os, "readlink", no_proc)
    root = tmp_path / "store"
    store = SessionStore(root, durability)  # type: ignore[arg-type]
    for i in range(3):
        store.append_progress_entry("shared", ProgressEntry("parent", f"old{i}"))
    session_dir = log_path(root, "shared").parent
    if how == "rmtree":
        shutil.rmtree(session_dir)
    elif how == "lock-hardlink":
        old = session_dir.with_name("moved-away")
        os.rename(session_dir, old)
        os.mkdir(session_dir, 0o700)
        os.link(old / "log.lock", session_dir / "log.lock")
    else:
        os.rename(session_dir, session_dir.with_name("moved-away"))

    def recreate() -> None:
        with SessionStore(root, durability) as s:  # type: ignore[arg-type]
            s.append_progress_entry("shared", ProgressEntry("child", "first"))

    assert in_forked_child(recreate, 60) == 0
    n = 150 if durability == "flush" else 60
    r, w = os.pipe()
    pids = [_append_in_child(root, durability, [f"c{k}-{i}" for i in range(n)], r) for k in (0, 1)]
    os.write(w, b"gg")
    acked = ["first"]
    try:
        for i in range(n):
            store.append_progress_entry("shared", ProgressEntry("parent", f"p{i}"))
            acked.append(f"p{i}")
    finally:
        codes = [wait_child(pid, 120) for pid in pids]
        os.close(r)
        os.close(w)
        store.close()
    assert codes == [0, 0]
    acked += [f"c{k}-{i}" for k in (0, 1) for i in range(n)]
    with SessionStore(root) as fresh:
        report = fresh.verify("shared")
        assert report.ok, report
        got = [
            e.entry.summary for e in fresh.read_events("shared") if isinstance(e, ProgressAppended)
        ]
    assert sorted(got) == sorted(acked)


def test_no_lock_is_held_after_a_failed_write(tmp_path: Path) -> None:
    """A write that raises inside the lock (unknown feature) releases it: a write from
    another process right after succeeds."""
    root = tmp_path / "store"
    store = SessionStore(root)
    store.initialize_session_if_missing("s", make_manifest("s"), make_features())
    try:
        store.update_feature_pass("s", "missing", True)
    except KeyError:
        pass
    code = (
        "import sys; from eventstore import SessionStore, ProgressEntry;"
        "SessionStore(sys.argv[1]).append_progress_entry("
        "'s', ProgressEntry(run_id='x', summary='y'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    assert store.last_seq("s") == 3
    assert os.path.getsize(log_path(root, "s")) > 0


class _SlowCopy(StructProjection[list[str]]):
    """Progress summaries, with a fold step and a copy slow enough that the GIL passes
    to the other thread in the middle of them (as a long fold or copy can)."""

    name = "slow_copy"
    version = 1
    event_types = frozenset({"progress_appended"})
    state_type = list[str]

    def initial(self) -> list[str]:
        return []

    def apply(self, state: list[str], event: Event) -> list[str]:
        if isinstance(event, ProgressAppended):
            time.sleep(0.0002)
            state.append(event.entry.summary)
        return state

    def copy(self, state: list[str]) -> list[str]:
        time.sleep(0.0005)
        return list(state)


def test_a_load_in_one_thread_never_holds_part_of_a_batch_another_appends(
    tmp_path: Path,
) -> None:
    # a writer folds its batch into the cached state in place: a load that copied that
    # state after releasing the session's lock returned 285 of 300 states cut mid-batch
    store = SessionStore(tmp_path, projections=[_SlowCopy()])
    torn: list[list[str]] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            for state in (
                store.load("s", "slow_copy"),
                [m.content for m in store.load_transcript_messages("s", start=0)],
            ):
                if len(state) % 2:
                    torn.append(state)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(100):
            entries = [make_entry(2 * i), make_entry(2 * i + 1)]
            store.append("s", [ProgressAppended(entry=e) for e in entries])
            texts = [f"{i}a", f"{i}b"]
            store.append("s", [MessagesAppended(messages=[Message(Role.USER, t)]) for t in texts])
    finally:
        done.set()
        reader.join(TIMEOUT)
    assert not reader.is_alive()
    assert torn == []
    assert len(store.load("s", "slow_copy")) == 200
    store.close()


# -- attacks: threads sharing one store instance --------------------------------------------
#
# Whole batches in every load, idempotent retries, compaction / close / session eviction
# beside live callers, and only `EventStoreError`s.


@pytest.mark.usefixtures("fast_switches")
def test_concurrent_cold_last_pages_raise_nothing_but_event_store_errors(tmp_path: Path) -> None:
    """Cold `load_transcript_messages(sid, last=N)` pages of a compacted log cut the
    newest messages from the snapshot line, remembering per session (lock-free) the
    digests of the blocks a cut checked (`_Session.checked_snapshots`). A later, longer
    cut finds the entry, needs a block it does not hold (`_Unproven`) and deletes the
    entry with `del checked_snapshots[h]`: two threads doing that at once, the second
    `del` raises KeyError out of the load (about 95 of 100 pages here)."""
    sid = "s"
    with SessionStore(tmp_path) as s:
        s.append_transcript_messages(
            sid, [Message(Role.USER, f"m{i} " + "x" * 200) for i in range(2000)]
        )
        assert s.compact(sid, force=True).compacted  # the transcript lives in the snapshot
        expected = s.load_transcript_messages(sid)[-1500:]
    failures: list[BaseException] = []
    pages: list[list[Message]] = []
    for _ in range(10):
        store = SessionStore(tmp_path)  # cold: the transcript is never folded here
        try:
            # a short cut checks the snapshot line whole and remembers its last blocks
            assert store.load_transcript_messages(sid, last=1) == expected[-1:]

            def page(store: SessionStore = store) -> None:
                pages.append(store.load_transcript_messages(sid, last=1500))

            failures += run_threads([page] * 6)
        finally:
            store.close()
    wrong = [repr(e) for e in failures if not isinstance(e, EventStoreError)]
    assert not wrong, f"{len(wrong)} of 60 pages raised {wrong[:2]}"
    assert all(p == expected for p in pages)


def _batch(*summaries: str) -> list[Event]:
    return [ProgressAppended(entry=ProgressEntry("r", s)) for s in summaries]


@pytest.mark.usefixtures("fast_switches")
@pytest.mark.parametrize("engine", ["file", "memory"])
def test_loads_pages_and_history_beside_writers_and_a_compactor_see_whole_batches(
    tmp_path: Path, engine: str
) -> None:
    """Two threads append 3-event batches (two progress entries and a message), one
    compacts in a loop, two load (bootstrap, transcript, a warm page) and one reads
    the history: every load holds whole batches, grows monotonically and never holds
    an entry twice; read_events yields 1..N, each once, ending on a closed batch."""
    store = SessionStore(tmp_path if engine == "file" else "memory://")
    sid = "s"
    stop = threading.Event()
    problems: list[object] = []

    def writer(w: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(150):
                store.append(
                    sid,
                    [
                        *_batch(f"w{w}b{i}-0", f"w{w}b{i}-1"),
                        MessagesAppended(messages=[Message(Role.USER, f"w{w}b{i}")]),
                    ],
                )

        return run

    def compactor() -> None:
        while not stop.is_set():
            store.compact(sid, force=True)

    def loader() -> None:
        prev: list[str] = []
        while not stop.is_set():
            got = [p.summary for p in store.load_bootstrap_state(sid).recent_progress]
            batches = {s[:-2] for s in got}
            if len(got) != 2 * len(batches) or got[: len(prev)] != prev:
                problems.append(("bootstrap", len(got), len(prev)))
            prev = got
            messages = [m.content for m in store.load_transcript_messages(sid)]
            if not batches <= set(messages):  # appended after the bootstrap load
                problems.append(("transcript behind", len(messages), len(batches)))
            tail = messages[-2:]
            page = store.load_transcript_messages(sid, start=len(messages) - len(tail))
            if [m.content for m in page][: len(tail)] != tail:
                problems.append(("page", page))

    def historian() -> None:
        while not stop.is_set():
            events = list(store.read_events(sid))
            if [e.seq for e in events] != list(range(1, len(events) + 1)):
                problems.append(("history", len(events)))
            if events and events[-1].more:
                problems.append(("history ends mid-batch", events[-1].seq))

    def writers() -> None:
        errors = run_threads([writer(0), writer(1)])
        stop.set()
        if errors:
            raise errors[0]

    try:
        errors = run_threads([writers, compactor, loader, loader, historian])
        assert not errors
        assert not problems, problems[:5]
        final = store.load_bootstrap_state(sid).recent_progress
        assert len(final) == len({p.summary for p in final}) == 600
        assert store.last_seq(sid) == 900
        assert store.verify(sid).ok
    finally:
        store.close()


@pytest.mark.usefixtures("fast_switches")
def test_one_idempotency_key_from_many_threads_writes_once_beside_eviction_and_compaction(
    tmp_path: Path,
) -> None:
    """Five threads retry the same keyed append while a sixth opens another session
    (dropping this one from a one-session cache, so threads hold two session objects)
    and compacts: one append is written, every other call replays its seqs."""
    store = SessionStore(tmp_path, cached_sessions=1)
    try:
        for k in range(15):
            results: list[AppendResult] = []

            def put(k: int = k, results: list[AppendResult] = results) -> None:
                entry = ProgressEntry("r", f"k{k}")
                results.append(store.append_progress_entry("s", entry, idempotency_key=f"key{k}"))

            def churn(k: int = k) -> None:
                store.load_bootstrap_state(f"other{k}")
                store.compact("s", force=True)

            assert not run_threads([put] * 5 + [churn])
            assert len({(r.first_seq, r.last_seq) for r in results}) == 1
            assert sum(not r.replayed for r in results) == 1
        summaries = [p.summary for p in store.load_bootstrap_state("s").recent_progress]
        assert summaries == [f"k{k}" for k in range(15)]
    finally:
        store.close()


@pytest.mark.usefixtures("fast_switches")
def test_close_beside_appending_and_loading_threads_loses_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    """close() while threads append and load (warm and cold pages): they see only
    StoreClosedError, and every append acknowledged before it is in the log."""
    acked: list[tuple[str, str]] = []
    for r in range(8):
        store = SessionStore(tmp_path)
        sid = f"c{r}"
        for i in range(20):
            store.append_progress_entry(sid, ProgressEntry("r", f"pre{i}"))

        def append(j: int, store: SessionStore = store, sid: str = sid) -> None:
            try:
                for i in range(300):
                    store.append_progress_entry(sid, ProgressEntry("r", f"{j}-{i}"))
                    acked.append((sid, f"{j}-{i}"))
            except StoreClosedError:
                pass

        def load(store: SessionStore = store, sid: str = sid) -> None:
            try:
                for _ in range(300):
                    store.load_bootstrap_state(sid)
                    store.load_transcript_messages(sid, last=2)
            except StoreClosedError:
                pass

        def close(store: SessionStore = store, r: int = r) -> None:
            time.sleep(0.003 * r)
            store.close()

        errors = run_threads([lambda: append(1), lambda: append(2), load, load, close])
        assert not errors, errors[:2]
    with SessionStore(tmp_path) as fresh:
        for sid, summary in acked:
            assert summary in {p.summary for p in fresh.load_bootstrap_state(sid).recent_progress}

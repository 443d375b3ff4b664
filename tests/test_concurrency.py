"""Writers exclude each other across processes and threads: no lost, duplicated or
reordered appends; exactly one initializer wins a race; readers never see a torn batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from conftest import log_path, make_entry, make_features, make_manifest

from eventstore import (
    Message,
    ProgressEntry,
    Role,
    SessionStore,
)
from eventstore.format.chain import (
    line_hash,
    split_hash,
)
from eventstore.format.events import (
    Event,
    MessagesAppended,
    ProgressAppended,
)
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


def _run_threads(n: int, target) -> None:  # type: ignore[no-untyped-def]
    errors: list[BaseException] = []

    def wrap(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    assert errors == []


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

    _run_threads(10, work)
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

        _run_threads(8, work)
        winners = [i for i, won in results.items() if won]
        assert len(results) == 8 and len(winners) == 1
        state = SessionStore(store.root).load_bootstrap_state(f"r{r}")
        assert state.manifest is not None
        assert state.manifest.current_objective == str(winners[0])
        assert len(state.feature_list) == winners[0] + 1
        assert store.last_seq(f"r{r}") == 2


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

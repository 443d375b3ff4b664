"""Shared fixtures: a store on tmp_path, every engine (`case`, `url`), the golden logs,
small record factories, and helpers for forked children and LangGraph checkpoints."""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # so `import strategies` works in any import mode
    sys.path.insert(0, str(TESTS_DIR))

from engines import ENGINE_IDS, ENGINES, EngineCase  # noqa: E402

from eventstore import (  # noqa: E402
    FeatureRecord,
    InitCommand,
    InitPlan,
    InitShell,
    InitShellScript,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    RunStatus,
    SessionManifest,
    SessionStore,
)
from eventstore.engines.conformance import in_forked_child, wait_child  # noqa: E402, F401
from eventstore.engines.file.layout import SessionPaths  # noqa: E402
from eventstore.format.events import Event  # noqa: E402
from projections import StructProjection  # noqa: E402

FIXTURES = TESTS_DIR.parent / "fixtures"
LOGS = FIXTURES / "logs"

T0 = datetime(2026, 3, 1, 9, 30, tzinfo=timezone(timedelta(hours=1)))


def log_path(root: Path | str, session_id: str) -> Path:
    """Where the store keeps the log of `session_id` under `root`."""
    return SessionPaths(Path(root), session_id).log


def cache_path(root: Path | str, session_id: str, name: str) -> Path:
    """Where the file engine keeps the side file `name` of `session_id` under `root`: a
    projection's fold cache (`fold-<name>.cache`), or the checked prefix
    (`eventstore.core.checked_prefix.NAME`)."""
    from eventstore.engines.file.caches import cache_file_name

    return SessionPaths(Path(root), session_id).dir / cache_file_name(name)


def make_manifest(session_id: str = "s1", **kw: object) -> SessionManifest:
    """A manifest with an init plan of both step kinds."""
    fields: dict[str, object] = dict(
        session_id=session_id,
        active_branch="main",
        current_objective="make the tests pass — ünïcode",
        init_plan=InitPlan(
            steps=[
                InitCommand(program="uv", args=["sync"]),
                InitShellScript(shell=InitShell.BASH, script="make build"),
            ]
        ),
        metadata={"owner": "tests"},
    )
    fields.update(kw)
    return SessionManifest(**fields)  # type: ignore[arg-type]


def make_features(n: int = 3) -> list[FeatureRecord]:
    """`n` features f1..fn, none passing."""
    return [
        FeatureRecord(
            id=f"f{i}", category="core", description=f"feature {i}", steps=["a", "b"], passes=False
        )
        for i in range(1, n + 1)
    ]


def make_entry(i: int = 0, run_id: str = "run-1") -> ProgressEntry:
    """A progress entry with a fixed, non-UTC timestamp."""
    return ProgressEntry(run_id=run_id, summary=f"step {i}", created_at=T0 + timedelta(seconds=i))


def make_checkpoint(run_id: str = "run-1") -> RunCheckpoint:
    return RunCheckpoint(
        run_id=run_id,
        started_at=T0,
        completed_at=T0.astimezone(UTC) + timedelta(minutes=5),
        status=RunStatus.SUCCEEDED,
        note="ok",
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A store root that does not exist yet."""
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> Iterator[SessionStore]:
    """A SessionStore on a fresh root, closed after the test."""
    with SessionStore(root) as s:
        yield s


def write_compacted(root: Path, sid: str, n: int, *, archive: bool = True, after: int = 2) -> None:
    """A session of `n` messages compacted into a snapshot, then `after` more."""
    with SessionStore(root) as s:
        s.initialize_session_if_missing(sid, make_manifest(sid), make_features(2))
        for i in range(n):
            s.append_transcript_messages(sid, [Message(Role.USER, f"msg{i:04d} " + "w" * 100)])
        assert s.compact(sid, force=True, archive=archive).compacted
        for i in range(after):
            s.append_transcript_messages(sid, [Message(Role.USER, f"after {i}")])


@pytest.fixture
def url_store(url: str) -> Iterator[SessionStore]:
    """A SessionStore on a fresh store of `case`'s engine (every engine in turn), closed
    after the test."""
    with SessionStore(url) as s:
        yield s


@pytest.fixture
def fast_switches() -> Iterator[None]:
    """Hand the GIL over as often as possible: every window between two bytecodes opens
    (for the attacks by threads sharing one store)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The test starts with the cyclic collector on (a test of the collector's pause may
    leave it off) and leaves it as it found it."""
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


@pytest.fixture
def no_leftover_children() -> Iterator[None]:
    """Kill the multiprocessing children a test left behind (a failed one's)."""
    yield
    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)


class LoadSpy:
    """Counts the decoders a store builds and the log bytes its loads read and fold."""

    def __init__(self, store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.decoders = 0
        self.folded = 0
        real_decoder = store.codec.decoder
        real_read = store.engine.read_some

        def decoder(needed: Any = None) -> Any:
            self.decoders += 1
            return real_decoder(needed)

        def read_some(sid: str, position: Any, limit: int) -> Any:
            res, more = real_read(sid, position, limit)
            self.folded += len(res.data)
            return res, more

        monkeypatch.setattr(store.codec, "decoder", decoder)
        monkeypatch.setattr(store.engine, "read_some", read_some)


def every_transcript_load(store: SessionStore, session_id: str) -> list[list[Message]]:
    """The session's transcript by every way of loading it: whole, its newest two
    messages, and a page of two from the second."""
    return [
        store.load_transcript_messages(session_id),
        store.load_transcript_messages(session_id, last=2),
        store.load_transcript_messages(session_id, start=1, limit=2),
    ]


def check_whole(root: Path, session_id: str) -> None:
    """A reader folds the session's log from its start, checking every line, and keeps
    on close the checked prefix it built (writers keep none: eventstore.core.checked_prefix)."""
    with SessionStore(root) as reader:
        reader.core.caches.cached = {}  # no fold cache may spare it the fold from the start
        reader.load_bootstrap_state(session_id)


@pytest.fixture
def no_transcript_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores made in the test keep no transcript fold cache: for attacks on how a load
    reads and checks the log itself, which a cache (checked when it was folded, and
    serving its state without reading the lines before its position) would bypass."""
    from projections import TranscriptProjection

    monkeypatch.setattr(TranscriptProjection, "cache_folds", False)


@pytest.fixture
def install_log(root: Path):  # type: ignore[no-untyped-def]
    """Copy a golden log (by file name) into `root` as the log of a session; returns its path."""

    def install(name: str, session_id: str = "golden") -> Path:
        paths = SessionPaths(root, session_id)
        root.mkdir(mode=0o700, exist_ok=True)
        paths.create()
        paths.log.write_bytes((LOGS / name).read_bytes())
        return paths.log

    return install


@pytest.fixture(params=ENGINES, ids=ENGINE_IDS)
def case(request: pytest.FixtureRequest) -> EngineCase:
    """Each engine in turn (see tests/engines.py; PostgreSQL when a server is given)."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def url(case: EngineCase, tmp_path: Path) -> str:
    """The URL of a fresh, empty store of `case`'s engine."""
    return case.fresh(tmp_path)


def run_threads(targets: list[Callable[[], None]], seconds: float = 30) -> list[BaseException]:
    """Start every target at once (a barrier), join them (a thread still running after
    `seconds` fails the test), return what they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            barrier.wait()
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


def same_value(a: Any, b: Any) -> bool:
    """`a == b` of the same types, NaN equal to NaN (as a framework's reference store
    gives back what json.dumps wrote)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def checkpoint_summary(tup: Any) -> Any:
    """What a LangGraph CheckpointTuple says, as a comparable value (None for None)."""
    if tup is None:
        return None
    return (
        tup.config["configurable"],
        tup.checkpoint["id"],
        tup.checkpoint["channel_values"],
        tup.checkpoint["channel_versions"],
        dict(tup.metadata),
        tup.parent_config["configurable"] if tup.parent_config else None,
        tup.pending_writes,
    )


def cli_in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `eventstore ARGV` in-process: (exit status, stdout, stderr). Anything escaping
    `main` is a traceback the user would see: a failure."""
    from eventstore.cli.app import main

    try:
        rc = main(list(argv))
    except BaseException as exc:  # noqa: BLE001 - that is the finding
        capsys.readouterr()
        pytest.fail(
            f"eventstore {' '.join(argv)!r} raised {type(exc).__name__}: {exc}"
            " (a traceback, not a one-line error)"
        )
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str) -> None:
    """One line saying what is wrong; a usage error (argparse's) prints the usage first."""
    assert "Traceback" not in err
    *usage, last = err.strip().splitlines()
    assert "error" in last, err
    assert not usage or (usage[0].startswith("usage:") and all(u[:1] == " " for u in usage[1:])), (
        err
    )


@pytest.fixture
def demo_root(tmp_path: Path) -> Path:
    """A store of two sessions, s1 and s2, as the report tests write them."""
    from test_report import write_session

    root = tmp_path / "store"
    with SessionStore(root) as store:
        write_session(store, "s1")
        write_session(store, "s2")
    return root


# -- PostgreSQL -----------------------------------------------------------------------

POSTGRES_URL_ENV = "EVENTSTORE_TEST_POSTGRES_URL"


def require_postgres_url() -> str:
    """The test server's URL: a skip without one, a failure in CI (`.ci/run` starts one)."""
    url = os.environ.get(POSTGRES_URL_ENV)
    if url:
        return url
    if os.environ.get("CI") == "true":
        pytest.fail(f"{POSTGRES_URL_ENV} is not set in CI: .ci/run must start PostgreSQL")
    pytest.skip(f"{POSTGRES_URL_ENV} is not set (see the README's PostgreSQL section)")


def with_query(url: str, **params: str) -> str:
    """`url` with these query parameters set (replacing any of the same names)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in params]
    query.extend(params.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


@pytest.fixture
def server_url() -> str:
    """The test server's URL (no schema parameter)."""
    return require_postgres_url()


@pytest.fixture
def pg_url(server_url: str) -> Iterator[str]:
    """A store URL on a schema of this test's own, dropped afterwards."""
    import psycopg

    from eventstore.engines.postgres.engine import split_url

    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield with_query(server_url, schema=schema)
    with psycopg.connect(split_url(server_url)[0], autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- Redis ----------------------------------------------------------------------------

REDIS_URL_ENV = "EVENTSTORE_TEST_REDIS_URL"


def require_redis_url() -> str:
    """The test Redis server's URL: a skip without one, a failure in CI (`.ci/run` starts
    one with `.ci/start-redis.sh`)."""
    url = os.environ.get(REDIS_URL_ENV)
    if url:
        return url
    if os.environ.get("CI") == "true":
        pytest.fail(f"{REDIS_URL_ENV} is not set in CI: .ci/run must start Redis")
    pytest.skip(f"{REDIS_URL_ENV} is not set (source .ci/start-redis.sh)")


# -- the README's custom event and projection ------------------------------------------


class FlipCounted(Event, tag="flip_counted", kw_only=True):
    """The README's custom event type ("Custom events and projections")."""

    run_id: str
    feature_id: str = ""


class FlipsPerRun(StructProjection[dict[str, int]]):
    """The README's custom projection: `flip_counted` events counted per run."""

    name = "flips"
    version = 1
    event_types: frozenset[str] | None = frozenset({"flip_counted"})
    state_type = dict[str, int]

    def initial(self) -> dict[str, int]:
        return {}

    def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
        if type(event) is FlipCounted:
            state[event.run_id] = state.get(event.run_id, 0) + 1
        return state

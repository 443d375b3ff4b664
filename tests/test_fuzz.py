"""Fuzzing the reader and the writer with hypothesis: arbitrary bytes as a log file, and
mutations of valid logs (bit flips, truncations, duplicated or swapped lines, invalid
UTF-8, NUL runs, multi-megabyte lines).

Properties, for every input:
- opening and reading (load_bootstrap_state, load_transcript_messages, last_seq) and a
  writer's append raise nothing but CorruptLogError, and never hang (a timer guards each
  example);
- a valid prefix is never silently shortened: for a mutation whose first changed byte is
  at offset X, either CorruptLogError is raised or the state read includes every complete
  batch that ends at or before X (only the last, torn, batch may be dropped), also after
  a writer appended (its tail repair must not cut a committed batch).

CI: a few hundred examples; ``EVENTSTORE_LONG=1``: thousands.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import make_checkpoint, make_entry, make_features, make_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import (
    CorruptLogError,
    Message,
    MessagesAppended,
    ProgressAppended,
    ProgressEntry,
    Role,
    SessionStore,
    SnapshotVersionError,
)
from eventstore.engines.file.layout import SessionPaths

LONG = os.environ.get("EVENTSTORE_LONG") == "1"
SID = "fz"
TIMEOUT = 10.0  # seconds per example: a hang fails the test instead of the CI job
FIGURES: dict[str, int] = {}


class Hang(Exception):
    pass


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def boom(signum: int, frame: object) -> None:
        raise Hang(f"no answer within {seconds}s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- valid logs and what each of their batches contributes ---------------------------------


@dataclass(frozen=True)
class ValidLog:
    data: bytes
    ends: tuple[int, ...]  # byte offset just after each complete batch
    progress: tuple[tuple[str, ...], ...]  # progress summaries each batch adds (cumulative)
    messages: tuple[tuple[str, ...], ...]  # message contents, cumulative


def _build(compacted: bool) -> ValidLog:
    root = Path(tempfile.mkdtemp(prefix="fuzzlog-"))
    try:
        with SessionStore(root) as s:
            s.initialize_session_if_missing(
                SID, make_manifest(SID), make_features(3), make_entry(0), make_checkpoint()
            )
            for i in range(1, 13):
                if i % 4 == 0:
                    s.append(
                        SID,
                        [
                            ProgressAppended(entry=make_entry(100 + i)),
                            MessagesAppended(messages=[Message(role=Role.USER, content=f"b{i}")]),
                            ProgressAppended(entry=make_entry(200 + i)),
                        ],
                    )
                elif i % 4 == 1:
                    s.append_transcript_messages(
                        SID, [Message(role=Role.ASSISTANT, content=f'm{i} ünï\n"q"')]
                    )
                elif i % 4 == 2:
                    s.update_feature_pass(SID, f"f{i % 3 + 1}", True)
                else:
                    s.append_progress_entry(SID, make_entry(i))
                if compacted and i == 6:
                    s.compact(SID, archive=False)
        data = SessionPaths(root, SID).log.read_bytes()
    finally:
        shutil.rmtree(root)
    ends, progress, messages = [], [], []
    prog: list[str] = []
    msgs: list[str] = []
    pos = 0
    for line in data.splitlines(keepends=True):
        pos += len(line)
        obj = json.loads(line)
        if obj["type"] == "snapshot":
            state = obj["states"]
            prog = [p["summary"] for p in state["bootstrap"]["state"]["recent_progress"]]
            msgs = [m["content"] for m in state["transcript"]["state"]]
        elif obj["type"] == "progress_appended":
            prog.append(obj["entry"]["summary"])
        elif obj["type"] == "messages_appended":
            msgs.extend(m["content"] for m in obj["messages"])
        if not obj.get("more"):
            ends.append(pos)
            progress.append(tuple(prog))
            messages.append(tuple(msgs))
    return ValidLog(data, tuple(ends), tuple(progress), tuple(messages))


@functools.cache
def valid_logs() -> tuple[ValidLog, ValidLog]:
    return _build(False), _build(True)


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


# -- mutations ------------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn, huge: bool = False) -> tuple[int, bytes, str]:
    """(index of the valid log, mutated bytes, mutation name)."""
    which = draw(st.integers(0, 1))
    data = valid_logs()[which].data
    n = len(data)
    lines = _lines(data)
    kind = draw(
        st.sampled_from(["huge"])
        if huge
        else st.sampled_from(
            ["flip", "flip", "flips", "truncate", "dup", "swap", "utf8", "nul", "delete", "newline"]
        )
    )
    if kind == "flip" or kind == "flips":
        buf = bytearray(data)
        for _ in range(1 if kind == "flip" else draw(st.integers(2, 8))):
            buf[draw(st.integers(0, n - 1))] ^= 1 << draw(st.integers(0, 7))
        out = bytes(buf)
    elif kind == "truncate":
        out = data[: draw(st.integers(0, n - 1))]
    elif kind == "dup":
        i = draw(st.integers(0, len(lines) - 1))
        j = draw(st.integers(0, len(lines)))
        out = b"".join(lines[:j] + [lines[i]] + lines[j:])
    elif kind == "swap":
        i = draw(st.integers(0, len(lines) - 2))
        j = draw(st.integers(i + 1, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
        out = b"".join(lines)
    elif kind == "utf8":
        at = draw(st.integers(0, n))
        bad = draw(st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
        replace = draw(st.booleans())
        out = data[:at] + bad + data[at + (len(bad) if replace else 0) :]
    elif kind == "nul":
        at = draw(st.integers(0, n))
        run = b"\x00" * draw(st.integers(1, 5000))
        replace = draw(st.booleans())
        out = data[:at] + run + data[at + (len(run) if replace else 0) :]
    elif kind == "delete":
        at = draw(st.integers(0, n - 1))
        out = data[:at] + data[at + draw(st.integers(1, 200)) :]
    elif kind == "newline":
        at = draw(st.integers(0, n))
        out = data[:at] + b"\n" + data[at:]
    else:  # huge: a multi-megabyte line, garbage or JSON-looking, anywhere
        size = draw(st.integers(2, 6)) * 2**20
        body = draw(
            st.sampled_from(
                [
                    b"x" * size,
                    b'{"type":"messages_appended","seq":' + b"9" * size + b"}",
                    b'{"type":"progress_appended","seq":3,"entry":{"summary":"'
                    + b"a" * size
                    + b'"}}',
                ]
            )
        )
        at_line = draw(st.booleans())
        if at_line:
            j = draw(st.integers(0, len(lines)))
            newline = draw(st.booleans())
            out = b"".join(lines[:j]) + body + (b"\n" if newline else b"") + b"".join(lines[j:])
        else:
            at = draw(st.integers(0, n))
            out = data[:at] + body + data[at:]
    return which, out, kind


def first_difference(a: bytes, b: bytes) -> int:
    """The length of the common prefix of `a` and `b` (binary search, C-speed compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


# -- the property ---------------------------------------------------------------------------


def _known_snapshot_outcome(exc: BaseException) -> str:
    """'' unless `exc` is a tolerated or known-defect outcome of a damaged snapshot line.

    - SnapshotVersionError: a snapshot without (or with another version of) a projection's
      state is the documented answer, typed, when no archive can rebuild it; a damaged
      state key looks exactly like that.
    (A raw msgspec error from restore_state was a defect, fixed: see
    test_corrupt_snapshot_state_raises_corrupt_log_error.)
    """
    if isinstance(exc, SnapshotVersionError):
        return "snapshot-version"
    return ""


def _check_prefix(log: ValidLog, x: int, progress: list[str], messages: list[str]) -> None:
    k = sum(1 for e in log.ends if e <= x)  # complete batches that end at or before X
    if k == 0:
        return
    want_p, want_m = log.progress[k - 1], log.messages[k - 1]
    assert tuple(progress[: len(want_p)]) == want_p, (
        f"valid prefix shortened: {k} batches end before byte {x}; progress read"
        f" {progress[: len(want_p)]} instead of {list(want_p)}"
    )
    assert tuple(messages[: len(want_m)]) == want_m, f"valid prefix shortened at byte {x}"


def run_all(data: bytes, log: ValidLog | None, x: int) -> str:
    """Install `data` as a log, read it and append to it; returns what happened.
    Raises AssertionError for any outcome that breaks the properties."""
    root = Path(tempfile.mkdtemp(prefix="fuzz-"))
    outcome = "ok"
    try:
        paths = SessionPaths(root, SID)
        root.mkdir(exist_ok=True, mode=0o700)
        paths.create()
        paths.log.write_bytes(data)
        with deadline(TIMEOUT):
            for step in ("read", "last_seq", "append", "reread"):
                try:
                    with SessionStore(root) as s:
                        if step in ("read", "reread"):
                            boot = s.load_bootstrap_state(SID)
                            msgs = s.load_transcript_messages(SID)
                            if log is not None:
                                progress = [p.summary for p in boot.recent_progress]
                                _check_prefix(log, x, progress, [m.content for m in msgs])
                        elif step == "last_seq":
                            s.last_seq(SID)
                        else:
                            s.append_progress_entry(SID, ProgressEntry(run_id="z", summary="z"))
                except CorruptLogError:
                    outcome = "corrupt"
                except AssertionError:
                    raise
                except Exception as exc:
                    known = _known_snapshot_outcome(exc)
                    if known:
                        outcome = known
                        continue
                    raise AssertionError(
                        f"{step} raised {type(exc).__name__} (not CorruptLogError): {exc}"
                    ) from exc
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return outcome


def _count(name: str) -> None:
    FIGURES[name] = FIGURES.get(name, 0) + 1


COMMON = dict(
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _all_lines() -> list[bytes]:
    return [line for log in valid_logs() for line in _lines(log.data)]


#: Arbitrary bytes, and arbitrary sequences of valid lines, their pieces and random bytes.
arbitrary_logs = st.one_of(
    st.binary(max_size=2048),
    st.binary(min_size=1, max_size=200).map(lambda b: b.replace(b"\x00", b"\n")),
    st.lists(
        st.one_of(
            st.sampled_from(_all_lines()),
            st.tuples(st.sampled_from(_all_lines()), st.integers(0, 400)).map(
                lambda t: t[0][: t[1]]
            ),
            st.binary(max_size=40),
        ),
        max_size=25,
    ).map(b"".join),
)


@pytest.mark.slow
@settings(max_examples=4000 if LONG else 500, **COMMON)  # type: ignore[arg-type]
@given(arbitrary_logs)
def test_arbitrary_bytes_raise_only_corrupt_log_error(data: bytes) -> None:
    """Any bytes as a log file: reading, last_seq and a writer's append either work or
    raise CorruptLogError; nothing else, and no hang."""
    _count("arbitrary:" + run_all(data, None, 0))


@pytest.mark.slow
@settings(max_examples=5000 if LONG else 800, **COMMON)  # type: ignore[arg-type]
@given(mutated())
def test_mutated_valid_log_never_loses_a_valid_prefix(case: tuple[int, bytes, str]) -> None:
    """Mutations of valid logs (plain and compacted): only CorruptLogError, never a hang,
    and every complete batch before the first changed byte is still read (before and after
    a writer's append)."""
    which, data, kind = case
    log = valid_logs()[which]
    x = first_difference(log.data, data)
    _count(f"{kind}:" + run_all(data, log, x))


@settings(max_examples=60 if LONG else 10, **COMMON)  # type: ignore[arg-type]
@given(mutated(huge=True))
def test_huge_lines_raise_only_corrupt_log_error(case: tuple[int, bytes, str]) -> None:
    """A multi-megabyte line (garbage, or JSON-looking) anywhere in a valid log: the same
    properties, within the time limit."""
    which, data, kind = case
    log = valid_logs()[which]
    _count(f"{kind}:" + run_all(data, log, first_difference(log.data, data)))


def test_valid_logs_read_back_whole() -> None:
    """The unmutated logs read back completely (so the prefix check has teeth), and the
    checker does catch a shortened prefix."""
    for log in valid_logs():
        assert run_all(log.data, log, len(log.data)) == "ok"
        with pytest.raises(AssertionError, match="prefix shortened"):
            _check_prefix(log, len(log.data), list(log.progress[-1][:-1]), [])
    print(f"\nFUZZ FIGURES (outcomes by mutation, this process): {dict(sorted(FIGURES.items()))}")


def _snapshot_log() -> bytes:
    return valid_logs()[1].data


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"run_id"', b'"run_ie"'),  # a required field renamed
        (b'"recent_progress":[', b'"recent_progress":[1,'),  # wrong element type
        (b'{"version":1,"state":', b'{"version":1,"stat":'),  # snapshot entry shape
    ],
)
def test_corrupt_snapshot_state_raises_corrupt_log_error(old: bytes, new: bytes) -> None:
    """A snapshot whose stored state is valid JSON of the wrong shape is a corrupt line:
    loading raises CorruptLogError, not a raw msgspec error."""
    data = _snapshot_log()
    assert old in data
    root = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        SessionStore(root).close()
        paths = SessionPaths(root, SID)
        paths.create()
        paths.log.write_bytes(data.replace(old, new, 1))
        with SessionStore(root) as s, pytest.raises(CorruptLogError):
            s.load_bootstrap_state(SID)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- issue 12: what a load returns was checked; verify and read_events only report ---------


@st.composite
def merged(draw: st.DrawFn) -> tuple[int, bytes, str]:
    """Two adjacent lines of a valid log made one: the newline became a space, or went."""
    which = draw(st.integers(0, 1))
    lines = _lines(valid_logs()[which].data)
    i = draw(st.integers(0, len(lines) - 2))
    glue = draw(st.sampled_from([b" ", b""]))
    out = b"".join(lines[:i]) + lines[i][:-1] + glue + b"".join(lines[i + 1 :])
    return which, out, "merge"


def _install(data: bytes) -> Path:
    root = Path(tempfile.mkdtemp(prefix="fuzz-"))
    SessionStore(root).close()
    paths = SessionPaths(root, SID)
    paths.create()
    paths.log.write_bytes(data)
    return root


@settings(max_examples=2000 if LONG else 300, **COMMON)  # type: ignore[arg-type]
@given(st.one_of(mutated(), merged()))
def test_mutated_valid_log_never_returns_an_edited_event(case: tuple[int, bytes, str]) -> None:
    """A load of a mutated log raises CorruptLogError or returns exactly the state of a
    committed prefix of the original: never an edited, duplicated or reordered event."""
    which, data, kind = case
    log = valid_logs()[which]
    root = _install(data)
    try:
        with deadline(TIMEOUT), SessionStore(root) as s:
            try:
                progress = tuple(p.summary for p in s.load_bootstrap_state(SID).recent_progress)
                messages = tuple(m.content for m in s.load_transcript_messages(SID))
            except CorruptLogError:
                _count(f"checked:{kind}:corrupt")
                return
            except SnapshotVersionError:
                _count(f"checked:{kind}:snapshot-version")
                return
        prefixes = {((), ()), *zip(log.progress, log.messages, strict=True)}
        assert (progress, messages) in prefixes, (
            f"{kind}: a load returned a state that no committed prefix has:"
            f" progress {progress}, messages {messages}"
        )
        _count(f"checked:{kind}:prefix")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@settings(max_examples=1000 if LONG else 200, **COMMON)  # type: ignore[arg-type]
@given(st.one_of(merged(), mutated()))
def test_mutated_logs_verify_reports_and_read_events_raises_only_corrupt_log_error(
    case: tuple[int, bytes, str],
) -> None:
    """`verify` never raises on a damaged log, it reports, each problem naming its file;
    `read_events` and `state_at` raise nothing but CorruptLogError (or the typed
    SnapshotVersionError / HistoryUnavailableError of a damaged snapshot)."""
    from eventstore import HistoryUnavailableError

    _, data, kind = case
    root = _install(data)
    try:
        with deadline(TIMEOUT), SessionStore(root) as s:
            report = s.verify(SID)
            assert all(p.file for p in report.problems), report.problems
            for call in (lambda: list(s.read_events(SID)), lambda: s.state_at(SID, seq=5)):
                try:
                    call()
                except (CorruptLogError, SnapshotVersionError, HistoryUnavailableError):
                    pass
        _count(f"verify:{kind}:{'ok' if report.ok else 'reported'}")
    finally:
        shutil.rmtree(root, ignore_errors=True)

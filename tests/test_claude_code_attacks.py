"""Attacks on the Claude Code import: arbitrary bytes, an importer killed mid-import, lines
far longer than a read."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore.integrations.claude_code import (
    export_transcript,
    import_transcript,
    open_store,
)

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

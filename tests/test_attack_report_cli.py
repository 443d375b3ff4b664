"""An outsider's attacks on the session report, `eventstore serve` and the CLI.

The failing tests are broken promises of the README ("Errors are one line on stderr,
never a traceback"; "Ctrl-C / SIGTERM stop it"; serve "never writes to the store"; "The
page stays under --max-bytes"); the passing ones are the strongest attacks that found
nothing, kept as coverage: hostile text in every field a harness writes, drawn by a real
headless Chromium; traversal and malformed requests against `serve`; exports of
damaged logs.
"""

from __future__ import annotations

import http.client
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_report import T0, write_session
from test_report_browser import chromium, dump_dom, probe_is_clean  # noqa: F401 (fixture)

from eventstore import (
    Event,
    FeatureRecord,
    ImageBlock,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    SessionManifest,
    SessionStore,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from eventstore.cli.app import main
from eventstore.report.page import build_report
from eventstore.report.server import (
    HOST,
    ReportServer,
)

# -- helpers ---------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `eventstore ARGV` in-process: (exit status, stdout, stderr). Anything escaping
    `main` is a traceback the user would see: a failure."""
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


def files(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in root.rglob("*")
    }


@pytest.fixture
def demo_root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        write_session(store, "s1")
        write_session(store, "s2")
    return root


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[ReportServer, Path]]:
    """A server on a store with a planted symlink (`sessions/evil -> /etc`)."""
    root = tmp_path / "served"
    with SessionStore(root) as store:
        write_session(store, "s1")
    os.symlink("/etc", root / "sessions" / "evil")
    srv = ReportServer(root, 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv, root
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def get(srv: ReportServer, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, srv.server_address[1], timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def raw(srv: ReportServer, data: bytes) -> bytes:
    with socket.create_connection((HOST, srv.server_address[1]), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# -- finding 1: times whose UTC conversion overflows ------------------------------------


@pytest.mark.parametrize("command", ["state", "transcript"])
@pytest.mark.parametrize("at", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-05:00"])
def test_at_time_at_the_edge_of_the_calendar_is_a_one_line_error(
    demo_root: Path, capsys: pytest.CaptureFixture[str], command: str, at: str
) -> None:
    # valid ISO 8601, accepted by the parser; its UTC form is outside datetime's range
    rc, _, err = cli(capsys, command, str(demo_root), "s1", "--at-time", at)
    assert rc in (0, 2)
    if rc == 2:
        one_line_error(err)


def test_prune_archive_before_the_end_of_time_fails_cleanly(
    demo_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = cli(
        capsys,
        "compact",
        str(demo_root),
        "--all",
        "--prune-archive-before",
        "9999-12-31T23:59:00-01:00",
    )
    assert rc in (0, 1, 2)
    assert "Traceback" not in err


# -- finding 2: an age too large for a timedelta, or for now - age -----------------------


@pytest.mark.parametrize("age", ["99999999999999d", "1000000d", "99999999999999999999w"])
def test_delete_older_than_a_huge_age_deletes_nothing_and_says_so(
    demo_root: Path, capsys: pytest.CaptureFixture[str], age: str
) -> None:
    rc, _, err = cli(capsys, "delete", str(demo_root), "--older-than", age)
    assert rc in (0, 2), err  # nothing is that old, or a usage error
    if rc == 2:
        one_line_error(err)
    with SessionStore(demo_root) as store:
        assert sorted(store.list_sessions()) == ["s1", "s2"]


# -- finding 3: follow does not stop on SIGTERM until its interval ends ----------------------


def test_follow_stops_on_sigterm_whatever_its_interval(demo_root: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "eventstore", "follow", str(demo_root), "s1", "--interval", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "follow printed nothing in 30 s"
        assert proc.stdout.readline().strip()  # the last events: the handlers are installed
        time.sleep(0.5)  # in its wait now
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        waited = time.monotonic() - sent
        assert rc == 0, f"follow --interval 60 still running {waited:.1f} s after SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# -- finding 4: serve writes fold caches into the store ------------------------------------


def test_serve_never_writes_to_the_store_even_for_a_long_session(tmp_path: Path) -> None:
    root = tmp_path / "big"
    with SessionStore(root) as store:
        write_session(store, "big")
        for i in range(6):  # a log over 1 MiB: loads of it cache their folds
            store.append_transcript_messages(
                "big", [Message(role=Role.TOOL, content=f"{i} " + "x" * 250_000)]
            )
    for cache in root.rglob("*.cache"):  # as a harness killed before close leaves it
        cache.unlink()
    before = files(root)
    srv = ReportServer(root, 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        status, body = get(srv, "/session/big")
        assert status == 200 and b"report-data" in body
        after_get = files(root)
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
    assert sorted(set(after_get) - set(before)) == []
    assert sorted(set(files(root)) - set(before)) == []  # nor on close


# -- finding 5: one long field that is not message text makes the page impossible ----------


def _long_field(store: SessionStore, sid: str, field: str, text: str) -> None:
    write_session(store, sid)
    if field == "progress summary":  # a test log pasted into a progress note
        store.append_progress_entry(sid, ProgressEntry(run_id="run-3", summary=text, created_at=T0))
    elif field == "checkpoint note":
        store.record_run_checkpoint(sid, RunCheckpoint(run_id="run-3", started_at=T0, note=text))
    elif field == "feature description":
        store.replace_feature_list(
            sid,
            [FeatureRecord(id="f", category="c", description=text, steps=[], passes=False)],
        )
    elif field == "objective":
        store.save_manifest(
            sid, SessionManifest(session_id=sid, active_branch="main", current_objective=text)
        )
    else:  # a tool call's name (the label of its box)
        store.append_transcript_messages(
            sid,
            [
                Message(
                    Role.ASSISTANT,
                    "calling",
                    blocks=[ToolUseBlock(id="t1", name=text, input={"k": "v"})],
                )
            ],
        )


@pytest.mark.parametrize(
    "field",
    ["progress summary", "checkpoint note", "feature description", "objective", "tool name"],
)
def test_one_long_field_is_cut_and_the_page_stays_under_max_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        _long_field(store, "long", field, "y" * 300_000)
    page = tmp_path / "long.html"
    rc, _, err = cli(capsys, "report", str(root), "long", "-o", str(page), "--max-bytes", "200000")
    assert rc == 0, err
    assert page.stat().st_size <= 200_000


def test_an_eleven_megabyte_progress_note_still_gets_a_default_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        _long_field(store, "long", "progress summary", "y" * 11_000_000)
    page = tmp_path / "long.html"
    rc, _, err = cli(capsys, "report", str(root), "long", "-o", str(page))
    assert rc == 0, err
    assert page.stat().st_size <= 10_000_000


# -- finding 6: a legal output name the temporary file cannot mirror ------------------------


def test_report_writes_a_long_but_legal_file_name(
    demo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    name = "r" * 245 + ".html"  # 250 bytes: NAME_MAX is 255
    rc, _, err = cli(capsys, "report", str(demo_root), "s1", "-o", str(out / name))
    assert rc == 0, err
    assert os.listdir(out) == [name]


# -- finding 7: an id that cannot exist is a server error ----------------------------------


@pytest.mark.parametrize("path", ["/session/", "/session/%00", "/session/" + "x" * 2000])
def test_serve_answers_an_impossible_session_as_not_found(
    running: tuple[ReportServer, Path], path: str
) -> None:
    srv, _ = running
    status, body = get(srv, path)
    assert status == 404, (status, body)


# -- coverage: attacks that found nothing ------------------------------------------------

PAYLOAD = (
    "</script><script>document.title='PWNED-1'</script>"
    "<img src=x onerror=\"document.title='PWNED-2'\">"
    "<svg onload=\"document.title='PWNED-3'\"></svg>"
    "--><!--<script>document.title='PWNED-4'</script>"
    "{{constructor.constructor('document.title=\"PWNED-5\"')()}}"
    " javascript:document.title='PWNED-6' \u2028\u2029 ]]> \\u003c/script>"
)


class HostileEvent(Event, tag="hostile</script><img src=x onerror=alert(1)>", kw_only=True):
    payload: str


def test_hostile_text_in_every_field_never_runs_in_chromium(
    chromium: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    p = PAYLOAD
    sid = "sid" + p  # a session id may hold any of it (no NUL)
    root = tmp_path / "store"
    with SessionStore(root, event_types=[HostileEvent]) as store:
        store.initialize_session_if_missing(
            sid,
            SessionManifest(
                session_id=sid,
                active_branch=p,
                current_objective=p + "\x00",
                last_known_good_commit=p,
                harness_version=p,
                metadata={p: p, "__proto__": p, "constructor": p},
            ),
            [FeatureRecord(id=p, category=p, description=p, steps=[p], passes=False)],
            initial_progress_entry=ProgressEntry(run_id=p, summary=p, created_at=T0),
            initial_checkpoint=RunCheckpoint(run_id=p, started_at=T0, note=p),
        )
        store.update_feature_pass(sid, p, True)
        store.append_transcript_messages(
            sid,
            [
                Message(Role.USER, p + "\x00", name=p, metadata={p: p, "__proto__": {p: [p]}}),
                Message(
                    Role.ASSISTANT,
                    p,
                    blocks=[
                        TextBlock(text=p + " more"),
                        ThinkingBlock(thinking=p, signature=p),
                        ToolUseBlock(id=p, name=p, input={p: p, "__proto__": {"x": p}}),
                        ImageBlock(source="javascript:document.title='PWNED-7'", media_type=p),
                    ],
                ),
                Message(
                    Role.TOOL,
                    p,
                    name=p,
                    blocks=[ToolResultBlock(tool_use_id=p, content=p, is_error=True)],
                ),
            ],
        )
        store.append(sid, [HostileEvent(payload=p)])
    with SessionStore(root) as reader:  # the custom type is unknown to the report
        page = tmp_path / "evil.html"
        page.write_text(build_report(reader, sid, generated_at=T0), encoding="utf-8")
    dom = dump_dom(chromium, page, tmp_path)
    probe_is_clean(dom)  # no error, nothing blocked by the policy: nothing tried to run
    title = dom[dom.index("<title>") : dom.index("</title>")]
    # a payload that ran would have made the title "PWNED-n"
    assert title.startswith("<title>Session sid&lt;/script&gt;&lt;script&gt;document.title=")
    assert title.endswith("· eventstore report")
    body = dom[dom.index('<main id="app">') :]
    for element in ("<img", "<svg onload", "<script>document", "<iframe", 'href="javascript'):
        assert element not in body, element
    assert body.count("<script") == 2  # the data and the page's own script, nothing else
    assert "PWNED-7" in body and "hostile&lt;/script&gt;" in body  # shown as text


def test_serve_refuses_traversal_and_malformed_requests(
    running: tuple[ReportServer, Path],
) -> None:
    srv, root = running
    before = files(root)
    assert srv.server_address[0] == "127.0.0.1"
    for path in (
        "/../../etc/passwd",
        "/session/../../../etc/passwd",
        "/session/..%2f..%2f..%2fetc%2fpasswd",
        "/session/%2e%2e/%2e%2e/etc/passwd",
        "/session//etc/passwd",
        "/session/s1/../../../etc/passwd",
        "//etc/passwd",
        "http://127.0.0.1/session/s1",
    ):
        status, body = get(srv, path)
        assert status in (403, 404) and b"root:" not in body, (path, status)
    status, body = get(srv, "/session/evil")  # the planted link is refused, not followed
    assert status != 200 and b"root:" not in body
    status, body = get(srv, "/")
    assert status == 200 and b"/session/s1" in body
    assert b"Error code explanation: 400" in raw(srv, b"GARBAGE\r\n\r\n")
    assert b"Error code explanation: 400" in raw(srv, b"GET / NOTHTTP/1.1\r\n\r\n")
    assert raw(srv, b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 414")
    assert files(root) == before


def test_exports_of_a_damaged_log_print_nothing_that_looks_complete(
    demo_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = demo_root / "sessions" / "s1" / "log.jsonl"
    data = log.read_bytes()
    assert b"feat-000 and feat-001 pass" in data
    log.write_bytes(data.replace(b"feat-000 and feat-001 pass", b"feat-000 and feat-001 FAIL"))
    for fmt in ("json", "jsonl"):
        rc, out, err = cli(capsys, "export", str(demo_root), "s1", "--format", fmt)
        assert (rc, out) == (2, ""), fmt
        one_line_error(err)
        assert "h is" in err and "seq" in err


def test_report_output_that_is_a_directory_or_a_symlink(
    demo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "target.html"
    target.write_text("keep")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    rc, _, err = cli(capsys, "report", str(demo_root), "s1", "-o", str(link))
    assert rc == 0, err
    assert target.read_text() == "keep" and not link.is_symlink()  # replaced, not followed
    for out in (tmp_path, demo_root / "sessions", tmp_path / "missing" / "x.html"):
        rc, _, err = cli(capsys, "report", str(demo_root), "s1", "-o", str(out))
        assert rc == 2
        one_line_error(err)
    leftovers = [p for p in tmp_path.rglob("*.tmp-*")]
    assert leftovers == []

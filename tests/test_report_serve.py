"""`eventstore serve ROOT` (eventstore.report.server): the reports live, on the loopback
address only, read-only, refusing other methods and foreign Host headers."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from test_report import Page, write_hostile, write_session
from test_report_browser import DevTools, chromium, devtools  # noqa: F401 (fixtures)

from eventstore import (
    Message,
    Role,
    SessionStore,
)
from eventstore.cli.app import main
from eventstore.report.server import (
    HOST,
    ReportServer,
)

ODD_ID = "a/b?c#d <e> & f"


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        write_session(store, "s1")
        write_hostile(store, ODD_ID, "x")
    return root


@pytest.fixture
def server(store_root: Path) -> Iterator[ReportServer]:
    srv = ReportServer(store_root, 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def request(
    srv: ReportServer, method: str, path: str, host: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(HOST, srv.server_address[1], timeout=30)
    try:
        headers = {"Host": host} if host is not None else {}
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def files(root: Path) -> dict[Path, tuple[bytes, int]]:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_it_listens_on_the_loopback_address_only(server: ReportServer) -> None:
    assert server.server_address[0] == "127.0.0.1"
    assert server.url == f"http://127.0.0.1:{server.server_address[1]}/"


def test_the_index_links_every_session(server: ReportServer) -> None:
    status, headers, body = request(server, "GET", "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    text = body.decode()
    assert "<e>" not in text and "&lt;e&gt;" in text  # the id as text
    links = [a["href"] for t, a in Page(text).tags if t == "a"]
    assert links == [f"/session/{quote(ODD_ID, safe='')}", "/session/s1"]
    for link in links:  # each link opens its own session's page
        status, _, page = request(server, "GET", link or "")
        assert status == 200
        assert Page(page.decode()).data()["session_id"] in (ODD_ID, "s1")


def test_a_page_is_built_afresh_on_every_request(server: ReportServer, store_root: Path) -> None:
    _, _, first = request(server, "GET", "/session/s1")
    assert Page(first.decode()).data()["sizes"]["messages"] == 5
    with SessionStore(store_root) as store:  # another process's writer, say
        store.append_transcript_messages("s1", [Message(role=Role.USER, content="new")])
    _, _, second = request(server, "GET", "/session/s1")
    d = Page(second.decode()).data()
    assert d["sizes"]["messages"] == 6 and d["messages"][-1]["content"] == "new"


def test_refusals(server: ReportServer, store_root: Path) -> None:
    before = files(store_root)
    assert request(server, "GET", "/session/nope")[0] == 404
    assert request(server, "GET", "/etc/passwd")[0] == 404
    assert request(server, "GET", "/session/..%2F..%2Fetc")[0] == 404  # an id, not a path
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        assert request(server, method, "/session/s1")[0] == 405, method
    # a page of another site reaching 127.0.0.1 through its own name (DNS rebinding)
    assert request(server, "GET", "/session/s1", host="evil.example:80")[0] == 403
    assert request(server, "GET", "/", host=f"evil.example:{server.server_address[1]}")[0] == 403
    status, headers, body = request(server, "HEAD", "/session/s1")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 10_000
    assert files(store_root) == before  # nothing written, not even a lock file


@pytest.mark.parametrize(
    "method", ["TRACE", "PROPFIND", "CONNECT", "MKCOL", "M-SEARCH", "BREW", "POST", "OPTIONS"]
)
def test_every_method_but_get_and_head_is_405_with_allow(
    server: ReportServer, store_root: Path, method: str
) -> None:
    """Issue 29 item 9: TRACE, PROPFIND, CONNECT (any method the server has no handler
    for) got 501 "not implemented"; each is a method it does not allow: 405, and the
    methods it does allow in `Allow`."""
    before = files(store_root)
    status, headers, body = request(server, method, "/session/s1")
    assert status == 405, method
    assert headers["Allow"] == "GET, HEAD"
    assert b"report-data" not in body
    assert files(store_root) == before


def test_serve_from_the_command_line(store_root: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "eventstore", "serve", str(store_root), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the address, printed once it listens
        assert "read-only" in line
        port = int(line.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
        conn = http.client.HTTPConnection(HOST, port, timeout=30)
        conn.request("GET", "/session/s1")
        resp = conn.getresponse()
        assert resp.status == 200 and b"report-data" in resp.read()
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_needs_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tmp_path / "missing"), "--port", "0"]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()
    assert main(["serve", str(tmp_path), "--port", "70000"]) == 2  # a usage error


def test_the_served_page_in_a_browser(devtools: DevTools, server: ReportServer) -> None:  # noqa: F811
    url = server.url + "session/s1"
    devtools.open(url)
    assert devtools.eval("document.body.dataset.rendered") == "ok"
    assert devtools.eval("document.querySelectorAll('#messages > li').length") == 5
    assert devtools.problems() == []
    assert devtools.requests() == [url]


# -- attacks -------------------------------------------------------------------------------


def _file_stats(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in root.rglob("*")
    }


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
    before = _file_stats(root)
    srv = ReportServer(root, 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        status, body = get(srv, "/session/big")
        assert status == 200 and b"report-data" in body
        after_get = _file_stats(root)
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
    assert sorted(set(after_get) - set(before)) == []
    assert sorted(set(_file_stats(root)) - set(before)) == []  # nor on close


@pytest.mark.parametrize("path", ["/session/", "/session/%00", "/session/" + "x" * 2000])
def test_serve_answers_an_impossible_session_as_not_found(
    running: tuple[ReportServer, Path], path: str
) -> None:
    srv, _ = running
    status, body = get(srv, path)
    assert status == 404, (status, body)


def test_serve_refuses_traversal_and_malformed_requests(
    running: tuple[ReportServer, Path],
) -> None:
    srv, root = running
    before = _file_stats(root)
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
    assert _file_stats(root) == before

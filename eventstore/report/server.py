"""`eventstore serve ROOT`: the session reports of a store, live, on 127.0.0.1 only.

Owns a small read-only HTTP server (standard library `http.server`): `/` lists the
store's sessions, `/session/<url-quoted id>` is that session's report page
(eventstore.report), built afresh on every request so a reload shows what was appended
since. It binds the loopback address only, answers GET and HEAD only (any other method
gets 405 with `Allow: GET, HEAD`), and refuses a request whose Host header is not the
loopback address it listens on (a web page cannot reach it through DNS rebinding).
It never writes to the store.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote

from eventstore.engines.base import Head
from eventstore.engines.file.engine import FileEngine
from eventstore.errors import (
    EventStoreError,
    InvalidSessionIdError,
    UnknownSessionError,
)
from eventstore.format.crypt import KeyRing
from eventstore.report.page import build_report
from eventstore.store import SessionStore

__all__ = ["HOST", "ReportServer", "serve"]

HOST = "127.0.0.1"

_INDEX_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:50rem;margin:1rem auto;padding:0 1rem;"
    "color:#1b1b1b}a{color:#0b57d0}li{margin:.3rem 0}code{font-size:.9rem}"
)


class _CachelessFileEngine(FileEngine):
    """The file engine keeping no fold caches or checked prefixes: serve never writes
    to the store it shows (its loads would save them once they fold 1 MiB)."""

    def store_cache(self, session_id: str, name: str, head: Head, data: list[bytes]) -> None:
        """Keep nothing."""


class ReportServer(ThreadingHTTPServer):
    """The server: the store it reads, bound to `HOST` on `port` (0: any free port)."""

    daemon_threads = True

    def __init__(self, root: Path, port: int = 0, keys: KeyRing | None = None) -> None:
        if not root.is_dir():
            raise FileNotFoundError(f"no store at {root} (directory not found)")
        self.store = SessionStore(_CachelessFileEngine(root), keys=keys)
        self.lock = threading.Lock()  # one report at a time: two cores, big sessions
        super().__init__((HOST, port), _Handler)

    @property
    def url(self) -> str:
        """The address to open: http://127.0.0.1:PORT/."""
        return f"http://{HOST}:{self.server_address[1]}/"

    def server_close(self) -> None:
        super().server_close()
        self.store.close()


class _Handler(BaseHTTPRequestHandler):
    server: ReportServer
    server_version = "eventstore-serve"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        pass  # quiet: the command prints its address, not every request

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _refuse(self) -> None:
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED,
            b"read-only: GET and HEAD only\n",
            "text/plain",
            extra={"Allow": "GET, HEAD"},
        )

    def __getattr__(self, name: str) -> Callable[[], None]:
        # the base class answers a method it finds no `do_<METHOD>` for with 501 (not
        # implemented); every method but GET and HEAD is one this server does not allow
        if name.startswith("do_"):
            return self._refuse
        raise AttributeError(name)

    def _answer(self, *, head: bool) -> None:
        port = self.server.server_address[1]
        if self.headers.get("Host") not in (f"{HOST}:{port}", f"localhost:{port}"):
            self._send(HTTPStatus.FORBIDDEN, b"wrong Host header\n", "text/plain", head=head)
            return
        path = self.path.split("?", 1)[0]
        if path == "/":
            self._send(HTTPStatus.OK, self._index(), "text/html; charset=utf-8", head=head)
            return
        if not path.startswith("/session/"):
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", head=head)
            return
        session_id = unquote(path.removeprefix("/session/"))
        try:
            with self.server.lock:
                page = build_report(self.server.store, session_id).encode("utf-8")
        except (UnknownSessionError, InvalidSessionIdError):  # (one that cannot exist)
            self._send(HTTPStatus.NOT_FOUND, b"no such session\n", "text/plain", head=head)
            return
        except (EventStoreError, ValueError) as exc:
            text = f"cannot report this session: {exc}\n".encode()
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, text, "text/plain", head=head)
            return
        self._send(HTTPStatus.OK, page, "text/html; charset=utf-8", head=head)

    def _index(self) -> bytes:
        ids = self.server.store.list_sessions()
        items = "".join(
            f'<li><a href="/session/{quote(sid, safe="")}"><code>{html.escape(sid)}</code></a></li>'
            for sid in ids
        )
        root = html.escape(str(self.server.store.root))
        body = items and f"<ul>{items}</ul>" or "<p>No sessions in this store.</p>"
        return (
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\';'
            " style-src 'unsafe-inline'\"><title>eventstore sessions</title>"
            f"<style>{_INDEX_CSS}</style></head><body><h1>Sessions in <code>{root}</code></h1>"
            f"{body}</body></html>"
        ).encode()

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        ctype: str,
        *,
        head: bool = False,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if not head:
            self.wfile.write(body)


def serve(root: Path, port: int, keys: KeyRing | None = None) -> None:
    """Serve `root` until interrupted (Ctrl-C); prints the address first. `keys`: the
    master keys encrypted sessions are shown with (none: their pages say why not)."""
    with ReportServer(root, port, keys) as server:
        print(
            f"serving the reports of {root} at {server.url} (read-only; Ctrl-C stops)", flush=True
        )
        server.serve_forever()

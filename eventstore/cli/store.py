"""Opening the store a command's ROOT names, the one way every `eventstore` command does.

ROOT is a directory path or a store URL (`file://`, `memory://`, `postgresql://`, ...:
whatever `SessionStore` opens). A read never creates a store: a missing directory (or
PostgreSQL schema), or a file where the directory should be, is a one-line error. Custom event
types come from `--event-types MODULE:ATTR` and from the `eventstore.event_types`
entry-point group, so `log`, `state` and `verify` decode them like the built-in ones.
Anything printed about ROOT goes through `shown_root`, which hides a URL's password.
Whether a command's session is unknown is decided one way, `known_session`: from what
the store holds of it, never from a listing.
"""

from __future__ import annotations

import argparse
import importlib
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from eventstore.cli.args import CliError
from eventstore.engines.base import is_conninfo, open_engine, redact_text
from eventstore.errors import InvalidSessionIdError, UnknownSessionError
from eventstore.format.crypt import KeyRing
from eventstore.format.events import Event
from eventstore.ops import audit
from eventstore.session_ids import validate_session_id
from eventstore.store import SessionStore

__all__ = [
    "ENTRY_POINT_GROUP",
    "load_event_types",
    "check_session_id",
    "is_stored",
    "known_session",
    "need_session",
    "need_sessions",
    "open_store",
    "root_hint",
    "shown_root",
    "store_at",
    "store_path",
    "unknown_session",
]

ENTRY_POINT_GROUP = "eventstore.event_types"


# scheme://user:password@ -- the password is everything up to the last @ of the authority
def shown_root(args: argparse.Namespace) -> str:
    """ROOT as it may be printed (a URL's password hidden)."""
    return redact_text(str(args.root))


def store_path(root: str) -> Path | None:
    """The directory ROOT names (a path or a `file://` URL); None for another URL."""
    if is_conninfo(root):
        raise CliError(
            "a libpq key=value connection string is not a store URL: write it as"
            " postgresql://USER:PASSWORD@HOST:PORT/DBNAME (percent-encoded)"
        )
    if "://" not in root:
        return Path(root)
    parts = urlsplit(root)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise CliError(f"a file:// URL names a local path, not host {parts.netloc!r}")
        return Path(unquote(parts.path))
    return None


def load_event_types(specs: Iterable[str]) -> list[type[Event]]:
    """The Event subclasses named by `MODULE:ATTR` specs, then by installed entry points.

    ATTR is an Event subclass or an iterable of them. A spec that does not load is a
    CliError naming it.
    """
    found: list[type[Event]] = []
    for spec in specs:
        module, _, attr = spec.partition(":")
        if not module or not attr:
            raise CliError(f"--event-types wants MODULE:ATTR, not {spec!r}")
        try:
            obj: object = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except ImportError as exc:
            raise CliError(f"--event-types {spec}: cannot import {module!r}: {exc}") from None
        except AttributeError:
            raise CliError(f"--event-types {spec}: {module!r} has no {attr!r}") from None
        found += _event_classes(obj, f"--event-types {spec}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plug-in names itself instead of a traceback
            raise CliError(f"entry point {ep.name} ({ep.value}) failed to load: {exc}") from None
        found += _event_classes(obj, f"entry point {ep.name} ({ep.value})")
    unique: dict[type[Event], None] = dict.fromkeys(found)
    return list(unique)


def _event_classes(obj: object, where: str) -> list[type[Event]]:
    items = [obj] if isinstance(obj, type) else obj
    if not isinstance(items, Iterable) or isinstance(items, (str, bytes)):
        raise CliError(f"{where}: not an Event subclass or a list of them: {obj!r}")
    out: list[type[Event]] = []
    for item in items:
        if not (isinstance(item, type) and issubclass(item, Event)):
            raise CliError(f"{where}: {item!r} is not an Event subclass")
        out.append(item)
    return out


def open_store(args: argparse.Namespace, *, create: bool = False, **options: Any) -> SessionStore:
    """The store `args.root` names, knowing `args.event_types` and the plug-in types
    (`options`: more `SessionStore` arguments, e.g. a signing key).

    ROOT is a directory, a `file://` URL, or any store URL an engine serves (memory://,
    postgresql://...). Refuses (CliError) a path that does not exist (unless `create`)
    or is not a directory, without creating anything; another URL's engine is opened
    with `create` too (a PostgreSQL schema that is not there is a `StorageError`).
    """
    root = str(args.root)
    if not root:
        raise CliError("ROOT is empty: give a store directory or URL")
    path = store_path(root)
    if path is not None and not create:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise CliError(f"no store at {path} (directory not found)") from None
        except NotADirectoryError:
            raise CliError(f"no store at {path} (a part of the path is a file)") from None
        if not stat.S_ISDIR(st.st_mode):
            raise CliError(f"{path} is a file, not a store directory")
    types = load_event_types(getattr(args, "event_types", None) or [])
    # another URL (memory://, postgresql://) goes to the engine it names, which refuses
    # what it cannot open with a typed error
    files = getattr(args, "key_files", None) or []
    if files:
        options.setdefault("keys", KeyRing.load(*files))
    return store_at(root if path is None else path, create=create, event_types=types, **options)


def store_at(root: str | Path, *, create: bool, **options: Any) -> SessionStore:
    """The store at `root` (a path or any store URL), its engine opened with `create`
    (False for a command that only reads it: a store that is not there, a directory or
    a PostgreSQL schema, is a `StorageError` rather than made); `options` go to
    `SessionStore`."""
    engine = open_engine(root, create=create)
    try:
        return SessionStore(engine, **options)
    except BaseException:
        engine.close()  # (a store given an engine leaves it open when it fails to open)
        raise


def root_hint(args: argparse.Namespace) -> str | None:
    """Where the store probably is when ROOT (a path) holds no session but lies inside a
    store: a store's `sessions` folder, or one session's folder (each holds a
    `log.jsonl`). None otherwise, and for a URL of another engine."""
    path = store_path(str(args.root))
    if path is None:
        return None
    if path.parent.name == "sessions" and (path / "log.jsonl").is_file():
        store, what = path.parent.parent, "one session's folder"
    elif path.name == "sessions" and any(
        (child / "log.jsonl").is_file() for child in _first_dirs(path, 20)
    ):
        store, what = path.parent, "the sessions folder of a store"
    else:
        return None
    return f"{path} is {what}; the store is {store} (try: eventstore {args.command} {store})"


def _first_dirs(path: Path, n: int) -> list[Path]:
    """Up to `n` subdirectories of `path` (no links followed), in no order."""
    found: list[Path] = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    found.append(Path(entry.path))
                    if len(found) == n:
                        break
    except OSError:
        pass
    return found


def is_stored(store: SessionStore, session_id: str) -> bool:
    """Whether anything of `session_id` is stored (a live log, an archived segment, a
    tombstone), listed or not: the test the library's own calls make before raising
    UnknownSessionError (`eventstore.ops.history.require_history`), never a listing's
    (a Redis session whose head was deleted from outside is listed nowhere, yet its log
    is there: its reads report the damage)."""
    return bool(audit.history_files(store.core, session_id))


def need_session(store: SessionStore, session_id: str, shown: str) -> None:
    """CliError (exit 2) unless anything of `session_id` is stored (`is_stored`);
    `shown` is ROOT as printed."""
    need_sessions(store, [session_id], shown)


def need_sessions(store: SessionStore, session_ids: Iterable[str], shown: str) -> None:
    """CliError (exit 2) naming the first of `session_ids` nothing of which is stored."""
    for sid in session_ids:
        check_session_id(sid)
        if not is_stored(store, sid):
            raise unknown_session(sid, shown)


@contextmanager
def known_session(
    store: SessionStore, session_id: str, shown: str, *, check_first: bool = True
) -> Iterator[None]:
    """Run a one-session command's library calls on `session_id`; the one way every such
    command decides that the session is unknown (CliError, exit 2, `unknown_session`):
    the library says so (UnknownSessionError) and nothing of the session is stored. No
    listing is asked: a session a listing misses but whose log is there is read, and its
    damage reported, as the library reports it. `check_first`: ask the store first
    (`need_session`), for calls that give a session nothing of which is stored the empty
    state (or, `follow`, wait for it) instead of raising; False for those that raise
    (verify, repair, stats, export). An UnknownSessionError while something is stored
    (repair of a session with an archive but no live log) keeps the library's words."""
    check_session_id(session_id)
    try:
        if check_first:
            need_session(store, session_id, shown)
        yield
    except UnknownSessionError:
        if is_stored(store, session_id):
            raise
        raise unknown_session(session_id, shown) from None


def check_session_id(session_id: str) -> None:
    """CliError (exit 2) unless `session_id` is a valid session id."""
    try:
        validate_session_id(session_id)
    except InvalidSessionIdError as exc:
        raise CliError(str(exc)) from None


def unknown_session(session_id: str, shown: str) -> CliError:
    """The CliError (exit 2) for a session the store has nothing of; `shown` is ROOT."""
    return CliError(f"unknown session {session_id!r} in {shown} (see: eventstore sessions {shown})")

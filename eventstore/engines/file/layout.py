"""The store root on disk: where each session lives, and private files and directories.

    <root>/sessions/<session dir>/log.jsonl     the session's event log
    <root>/sessions/<session dir>/log.lock      the writers' lock (the log itself is replaced)
    <root>/sessions/<session dir>/archive/      old logs kept by compaction
    <root>/sessions/<session dir>/id            the original id, when the name is a hash

A session dir is the id itself when the id is ordinary (`[A-Za-z0-9][A-Za-z0-9._-]*`,
up to 128 bytes), `_` + lowercase base32 of its UTF-8 for other ids up to 150 bytes, and
`~` + SHA-256 hex for longer ones (with the `id` file). Neither `_` nor `~` can start an
ordinary id, so the three forms never collide, and no form contains a path separator.
Everything is created 0700/0600 from the start and never through a symlink.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

from eventstore import entropy
from eventstore.errors import (
    InvalidSessionIdError,
    StorageError,
    UnsafePathError,
)
from eventstore.session_ids import MAX_SESSION_ID_BYTES, validate_session_id

__all__ = [
    "SessionPaths",
    "decode_session_dir",
    "ensure_private_dir",
    "fd_path",
    "NotAFileError",
    "fsync_dir",
    "open_private",
    "session_dir_name",
    "write_all",
    "write_atomically",
]

_ORDINARY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_VERBATIM_MAX = 128
_BASE32_MAX = 150
DIR_MODE = 0o700
FILE_MODE = 0o600
SESSIONS_DIR = "sessions"
LOG_NAME = "log.jsonl"
LOCK_NAME = "log.lock"
JOURNAL_NAME = "log.journal"  # durability="fsync" (eventstore.engines.file.journal)
ARCHIVE_DIR = "archive"
ID_FILE = "id"


def session_dir_name(session_id: str) -> str:
    """The directory name of a (valid) session id; see the module docstring."""
    raw = session_id.encode("utf-8")
    if len(raw) <= _VERBATIM_MAX and _ORDINARY.match(session_id):
        return session_id
    if len(raw) <= _BASE32_MAX:
        return "_" + base64.b32encode(raw).decode("ascii").rstrip("=").lower()
    return "~" + hashlib.sha256(raw).hexdigest()


def decode_session_dir(name: str, directory: Path) -> str | None:
    """The original id of a session directory, or None if `name` is not one of ours:
    also when what it decodes to is no session id, or one whose directory is another
    (an `id` file edited or copied from elsewhere, a base32 name of an ordinary id),
    which would list an id twice, or one that loads from another directory."""
    found = _decoded_dir(name, directory)
    if found is None:
        return None
    try:
        validate_session_id(found)
    except InvalidSessionIdError:
        return None
    return found if session_dir_name(found) == name else None


def _decoded_dir(name: str, directory: Path) -> str | None:
    """What a session directory's name (or, for a hashed one, its `id` file) says."""
    if name.startswith("_"):
        body = name[1:].upper()
        try:
            return base64.b32decode(body + "=" * (-len(body) % 8)).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None
    if name.startswith("~"):
        try:
            fd = open_private(directory / ID_FILE, os.O_RDONLY)
        except (OSError, UnsafePathError):
            return None  # no id file, or a planted link or FIFO: not a session of ours
        try:
            return os.read(fd, 4 * MAX_SESSION_ID_BYTES).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        finally:
            os.close(fd)
    return name if _ORDINARY.match(name) else None


def _refuse_symlink(path: Path) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path} is a symlink; eventstore never follows links in a store")
    return st


def ensure_private_dir(path: Path) -> None:
    """Create `path` mode 0700 (its parent must exist); refuse a symlink or a non-directory."""
    st = _refuse_symlink(path)
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(f"{path} exists and is not a directory")
        return
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        _refuse_symlink(path)


class NotAFileError(UnsafePathError):
    """Something other than a regular file (a FIFO, a directory, a socket, a device) is
    where a store keeps a file."""


def open_private(path: Path, flags: int) -> int:
    """os.open of a store's file: never through a link (UnsafePathError), mode 0600 on
    creation, without blocking (a FIFO planted at the name would hang the open), and
    nothing but a regular file (NotAFileError)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, FILE_MODE)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the last component is a symlink
            raise UnsafePathError(
                f"{path} is a symlink; eventstore never follows links in a store"
            ) from None
        raise
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise NotAFileError(f"{path} is not a regular file; eventstore keeps only files there")
    return fd


def write_all(fd: int, data: bytes, *, fsync: bool = False) -> None:
    """Write all of `data` (os.write may write less than asked), then fsync if asked."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    if fsync:
        os.fsync(fd)


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of `data` at `offset` (os.pwrite may write less than asked)."""
    done = os.pwrite(fd, data, offset)  # one call: the usual case
    while done < len(data):
        done += os.pwrite(fd, memoryview(data)[done:], offset + done)


def pread_all(fd: int, n: int, offset: int) -> bytes:
    """`n` bytes of `fd` from `offset` (os.pread may return fewer); fewer only at the end."""
    if n <= 0:
        return b""
    buf = os.pread(fd, n, offset)
    if len(buf) == n:
        return buf
    parts = [buf]
    got = len(buf)
    while got < n:
        chunk = os.pread(fd, n - got, offset + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


# fdatasync flushes the data and the size (all a reader needs), not the times: ~10%
# faster per append than fsync on Linux; platforms without it (macOS) fall back to fsync
_HAS_FDATASYNC = hasattr(os, "fdatasync")


def datasync(fd: int) -> None:
    """Flush a file's data (and size) to the disk: fdatasync where there is one."""
    if _HAS_FDATASYNC:
        os.fdatasync(fd)
    else:
        os.fsync(fd)


def fd_path(fd: int) -> str | None:
    """Where the kernel says the file open at `fd` is (" (deleted)" appended once it was
    unlinked or renamed over, another path once its directory was renamed); None where
    there is no /proc (the caller then stats). Asks for no file times, unlike a stat."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or create inside it survives power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


TMP_MARK = ".tmp-"
"""Temporary files of `write_atomically` are named `<name>.tmp-<hex>` beside `<name>`."""


def write_atomically(
    path: Path,
    data: bytes | list[bytes],
    *,
    before_replace: Callable[[], None] | None = None,
    durable: bool = True,
    exclusive: bool = False,
) -> None:
    """Replace (or create) `path` with `data` so that a crash leaves the old or the new.

    The one temp-file + fsync + rename writer: `data` (bytes, or a list of pieces
    written in order) goes to a private temporary file
    beside `path`, which is fsynced and renamed over `path`, then the directory is
    fsynced. `before_replace` runs after the temporary file is durable and before the
    rename (compaction links the old log into its archive there). On any failure the
    temporary file is removed and the error propagates; `path` is unchanged.
    `durable=False` (caches, which only save time and check themselves): no fsync,
    and the old file is unlinked before the rename, so a reader finds the old, none,
    or the new, never part of one (a failed rename leaves none); a power loss may leave
    an empty or a partial file, which its reader ignores. `exclusive`: create `path`
    only, never replace it (the temporary file is linked in, not renamed over):
    `FileExistsError` if it exists, and it is left as it was.
    """
    # the name's first 120 bytes: a legal 250-byte name must not make an illegal temp one
    head = os.fsencode(path.name)[:120]  # (bytes: a name need not be UTF-8)
    tmp = path.with_name(f"{os.fsdecode(head)}{TMP_MARK}{entropy.token_hex()}")
    try:
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            for piece in [data] if isinstance(data, bytes) else data:
                write_all(fd, piece)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if before_replace is not None:
            before_replace()
        if not durable:
            # ext4 (auto_da_alloc) starts writing a file renamed over another back at
            # once: ~90 us a rename, 10x one onto a free name
            # (bench/results/2026-12-05-cache-rename-and-append-path.md)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if exclusive:
            os.link(tmp, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


class SessionPaths:
    """The files of one session under a store root. A long-running process keeps one
    for every session it has open: the paths used only when a session is opened,
    recovered or archived are made when asked for (a `Path` kept is ~280 bytes)."""

    __slots__ = (
        "_checks",
        "dir",
        "dir_str",
        "lock_str",
        "log",
        "log_str",
        "session_id",
    )

    def __init__(self, root: Path, session_id: str) -> None:
        self.session_id = session_id
        self.dir = root / SESSIONS_DIR / session_dir_name(session_id)
        self.log = self.dir / LOG_NAME
        self.log_str = os.fspath(self.log)  # for the append hot path's lstat
        self.dir_str = os.fspath(self.dir)  # (and the fsync one's)
        self.lock_str = os.path.join(self.dir_str, LOCK_NAME)  # (and its lock check)
        # the paths checked on every operation, as str: pathlib's conversions cost more
        # than the lstat calls themselves on the hot path
        checks = [os.fspath(self.dir.parent), os.fspath(self.dir)]
        if self.dir.name.startswith("~"):
            checks.append(os.fspath(self.dir / ID_FILE))
        self._checks = tuple(checks)

    @property
    def lock(self) -> Path:
        """The writers' lock file (`lock_str`, as a path)."""
        return Path(self.lock_str)

    @property
    def journal(self) -> Path:
        """The durable appends' journal (`eventstore.engines.file.journal`)."""
        return self.dir / JOURNAL_NAME

    @property
    def archive(self) -> Path:
        """The directory of archived segments."""
        return self.dir / ARCHIVE_DIR

    def check_no_links(self) -> None:
        """Raise UnsafePathError if the sessions dir or this session's dir is a symlink."""
        for path in self._checks[:2]:
            try:
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    _refuse_symlink(Path(path))
            except FileNotFoundError:
                return
            except OSError as exc:  # EACCES, ELOOP, EIO...: an error of ours, typed
                raise StorageError(f"{path}: cannot be read: {exc.strerror}", exc.errno) from exc

    def create(self) -> None:
        """Create the session directory (and its `id` file when the name is a hash)."""
        try:  # the usual case: everything exists and is what it should be
            sessions_dir, session_dir, *id_file = self._checks
            if (
                stat.S_ISDIR(os.lstat(sessions_dir).st_mode)
                and stat.S_ISDIR(os.lstat(session_dir).st_mode)
                and all(stat.S_ISREG(os.lstat(p).st_mode) for p in id_file)
            ):
                return
        except FileNotFoundError:
            pass
        ensure_private_dir(self.dir.parent)
        ensure_private_dir(self.dir)
        if self.dir.name.startswith("~"):
            id_path = self.dir / ID_FILE
            if _refuse_symlink(id_path) is None:
                write_atomically(id_path, self.session_id.encode("utf-8"))


def list_session_ids(root: Path) -> list[str]:
    """The original ids of every session under `root` that has a log, sorted."""
    base = root / SESSIONS_DIR
    try:
        _refuse_symlink(base)  # (scandir follows a link)
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorageError(f"{base}: cannot be listed: {exc.strerror}", exc.errno) from exc
    ids: list[str] = []
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        sid = decode_session_dir(entry.name, Path(entry.path))
        if sid is not None and os.path.lexists(os.path.join(entry.path, LOG_NAME)):
            ids.append(sid)
    return sorted(ids)

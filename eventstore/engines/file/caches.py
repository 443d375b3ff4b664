"""The file engine's caches: `fold-<projection>.cache` beside a session's log, the face's
fold caches and checked prefixes (their bytes: `eventstore.core.fold_cache`,
`eventstore.core.checked_prefix`), and `fold-<projection>.<k>.cache`, the parts of a
cache kept in pieces (`name#k`: the transcript's chunks), which `remove_cache_parts`
finds by that name.

The engine's part of a cache file is its first line: where in the log the state was
folded to (the offset, the last line's seq, link and `h`, the log's first seq), the `h`
of the snapshot the log opens with, if it does, and the lock file's generation. Not the
log's device and inode: a copy of the session directory (`cp -a`, a backup restored)
is the same log, and its caches serve it. A cache is given back only while the
generation is the live one and that point, with every byte before it, is still the
live log's:

- the `h` before the position hashes every line before it back to the log's first
  line, or to the snapshot that opens it (the lines after a snapshot chain to its
  `base_h`), whose own `h` is recorded beside it: so the bytes the state was folded
  from are the live log's bytes before the position;
- the generation, which every replacer of the log (compaction, repair, removal)
  bumps under the writers' lock *before* it replaces the log, is the one read before
  the log the state was folded from was opened (`FilePosition.gen`; a writer's own,
  exact). A replacement that began after that read moved it: the cache is ignored,
  whatever the new log holds. One under way at that read (bumped, not yet renamed)
  leaves the generation of the log it installs on a cache of the log it replaced; such
  a cache is accepted only where the bytes before its position are the new log's
  too (the point above), so it describes the new log exactly.

The parts of a cache (`open_cache_parts`: the transcript's chunks) are opened with the
same care (no link followed, a regular file of bounded size, the engine's line of this
format) but without that check: the face opens only the parts a cache it checked lists,
each bound to its listed head and checksum (`CachingEngine.open_cache_parts`), which
spares a cold load a log open and read per part.

A cache the check refuses is ignored, never an error, as is one of another format
(`_FORMAT`: caches bound to an inode, before it, have no `format`). Caches are written
atomically without fsync: a cache checks itself, and a power loss costs a rebuild.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from eventstore.engines.base import CacheReader, Head, cache_part_name
from eventstore.engines.file.layout import (
    SessionPaths,
    open_private,
    pread_all,
    write_atomically,
)
from eventstore.engines.file.logfile import FilePosition, in_live_log, read_generation
from eventstore.errors import StorageError, UnsafePathError
from eventstore.logger import log

__all__ = [
    "CACHE_PREFIX",
    "FileCacheReader",
    "cache_file_name",
    "cache_path",
    "open_cache",
    "open_cache_parts",
    "remove_cache_parts",
    "store_cache",
]


class FileCacheReader(CacheReader):
    """The part of a cache file after the engine's line, read front to back by `pread`
    (a descriptor of its own: a load reads a long cache a frame at a time)."""

    def __init__(self, fd: int, start: int, size: int) -> None:
        self._fd = fd
        self._at = start
        self.size = size
        self._end = start + size

    def read(self, n: int) -> bytes:
        """The next `n` bytes (fewer only at the end, or if the file was cut meanwhile)."""
        n = max(0, min(n, self._end - self._at))
        try:
            data = pread_all(self._fd, n, self._at)
        except OSError:
            data = b""  # read as the end: whoever reads checks what it got
        self._at += len(data)
        return data

    def close(self) -> None:
        """Close the descriptor."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class _CacheHead(msgspec.Struct):
    """Where in the log a fold cache's head is (the file engine's part of the file)."""

    format: int
    gen: int
    opening: str
    offset: int
    seq: int
    link: str
    h: str
    base_seq: int


_cache_head_decoder = msgspec.json.Decoder(_CacheHead)

_FORMAT = 2
"""Bump when the engine's line changes: a line of another format is ignored (1, which
had no `format`: bound to the log's device and inode)."""

_MAX_CACHE_BYTES = 1 << 30  # a cache larger than this is not one we wrote: ignored

_CACHE_HEAD_MAX = 4096  # the engine's line of a cache is shorter (ints, two 16-hex)

CACHE_PREFIX = "fold-"

_PLAIN_NAME = re.compile(r"[a-z0-9_]{1,64}\Z")


_DIGITS = re.compile(r"[0-9]{1,9}\Z")
_PART_NAME = re.compile(r"(.+)#([0-9]{1,9})\Z", re.DOTALL)


def _stem(name: str) -> str:
    if not _PLAIN_NAME.match(name):
        name = "x" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return CACHE_PREFIX + name


def cache_file_name(name: str) -> str:
    """The cache file of a projection: its name when plain, else a digest of it; part k
    of a cache (`name#k`: `CachingEngine.remove_cache_parts`) adds `.k` to its stem."""
    part = _PART_NAME.match(name)
    if part is not None:
        return f"{_stem(part[1])}.{int(part[2])}.cache"
    return f"{_stem(name)}.cache"


def cache_path(paths: SessionPaths, name: str) -> Path:
    """Where the session's cache `name` is kept."""
    return paths.dir / cache_file_name(name)


def open_cache(paths: SessionPaths, name: str) -> tuple[Head, CacheReader] | None:
    """`<session dir>/fold-<name>.cache`, if its position is still in the live log:
    the live generation, at least that long, the `h` before it, the same first seq and
    opening snapshot (see the module docstring)."""
    return _opened(paths, name, lambda fd, size: _cache_position(fd, size, paths))


def open_cache_parts(
    paths: SessionPaths, name: str, count: int
) -> Iterator[tuple[Head, CacheReader] | None]:
    """The files of the parts `name#0` .. `name#<count - 1>`, in order, opened as
    `open_cache` opens a cache, without its generation read and live-log check
    (`CachingEngine.open_cache_parts` says why the face needs none). The head given
    back names no log (its position's file is (0, 0)): it is for comparing only."""
    for k in range(count):
        yield _opened(paths, cache_part_name(name, k), _part_position)


def _opened(
    paths: SessionPaths,
    name: str,
    locate: Callable[[int, int], tuple[FilePosition, int, int] | None],
) -> tuple[Head, CacheReader] | None:
    """The cache file `name`, opened safely (no link followed; a FIFO must not hang
    the load), and a reader of its face bytes, if `locate` finds its position; `locate`
    gets the descriptor and the file's size and says where its head is and its face
    bytes start and how many there are."""
    path = cache_path(paths, name)
    paths.check_no_links()
    try:
        fd = open_private(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnsafePathError) as exc:
        log.warning("eventstore: %s: fold cache ignored: %s", path, exc)
        return None
    try:
        size = _checked_size(fd, path)
        found = None if size is None else locate(fd, size)
    except OSError:
        found = None
    except BaseException:
        os.close(fd)
        raise
    if found is None:
        os.close(fd)
        return None
    pos, start, size = found
    return pos.head(), FileCacheReader(fd, start, size)


def _checked_size(fd: int, path: Path) -> int | None:
    """The size of the file open at `fd` (a regular file: `open_private`), if it may be
    a cache: no larger than a cache gets (checked before anything is read: a file
    planted there may be huge)."""
    st = os.fstat(fd)
    if st.st_size > _MAX_CACHE_BYTES:
        log.warning("eventstore: %s: fold cache ignored: %d bytes", path, st.st_size)
        return None
    return st.st_size


def _engine_line(fd: int, size: int) -> tuple[_CacheHead, int, int] | None:
    """The engine's line of the cache open at `fd` (a regular file of `size` bytes,
    bounded: `_checked_size`), if it is of this format, and where its face bytes start
    and how many there are."""
    first = pread_all(fd, min(size, _CACHE_HEAD_MAX), 0)
    nl = first.find(b"\n")
    if nl < 0:
        return None
    try:
        c = _cache_head_decoder.decode(first[:nl])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if c.format != _FORMAT or c.gen < 0:
        return None
    return c, nl + 1, size - nl - 1


def _position(c: _CacheHead) -> FilePosition:
    """The position the engine's line `c` names, in no log checked yet."""
    return FilePosition((0, 0), c.offset, c.seq, c.link, c.h, c.base_seq, c.offset, c.gen)


def _part_position(fd: int, size: int) -> tuple[FilePosition, int, int] | None:
    """`_cache_position` without the generation and live-log check (a cache part)."""
    found = _engine_line(fd, size)
    return None if found is None else (_position(found[0]), found[1], found[2])


def _cache_position(
    fd: int, size: int, paths: SessionPaths
) -> tuple[FilePosition, int, int] | None:
    """Where in the live log the cache open at `fd` (`size` bytes) was folded to, and
    where its face bytes start and how many there are; None for a file that is no
    cache of the live log."""
    found = _engine_line(fd, size)
    if found is None:
        return None
    c, start, size = found
    # the generation before the log is opened: the order a fold reads them in
    if read_generation(paths) != c.gen:
        return None
    pos = _position(c)
    live = in_live_log(paths.log, pos, c.opening)
    if live is None:
        return None
    # the head names the log checked: a read from it finds a log replaced since
    return msgspec.structs.replace(pos, ident=live[0]), start, size


def store_cache(paths: SessionPaths, name: str, head: Head, data: list[bytes]) -> None:
    """Write the cache file atomically (0600), with where in the log `head` is; nothing
    for a head of no file log, or a session without a log."""
    pos = head.position
    if not isinstance(pos, FilePosition):
        return
    paths.check_no_links()
    if not os.path.lexists(paths.log):
        return  # a call that writes nothing creates nothing
    if pos.gen < 0:
        return  # a place read under an unknown generation: its cache could not be checked
    # the log folded, if still live (its opening snapshot's `h` is read from it, so it
    # must be that file): a cache of a log replaced since would never be used
    try:
        live = in_live_log(paths.log, pos)
    except (OSError, StorageError):
        return  # unchecked: unsaved, as if it failed to write
    if live is None or live[0] != pos.ident:
        return
    c = _CacheHead(_FORMAT, pos.gen, live[1], pos.offset, pos.seq, pos.link, pos.h, pos.base_seq)
    try:
        write_atomically(
            cache_path(paths, name),
            [msgspec.json.encode(c) + b"\n", *data],
            durable=False,  # a cache checks itself: a power loss costs a rebuild
        )
    except (FileNotFoundError, NotADirectoryError):
        pass  # the session was removed meanwhile


def remove_cache_parts(paths: SessionPaths, name: str, start: int) -> None:
    """Remove the files of the parts `name#k`, k >= `start`, of the session's cache."""
    paths.check_no_links()
    prefix = _stem(name) + "."
    try:
        entries = os.listdir(paths.dir)
    except (FileNotFoundError, NotADirectoryError):
        return  # the session was removed meanwhile
    for entry in entries:
        k = entry[len(prefix) : -len(".cache")]
        ours = entry.startswith(prefix) and entry.endswith(".cache") and _DIGITS.match(k)
        if ours and int(k) >= start:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(paths.dir / entry)

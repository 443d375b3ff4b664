"""The key slots of a file store (`eventstore.engines.base.KeyEngine`): one small file
per encrypted session's data key, outside the session directories.

    <root>/keys/<data key id>      the slot: the data key wrapped by master keys

A slot is created by linking a durable temporary file to its name (the link fails if
another writer got there first: both agree on one key), replaced atomically
(`write_atomically`), files 0600 in a 0700 directory. Replacing a slot unlinks the old
file; the bytes it held may remain in free blocks of the file system until reused
(docs/encryption.md says what crypto-shredding reaches). A slot is removed only if it holds
given bytes (a forgotten key's record), and `rekey` replaces one only if it still holds
what it read, each under an exclusive `flock` of `<root>/keys/.lock` that every replacer
and remover takes: a slot is created only where none is (never where a compare expects
bytes), so between a compare and the write after it the slot can change only by another
replacer's or remover's hand, which the lock excludes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eventstore import entropy
from eventstore.engines.file.layout import (
    TMP_MARK,
    ensure_private_dir,
    fsync_dir,
    open_private,
    write_all,
    write_atomically,
)
from eventstore.engines.file.session import lock_exclusive
from eventstore.errors import InvalidArgumentError

__all__ = ["create_slot", "list_slots", "load_slot", "remove_slot", "replace_slot"]

KEYS_DIR = "keys"
_LOCK_NAME = ".lock"  # (not a slot's name: `list_slots` skips it)
_SLOT_NAME = re.compile(r"[0-9a-f]{20}\Z")


def _path(root: Path, dk: str) -> Path:
    if not _SLOT_NAME.match(dk):  # (a data key id: 20 hex digits, never a path)
        raise InvalidArgumentError(f"{dk!r} is not a data key id")
    return root / KEYS_DIR / dk


def load_slot(root: Path, dk: str) -> bytes | None:
    """The bytes of slot `dk`, None if there is none."""
    try:
        fd = open_private(_path(root, dk), os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def create_slot(root: Path, dk: str, data: bytes) -> bool:
    """Create slot `dk` unless it exists (False then); durable when True."""
    path = _path(root, dk)
    ensure_private_dir(path.parent)
    tmp = path.with_name(f"{dk}{TMP_MARK}{entropy.token_hex()}")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        try:
            write_all(fd, data, fsync=True)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        os.unlink(tmp)


def replace_slot(root: Path, dk: str, data: bytes, expected: bytes | None = None) -> bool:
    """Replace slot `dk` atomically and durably (with `expected`: only if it holds
    exactly that, else False and nothing changes), then remove any temporary file of it
    a killed writer left (it would hold a wrapped copy that outlives `forget_key`)."""
    path = _path(root, dk)
    ensure_private_dir(path.parent)
    with _slots_locked(path.parent):
        if expected is not None and load_slot(root, dk) != expected:
            return False
        write_atomically(path, data)
        # under the lock: another replacer's temporary file is never taken for a leftover
        prefix = f"{dk}{TMP_MARK}"
        for name in os.listdir(path.parent):
            if name.startswith(prefix):
                try:
                    os.unlink(path.parent / name)
                except FileNotFoundError:
                    pass  # (another process removed it)
        return True


def list_slots(root: Path) -> list[str]:
    """The ids of every slot."""
    try:
        names = os.listdir(root / KEYS_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if _SLOT_NAME.match(n))


def remove_slot(root: Path, dk: str, data: bytes) -> bool:
    """Remove slot `dk` if it holds exactly `data` (False: it holds other bytes, or
    none); durable when True."""
    path = _path(root, dk)
    ensure_private_dir(path.parent)
    with _slots_locked(path.parent):
        if load_slot(root, dk) != data:
            return False
        os.unlink(path)
        fsync_dir(path.parent)
        return True


@contextmanager
def _slots_locked(keys_dir: Path) -> Iterator[None]:
    """The exclusive `flock` of `<keys_dir>/.lock`, held by every replacer and remover
    (so a compare and the write after it are one step for every other process)."""
    fd = open_private(keys_dir / _LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        lock_exclusive(fd)
        yield
    finally:
        os.close(fd)  # (closing releases the lock)

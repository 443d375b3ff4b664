"""Crash-state exploration for code that writes files: record, model, enumerate, materialise.

The approach is ALICE's ("All File Systems Are Not Created Equal", Pillai et al., OSDI '14):
run a workload once on a real directory while recording every file-system operation it
makes and every acknowledgement it received; then, for each prefix of the recorded
operations (a crash after operation k), build the directory trees a power loss could
leave under a persistence model, and hand each one to a checker.

Nothing here knows eventstore: `Recorder` wraps the `os` functions any Python engine
uses, so another engine that writes files through `os` is explored the same way.

Recording (`Recorder`, a context manager over one directory, the root)
    For the duration of the workload these `os` functions are wrapped: `open` (with
    O_CREAT / O_EXCL / O_APPEND / O_TRUNC, `dir_fd` too), `write`, `pwrite`, `writev`,
    `pwritev`, `sendfile` and `copy_file_range` (the bytes that landed), `ftruncate`,
    `truncate`, `posix_fallocate` (a size it grows), `fsync`, `fdatasync`, `rename`,
    `replace` (a directory's too: the names under it move), `link`, `unlink`, `remove`,
    `mkdir` (so `os.makedirs` too), `rmdir`, `close`. Each call goes through to the
    real function, and what it changed under the root is appended to the trace as an
    `Op`, against a logical inode (hard links share one; the store's compaction links
    the live log into its archive). An fsync of an fd opened on a directory is a
    `dirsync`. The workload calls `rec.ack(label, payload)` after each call it
    considers acknowledged; that marker is part of the trace, so every crash point
    knows what had been acknowledged before it. What existed under the root when
    recording started is the durable initial state.
    What the wrappers cannot record fails the workload loudly (AssertionError): a
    write, truncate or sync under the root through a descriptor the recorder did not
    open (opened before recording, `os.dup`-ed), and, through an audit hook
    (`sys.addaudithook`), the builtin `open` in a writing mode (so `shutil.copyfile`,
    `Path.write_bytes`) and any `mmap` of a file under the root. C extensions writing
    through their own calls would still be missed: `Recorder.self_check()` replays the
    whole trace and compares it with the real tree, byte for byte.
    `Recorder(root, unmodelled=(name, ...))` leaves files by those name prefixes out of
    the trace and the check, as if outside the root: for files another program keeps
    crash-safe its own way (eventstore's session index, a SQLite file).

The two persistence models (`EXT4_ORDERED`, `STRICT`)
    Common to both: a crash after op k keeps everything made durable before it and
    nothing after it. `fsync`/`fdatasync` of a file makes every earlier data operation
    (write, truncate) on that inode durable (its size included; fdatasync is treated
    like fsync, as Linux persists the size with the data). A directory operation
    (create, mkdir, link, unlink, rmdir, rename) is durable once every directory it
    changes has been fsynced after it (`dirsync`). An fsync of a file does *not* make
    its name durable, and an fsync of a directory does not make the directory's own
    entry in its parent durable. Names are bindings name -> inode: replaying a rename
    binds the destination to the inode and unbinds the source only if the source still
    names that inode; renaming a directory moves every name under it (a flat model:
    an operation inside a renamed directory names it by its path at the time, so under
    `STRICT` a later one whose directory's rename was undone is lost with it, one of
    the states a real file system allows, not all of them).

    `EXT4_ORDERED`: Linux ext4 with data=ordered (the default), after the persistence
    properties the ALICE study reports for ext4 in ordered mode (directory operations
    atomic and ordered; appends not ordered against later operations, because of
    delayed allocation, except a rename over an existing file; appended content never
    garbage; a multi-block append not atomic), made precise:
    - directory operations are journaled in program order, so what survives is a
      prefix of them: all the durable ones and any prefix of the rest;
    - data written and not yet fsynced is not ordered against directory operations
      (delayed allocation: a new file's name can survive while its data does not),
      except that a rename replacing an existing file persists the data written to the
      renamed file before it (ext4's auto_da_alloc; ALICE: "append -> rename" ordered);
    - per file, unsynced appends and truncates persist as a prefix (appends are not
      reordered against each other: the on-disk size only grows as data reaches disk),
      and the last one persisted may be torn at any byte — a prefix of its bytes, never
      garbage (ALICE: append content atomic in ordered mode, multi-block appends not);
    - in-place overwrites (writes within the file's size: the lock file's head, the
      journal's header and mirror) are not ordered, against each other or the appends:
      each is kept, dropped or torn on its own (ALICE: ext4 does not order them;
      `Model.overwrites_in_order` puts them back in the prefix).
    We do not assume ext4's stronger real behaviour that any fsync commits the whole
    journal (which would make every earlier directory operation durable). ALICE's own
    default explorer (alicedefaultfs.py) is weaker than ext4 and closer to `STRICT`:
    an append may show zeros or garbage before its data, and any one operation may be
    left out of a prefix, with dependencies only through fsync.

    `STRICT`: anything not fsynced may be lost or torn, independently, in any order:
    - each unsynced write is dropped, persisted, torn at any byte (a prefix of it),
      persisted as zeros (the size reached disk, the data did not), persisted as
      non-zero garbage (ext4 data=writeback, ALICE's default: blocks allocated, never
      written; `GARBAGE`, bytes >= 0x80, so no newline); with `block_tears`
      (`STRICT_BLOCKS`), a write spanning several 4 KiB blocks may also persist but
      for one of its blocks (its old bytes stay, zeros past the old end); a dropped
      earlier write under a
      persisted later one leaves a hole of zeros; each unsynced truncate is kept or
      dropped;
    - each directory operation not followed by an fsync of its directory(ies) is kept
      or undone independently of the others (a later one may survive an earlier one).
    Not modelled by either: a write persisted as any subset of its blocks beyond one
    hole, garbage mixed with data inside one write, a rename persisted half-way (ALICE's
    "destination unlinked, source kept"), or a device that lies about fsync.

Enumeration (`explore`)
    For each crash point k (0 .. len(trace)) the pending choices are the unsynced data
    operations and the non-durable directory operations. When the product of their
    alternatives is at most `exhaustive` the states are enumerated exhaustively (torn
    writes at representative bytes: just after and just before each newline in the
    write, its middle, its first byte, its last byte, up to `max_cuts`); above that,
    `samples` states are drawn at random (a tear at one of the representative bytes or
    at any byte, equally likely), seeded, always with
    the two extremes (everything kept, everything lost). Identical trees with the same
    acknowledgements are checked once. `Exploration` reports the counts.

Materialising (`materialise`) writes a crash state as a real directory tree (hard
links as hard links, files 0600, directories 0700) for the checker to open.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import random
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "BLOCK",
    "EXT4_ORDERED",
    "GARBAGE",
    "STRICT",
    "STRICT_BLOCKS",
    "CrashState",
    "Exploration",
    "Model",
    "Op",
    "Recorder",
    "Trace",
    "crash_states",
    "explore",
    "legal_state",
    "materialise",
    "tree_signature",
]

OpKind = Literal[
    "write", "truncate", "fsync", "dirsync", "create", "mkdir", "link", "unlink", "rename",
    "ack",
]  # fmt: skip
DATA_OPS = ("write", "truncate")
DIR_OPS = ("create", "mkdir", "link", "unlink", "rename")


@dataclass(frozen=True, slots=True)
class Op:
    """One recorded operation. Paths are relative to the root ('' is the root itself).

    write: `inode`, `offset`, `data` · truncate: `inode`, `size` · fsync: `inode` ·
    dirsync: `path` · create / mkdir / link: `path` now names `inode` · unlink (also
    rmdir): `path` no longer names `inode` · rename: `src` -> `path`, `inode` moved,
    `replaced` the inode `path` named before (-1: none) · ack: `label`, `payload`.
    """

    index: int
    kind: OpKind
    inode: int = -1
    path: str = ""
    src: str = ""
    offset: int = 0
    data: bytes = b""
    size: int = 0
    replaced: int = -1
    label: str = ""
    payload: Any = None

    def dirs(self) -> tuple[str, ...]:
        """The directories a directory operation changes."""
        if self.kind == "rename":
            return tuple(dict.fromkeys((_parent(self.src), _parent(self.path))))
        return (_parent(self.path),)

    def __repr__(self) -> str:
        what = {
            "write": lambda: f"ino{self.inode} @{self.offset} {len(self.data)}B",
            "truncate": lambda: f"ino{self.inode} to {self.size}",
            "fsync": lambda: f"ino{self.inode}",
            "rename": lambda: f"{self.src} -> {self.path} (ino{self.inode})",
            "ack": lambda: f"{self.label}",
        }.get(self.kind, lambda: f"{self.path} (ino{self.inode})")()
        return f"#{self.index} {self.kind} {what}"


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


@dataclass(slots=True)
class Trace:
    """What a workload did: the initial durable tree and the operations after it."""

    initial_names: dict[str, int]  # path -> inode, files and directories
    initial_data: dict[int, bytes]  # inode -> content (files only)
    dir_inodes: set[int]
    ops: list[Op]

    def acks(self, k: int) -> list[Op]:
        """The acknowledgements recorded before crash point k."""
        return [op for op in self.ops[:k] if op.kind == "ack"]


# -- recording ------------------------------------------------------------------------

_WRAPPED = (
    "open", "write", "pwrite", "writev", "pwritev", "ftruncate", "truncate", "fsync",
    "fdatasync", "rename", "replace", "link", "unlink", "remove", "mkdir", "rmdir", "close",
    "sendfile", "copy_file_range", "posix_fallocate",
)  # fmt: skip
_WRITE_MODES = frozenset("wax+")  # a builtin open() mode that writes

_active: Recorder | None = None  # the recorder the audit hook reports to
_hooked = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """sys.addaudithook: a builtin `open` for writing, or an mmap, of a file under the
    root of the active recorder fails the workload (the wrappers cannot see its writes)."""
    rec = _active
    if rec is None:
        return
    if event == "open" and isinstance(args[1], str) and _WRITE_MODES & set(args[1]):
        path = args[0]
        if isinstance(path, int):
            rec._refuse_unknown(path, f"open({path}, {args[1]!r})")
        elif isinstance(path, (str, bytes, os.PathLike)):
            full, rel = rec._resolve(path, None)
            if rel is not None:
                raise AssertionError(f"{full}: opened for writing by the builtin open, unrecorded")
    elif event == "mmap.__new__" and args[0] >= 0:
        rec._refuse_unknown(args[0], "mmap", any_fd=True)


@dataclass(slots=True)
class _Fd:
    path: str  # relative to the root
    inode: int
    is_dir: bool
    append: bool


class Recorder:
    """Record what a workload does to the files under `root` (see the module docstring).

    ``with Recorder(root) as rec: ...; rec.ack("append 1", payload)``, then `rec.trace`.
    `root` must be an existing directory given by its real path (no symlinks in it).
    The wrappers replace `os` functions process-wide, in a process with no other writer
    under the root. Several threads of one workload may run at once: each wrapped call
    is made and recorded under one lock, so the trace holds them in the order they took
    effect (a flush is recorded as covering what was written before it began).
    """

    def __init__(self, root: str | os.PathLike[str], *, unmodelled: tuple[str, ...] = ()) -> None:
        self.root = os.fspath(root)
        # file names (prefixes) whose files another program keeps (a SQLite file and its
        # -wal/-shm): left out of the trace and of `self_check`, as if outside the root
        self.unmodelled = unmodelled
        if os.path.realpath(self.root) != os.path.abspath(self.root):
            raise ValueError(f"{self.root}: give the recorder the real path of the root")
        self.root = os.path.abspath(self.root)
        self._real = {name: getattr(os, name) for name in _WRAPPED if hasattr(os, name)}
        self._fds: dict[int, _Fd] = {}
        self._ino: dict[tuple[int, int], int] = {}
        self._next_inode = 0
        self.trace = Trace({}, {}, set(), [])
        self._active = False
        self._serial = threading.RLock()  # one wrapped call (made and recorded) at a time

    # -- the workload's side

    def ack(self, label: str, payload: Any = None) -> None:
        """Mark that the workload received an acknowledgement (a call returned)."""
        with self._serial:
            self._emit("ack", label=label, payload=payload)

    def __enter__(self) -> Recorder:
        global _active, _hooked
        self._snapshot_initial()
        for name in _WRAPPED:
            if name in self._real:
                setattr(os, name, self._serialized(getattr(self, "_" + name)))
        if not _hooked:  # (an audit hook cannot be removed: one, for every recorder)
            sys.addaudithook(_audit)
            _hooked = True
        _active = self
        self._active = True
        return self

    def _serialized(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        serial = self._serial

        def call(*args: Any, **kw: Any) -> Any:
            with serial:
                return fn(*args, **kw)

        return call

    def __exit__(self, *exc: object) -> None:
        global _active
        _active = None
        for name, fn in self._real.items():
            setattr(os, name, fn)
        self._active = False

    def self_check(self) -> None:
        """Replay the whole trace with everything persisted and compare it with the real
        tree: a difference means the workload changed files in a way not recorded."""
        assert not self._active
        want = _tree_of(self.root, self._modelled)
        state = CrashState(len(self.trace.ops), frozenset(_dir_op_indices(self.trace.ops)), {})
        got = _build(self.trace, state)
        if got != want:
            missing = sorted(set(want) ^ set(got))
            differ = sorted(p for p in set(want) & set(got) if want[p] != got[p])
            raise AssertionError(
                f"the recorded trace does not reproduce the tree: names only on one side"
                f" {missing[:10]}, contents differ {differ[:10]}"
            )

    # -- bookkeeping

    def _new_inode(self, real: os.stat_result | None, is_dir: bool) -> int:
        ino = self._next_inode
        self._next_inode += 1
        if real is not None:
            self._ino[(real.st_dev, real.st_ino)] = ino
        if is_dir:
            self.trace.dir_inodes.add(ino)
        return ino

    def _snapshot_initial(self) -> None:
        t = self.trace
        t.initial_names[""] = self._new_inode(os.lstat(self.root), True)
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                st = os.lstat(full)
                rel = self._rel(full)
                if rel is None:
                    continue  # unmodelled
                key = (st.st_dev, st.st_ino)
                if key in self._ino:
                    t.initial_names[rel] = self._ino[key]
                    continue
                if stat.S_ISDIR(st.st_mode):
                    t.initial_names[rel] = self._new_inode(st, True)
                elif stat.S_ISREG(st.st_mode):
                    ino = t.initial_names[rel] = self._new_inode(st, False)
                    with open(full, "rb") as f:
                        t.initial_data[ino] = f.read()
                else:
                    raise ValueError(f"{full}: only files and directories can be recorded")

    def _emit(self, kind: OpKind, **kw: Any) -> None:
        self.trace.ops.append(Op(len(self.trace.ops), kind, **kw))

    def _rel(self, full: str) -> str | None:
        if full == self.root:
            return ""
        if full.startswith(self.root + os.sep):
            rel = full[len(self.root) + 1 :]
            return rel if self._modelled(rel) else None
        return None

    def _modelled(self, rel: str) -> bool:
        return not (self.unmodelled and os.path.basename(rel).startswith(self.unmodelled))

    def _resolve(self, path: Any, dir_fd: int | None) -> tuple[str, str | None]:
        """(absolute path, path relative to the root or None when outside it)."""
        p = os.fsdecode(os.fspath(path))
        if dir_fd is not None and not os.path.isabs(p):
            base = self._fds.get(dir_fd)
            if base is None:
                return p, None  # a directory fd opened before recording or outside the root
            p = os.path.join(self.root, base.path, p) if base.path else os.path.join(self.root, p)
        full = os.path.normpath(os.path.abspath(p))
        return full, self._rel(full)

    def _inode_of(self, full: str) -> int:
        st = os.lstat(full)
        key = (st.st_dev, st.st_ino)
        if key not in self._ino:
            raise AssertionError(f"{full}: an inode the recorder never saw")
        return self._ino[key]

    # -- the wrappers (same signatures as os)

    def _open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        full, rel = self._resolve(path, dir_fd)
        existed = os.path.lexists(full) if rel is not None else True
        old_size = -1
        if rel is not None and existed and flags & os.O_TRUNC:
            try:
                old_size = os.lstat(full).st_size
            except OSError:
                pass
        fd: int = self._real["open"](path, flags, mode, dir_fd=dir_fd)
        if rel is None:
            return fd
        st = os.fstat(fd)
        is_dir = stat.S_ISDIR(st.st_mode)
        if not existed:
            ino = self._new_inode(st, False)
            self._emit("create", inode=ino, path=rel)
        else:
            ino = self._ino.get((st.st_dev, st.st_ino), -1)
            if ino < 0:
                raise AssertionError(f"{full}: an inode the recorder never saw")
            if old_size > 0:
                self._emit("truncate", inode=ino, size=0)
        self._fds[fd] = _Fd(rel, ino, is_dir, bool(flags & os.O_APPEND))
        return fd

    def _refuse_unknown(self, fd: int, what: str, *, any_fd: bool = False) -> None:
        """Fail loudly when `fd` is a file under the root the recorder does not know (opened
        before recording, `os.dup`-ed, or by a call it does not wrap): its writes and
        syncs would go unrecorded. `any_fd`: a known one too (mmap)."""
        if fd in self._fds and not any_fd:
            return
        try:
            st = os.fstat(fd)
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return  # not a descriptor (the call itself fails), or no /proc
        if (st.st_dev, st.st_ino) in self._ino or self._rel(target) is not None:
            raise AssertionError(
                f"{what} on fd {fd} ({target}): a file under the root through a descriptor"
                " the recorder did not open: its writes would go unrecorded"
            )

    def _record_write(self, fd: int, data: bytes, offset: int | None) -> None:
        f = self._fds.get(fd)
        if f is None or not data:
            return
        self._emit("write", inode=f.inode, offset=offset, data=bytes(data))

    def _at(self, fd: int) -> int:
        """Where a write through `fd` (known) lands: the end under O_APPEND."""
        f = self._fds[fd]
        return os.fstat(fd).st_size if f.append else os.lseek(fd, 0, os.SEEK_CUR)

    def _write(self, fd: int, data: Any) -> int:
        f = self._fds.get(fd)
        if f is None:
            self._refuse_unknown(fd, "write")
            n: int = self._real["write"](fd, data)
            return n
        at = os.fstat(fd).st_size if f.append else os.lseek(fd, 0, os.SEEK_CUR)
        n = self._real["write"](fd, data)
        self._record_write(fd, bytes(memoryview(data)[:n]), at)
        return n

    def _pwrite(self, fd: int, data: Any, offset: int) -> int:
        self._refuse_unknown(fd, "pwrite")
        f = self._fds.get(fd)
        at = offset
        if f is not None and f.append:  # Linux: pwrite on O_APPEND appends, whatever offset
            at = os.fstat(fd).st_size
        n: int = self._real["pwrite"](fd, data, offset)
        self._record_write(fd, bytes(memoryview(data)[:n]), at)
        return n

    def _pwritev(self, fd: int, buffers: Sequence[Any], offset: int, *flags: int) -> int:
        self._refuse_unknown(fd, "pwritev")
        f = self._fds.get(fd)
        at = os.fstat(fd).st_size if f is not None and f.append else offset
        n: int = self._real["pwritev"](fd, buffers, offset, *flags)
        self._record_write(fd, b"".join(bytes(b) for b in buffers)[:n], at)
        return n

    def _sendfile(self, out_fd: int, in_fd: int, offset: int | None, count: int, **kw: Any) -> int:
        return self._copy("sendfile", out_fd, None, (out_fd, in_fd, offset, count), kw)

    def _copy_file_range(self, src: int, dst: int, count: int, *args: Any) -> int:
        offset_dst = args[1] if len(args) > 1 else None
        return self._copy("copy_file_range", dst, offset_dst, (src, dst, count, *args), {})

    def _copy(self, fn: str, out: int, offset: int | None, args: tuple[Any, ...], kw: Any) -> int:
        """sendfile / copy_file_range into `out`: recorded as the write of what landed."""
        self._refuse_unknown(out, fn)
        at = None
        if out in self._fds:
            at = offset if offset is not None else self._at(out)
        n: int = self._real[fn](*args, **kw)
        if at is not None and n > 0:
            self._record_write(out, os.pread(out, n, at), at)
        return n

    def _posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        self._refuse_unknown(fd, "posix_fallocate")
        before = os.fstat(fd).st_size
        self._real["posix_fallocate"](fd, offset, length)
        f = self._fds.get(fd)
        if f is not None and offset + length > before:  # the size grew, with zeros
            self._emit("truncate", inode=f.inode, size=offset + length)

    def _writev(self, fd: int, buffers: Sequence[Any]) -> int:
        self._refuse_unknown(fd, "writev")
        f = self._fds.get(fd)
        at = 0
        if f is not None:
            at = os.fstat(fd).st_size if f.append else os.lseek(fd, 0, os.SEEK_CUR)
        n: int = self._real["writev"](fd, buffers)
        self._record_write(fd, b"".join(bytes(b) for b in buffers)[:n], at)
        return n

    def _ftruncate(self, fd: int, length: int) -> None:
        self._refuse_unknown(fd, "ftruncate")
        self._real["ftruncate"](fd, length)
        f = self._fds.get(fd)
        if f is not None:
            self._emit("truncate", inode=f.inode, size=length)

    def _truncate(self, path: Any, length: int) -> None:
        if isinstance(path, int):
            return self._ftruncate(path, length)
        full, rel = self._resolve(path, None)
        self._real["truncate"](path, length)
        if rel is not None:
            self._emit("truncate", inode=self._inode_of(full), size=length)

    def _fsync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        self._real["fsync"](fd)
        self._record_sync(fd)

    def _fdatasync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        self._real["fdatasync"](fd)
        self._record_sync(fd)

    def _record_sync(self, fd: int) -> None:
        f = self._fds.get(fd)
        if f is None:
            self._refuse_unknown(fd, "fsync")
            return
        if f.is_dir:
            self._emit("dirsync", path=f.path)
        else:
            self._emit("fsync", inode=f.inode)

    def _rename(self, src: Any, dst: Any, **kw: Any) -> None:
        self._move("rename", src, dst, **kw)

    def _replace(self, src: Any, dst: Any, **kw: Any) -> None:
        self._move("replace", src, dst, **kw)

    def _move(
        self,
        fn: str,
        src: Any,
        dst: Any,
        *,
        src_dir_fd: int | None = None,
        dst_dir_fd: int | None = None,
    ) -> None:
        sfull, srel = self._resolve(src, src_dir_fd)
        dfull, drel = self._resolve(dst, dst_dir_fd)
        ino = replaced = -1
        if srel is not None:
            ino = self._inode_of(sfull)
            if drel is not None and os.path.lexists(dfull):
                replaced = self._inode_of(dfull)
        self._real[fn](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        if srel is None or drel is None:
            if srel is not None or drel is not None:
                raise NotImplementedError(f"{sfull} -> {dfull}: a rename across the root")
            return
        if replaced == ino:
            return  # POSIX: two links to one file: rename does nothing, both names stay
        self._emit("rename", inode=ino, src=srel, path=drel, replaced=replaced)
        if ino in self.trace.dir_inodes:  # the descriptors opened under it move with it
            for fd, f in self._fds.items():
                if f.path == srel or f.path.startswith(srel + "/"):
                    self._fds[fd] = _Fd(drel + f.path[len(srel) :], f.inode, f.is_dir, f.append)

    def _link(self, src: Any, dst: Any, **kw: Any) -> None:
        sfull, srel = self._resolve(src, kw.get("src_dir_fd"))
        dfull, drel = self._resolve(dst, kw.get("dst_dir_fd"))
        self._real["link"](src, dst, **kw)
        if drel is not None:
            if srel is None:
                raise NotImplementedError(f"{sfull} -> {dfull}: a link into the root")
            self._emit("link", inode=self._inode_of(dfull), path=drel, src=srel)

    def _unlink(self, path: Any, *, dir_fd: int | None = None) -> None:
        self._remove_name("unlink", path, dir_fd)

    def _remove(self, path: Any, *, dir_fd: int | None = None) -> None:
        self._remove_name("remove", path, dir_fd)

    def _rmdir(self, path: Any, *, dir_fd: int | None = None) -> None:
        self._remove_name("rmdir", path, dir_fd)

    def _remove_name(self, fn: str, path: Any, dir_fd: int | None) -> None:
        full, rel = self._resolve(path, dir_fd)
        ino = self._inode_of(full) if rel is not None and os.path.lexists(full) else -1
        self._real[fn](path, dir_fd=dir_fd)
        if rel is not None:
            self._emit("unlink", inode=ino, path=rel)

    def _mkdir(self, path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        full, rel = self._resolve(path, dir_fd)
        self._real["mkdir"](path, mode, dir_fd=dir_fd)
        if rel is not None:
            self._emit("mkdir", inode=self._new_inode(os.lstat(full), True), path=rel)

    def _close(self, fd: int) -> None:
        self._real["close"](fd)
        self._fds.pop(fd, None)


# -- models ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CrashState:
    """A crash after op `k`: which directory operations before it survive (`dir_kept`,
    op indices; durable ones included), and for each data operation before it that
    is not fully persisted, what survived (`data`: op index -> None for dropped, an
    int n < len for its first n bytes, -1 for zeros of its length). Data operations
    not in `data` persisted whole."""

    k: int
    dir_kept: frozenset[int]
    data: dict[int, int | None | tuple[int, ...]]

    def describe(self, trace: Trace) -> str:
        """A readable account of what was lost, for failure messages and regression tests."""
        ops = trace.ops[: self.k]
        undone = [op for op in ops if op.kind in DIR_OPS and op.index not in self.dir_kept]
        parts = [f"crash after op #{self.k - 1}" if self.k else "crash before any op"]
        parts += [f"undone {op!r}" for op in undone]
        for i, v in sorted(self.data.items()):
            what = (
                "dropped" if v is None else "zeros" if v == -1
                else "garbage" if v == GARBAGE
                else f"only blocks {v}" if isinstance(v, tuple) else f"torn at {v}"
            )  # fmt: skip
            parts.append(f"{what} {ops[i]!r}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Model:
    """A persistence model: how the pending operations at a crash point may survive."""

    name: str
    dir_ops_in_order: bool  # a prefix of the pending directory operations (ext4 journal)
    data_in_order: bool  # per file, a prefix of the pending appends and truncates
    zeros: bool  # a pending write may persist as zeros
    rename_flushes_data: bool  # a rename over an existing file persists the file's data
    overwrites_in_order: bool = False  # in-place overwrites join the per-file prefix
    block_tears: bool = False  # a multi-block write may persist some blocks, not a prefix
    garbage: bool = False  # a pending write may persist as non-zero garbage


EXT4_ORDERED = Model("ext4-ordered", True, True, False, True)
STRICT = Model("strict", False, False, True, False, garbage=True)
STRICT_BLOCKS = Model("strict-blocks", False, False, True, False, block_tears=True, garbage=True)
"""`STRICT` with block tears (an unacknowledged last batch kept but for an earlier block
is a complete line with a hole of zeros: a torn tail)."""
BLOCK = 4096  # the file-system block: what `block_tears` keeps or loses as a whole
GARBAGE = -2  # CrashState.data: the write persisted as non-zero garbage

_Alt = tuple[tuple[int, Any], ...]  # one alternative of one choice slot: (op index, value)...


def _dir_op_indices(ops: Sequence[Op]) -> list[int]:
    return [op.index for op in ops if op.kind in DIR_OPS]


def _pending(trace: Trace, k: int, model: Model) -> tuple[list[Op], set[int], dict[int, list[Op]]]:
    """At crash point k: (non-durable dir ops, durable dir op indices, inode -> unsynced
    data ops in order). Under a model that journals directory operations in order,
    every one before a durable one is durable too."""
    ops = trace.ops[:k]
    synced_at: dict[int, int] = {}
    dsynced: dict[str, int] = {}
    for op in ops:
        if op.kind == "fsync":
            synced_at[op.inode] = op.index
        elif op.kind == "dirsync":
            dsynced[op.path] = op.index
    durable = {
        op.index
        for op in ops
        if op.kind in DIR_OPS and all(dsynced.get(d, -1) > op.index for d in op.dirs())
    }
    if model.dir_ops_in_order and durable:
        last = max(durable)
        durable |= {op.index for op in ops if op.kind in DIR_OPS and op.index < last}
    pending_dir = [op for op in ops if op.kind in DIR_OPS and op.index not in durable]
    data: dict[int, list[Op]] = {}
    for op in ops:
        if op.kind in DATA_OPS and op.index > synced_at.get(op.inode, -1):
            data.setdefault(op.inode, []).append(op)
    return pending_dir, durable, data


def _cuts(data: bytes, rng: random.Random | None, max_cuts: int) -> list[int]:
    n = len(data)
    if n < 2:
        return []
    if rng is not None:
        return [rng.randrange(1, n)]
    cuts = {1, n // 2, n - 1}
    for i, b in enumerate(data):
        if b == 0x0A:
            cuts.update((i, i + 1))
    ordered = sorted(c for c in cuts if 0 < c < n)
    if len(ordered) > max_cuts:  # evenly spread, keeping both ends
        step = (len(ordered) - 1) / (max_cuts - 1)
        ordered = sorted({ordered[round(i * step)] for i in range(max_cuts)})
    return ordered


def _overwrites(trace: Trace, k: int) -> set[int]:
    """The writes before crash point k that changed bytes in place (none beyond the
    file's size before them)."""
    size = {ino: len(b) for ino, b in trace.initial_data.items()}
    out = set()
    for op in trace.ops[:k]:
        if op.kind == "truncate":
            size[op.inode] = op.size
        elif op.kind == "write":
            end = op.offset + len(op.data)
            if end <= size.get(op.inode, 0):
                out.add(op.index)
            size[op.inode] = max(end, size.get(op.inode, 0))
    return out


def _blocks(op: Op, max_cuts: int) -> list[tuple[int, ...]]:
    """Block-tear alternatives of a write spanning several blocks: every block kept but
    one (up to `max_cuts` of them, evenly spread), as the tuple of blocks kept."""
    first, last = op.offset // BLOCK, (op.offset + len(op.data) - 1) // BLOCK
    if last == first:
        return []
    spanned = list(range(first, last + 1))
    if len(spanned) > max_cuts:
        step = (len(spanned) - 1) / (max_cuts - 1)
        holes = sorted({spanned[round(i * step)] for i in range(max_cuts)})
    else:
        holes = spanned
    return [tuple(b for b in spanned if b != h) for h in holes]


def _independent(model: Model, op: Op, max_cuts: int) -> list[_Alt]:
    """The alternatives of a data operation persisted independently of the others."""
    alt: list[_Alt] = [((op.index, None),), ((op.index, "whole"),)]
    if op.kind == "write":
        alt += [((op.index, c),) for c in _cuts(op.data, None, max_cuts)]
        if model.zeros:
            alt.append(((op.index, -1),))
        if model.garbage:
            alt.append(((op.index, GARBAGE),))
        if model.block_tears:
            alt += [((op.index, b),) for b in _blocks(op, max_cuts)]
    return alt


def _slots(
    model: Model,
    pending_dir: list[Op],
    data: dict[int, list[Op]],
    max_cuts: int,
    overwrites: set[int] = frozenset(),  # type: ignore[assignment]
) -> list[list[_Alt]]:
    """The independent choices at one crash point, each a list of alternatives."""
    slots: list[list[_Alt]] = []
    if pending_dir:
        if model.dir_ops_in_order:  # keep the first n
            slots.append(
                [tuple((op.index, n > i) for i, op in enumerate(pending_dir))
                 for n in range(len(pending_dir) + 1)]
            )  # fmt: skip
        else:
            slots += [[((op.index, False),), ((op.index, True),)] for op in pending_dir]
    for ops in data.values():
        if model.data_in_order:
            if not model.overwrites_in_order:  # (ALICE: ext4 does not order them)
                slots += [_independent(model, op, max_cuts) for op in ops if op.index in overwrites]
                ops = [op for op in ops if op.index not in overwrites]
            alts: list[_Alt] = []
            for n in range(len(ops) + 1):  # the first n whole, the rest dropped
                alts.append(
                    tuple((op.index, "whole" if i < n else None) for i, op in enumerate(ops))
                )
                if n < len(ops) and ops[n].kind == "write":
                    for c in _cuts(ops[n].data, None, max_cuts):
                        alts.append(
                            tuple((op.index, "whole" if i < n else c if i == n else None)
                                  for i, op in enumerate(ops))
                        )  # fmt: skip
            slots.append(alts)
        else:
            slots += [_independent(model, op, max_cuts) for op in ops]
    return slots


def _category(alt: _Alt) -> str:
    v = alt[-1][1]
    if isinstance(v, tuple):
        return "holes"
    return repr(v) if isinstance(v, bool) or v in (None, "whole", -1, GARBAGE) else "torn"


def _random_alt(slot: list[_Alt], trace: Trace, rng: random.Random) -> _Alt:
    if len(slot[0]) == 1:  # an independent choice: each kind of outcome equally likely
        kinds: dict[str, list[_Alt]] = {}
        for a in slot:
            kinds.setdefault(_category(a), []).append(a)
        alt = rng.choice(rng.choice(list(kinds.values())))
    else:
        alt = rng.choice(slot)
    out = []
    for i, v in alt:  # re-draw tears: at a line's edge or any byte, equally likely
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            data = trace.ops[i].data
            edges = _cuts(data, None, len(data)) if rng.random() < 0.5 else []
            v = rng.choice(edges) if edges else _cuts(data, rng, 0)[0]
        out.append((i, v))
    return tuple(out)


def _state(
    model: Model, trace: Trace, k: int, durable: set[int], choice: Sequence[_Alt]
) -> CrashState:
    dir_kept = set(durable)
    data: dict[int, int | None | tuple[int, ...]] = {}
    for alt in choice:
        for i, v in alt:
            if isinstance(v, bool):
                if v:
                    dir_kept.add(i)
            elif v != "whole":
                data[i] = v
    if model.rename_flushes_data:
        for i in dir_kept:
            op = trace.ops[i]
            if op.kind == "rename" and op.replaced >= 0:
                for j in list(data):
                    if j < i and trace.ops[j].inode == op.inode:
                        del data[j]
    return CrashState(k, frozenset(dir_kept), data)


def crash_states(
    trace: Trace,
    model: Model,
    k: int,
    *,
    exhaustive: int,
    samples: int,
    seed: int,
    max_cuts: int = 6,
) -> tuple[list[CrashState], bool]:
    """The crash states at crash point k, and whether they were sampled."""
    pending_dir, durable, data = _pending(trace, k, model)
    slots = _slots(model, pending_dir, data, max_cuts, _overwrites(trace, k))
    total = 1
    for s in slots:
        total *= len(s)
        if total > exhaustive:
            break
    if total <= exhaustive:
        return [_state(model, trace, k, durable, c) for c in itertools.product(*slots)], False
    rng = random.Random(f"{seed}:{model.name}:{k}")
    states = [
        _state(model, trace, k, durable, [s[0] for s in slots]),  # everything pending lost
        _state(model, trace, k, durable, [_all_kept(s) for s in slots]),
    ]
    states += [
        _state(model, trace, k, durable, [_random_alt(s, trace, rng) for s in slots])
        for _ in range(samples)
    ]
    return states, True


def legal_state(
    trace: Trace,
    model: Model,
    k: int,
    undo: Callable[[Op], bool],
    drop: Callable[[Op], bool] = lambda op: False,
) -> CrashState:
    """The crash after op k-1 in which the pending directory operations matching `undo`
    are undone and the pending data operations matching `drop` are lost (only those the
    model lets go: durable ones stay; under an in-order model, everything after them
    goes too) and everything else persisted whole: for regression tests that pin one
    crash state."""
    pending_dir, durable, data = _pending(trace, k, model)
    undone = {op.index for op in pending_dir if undo(op)}
    if model.dir_ops_in_order and undone:  # a journal keeps a prefix: undo from the first
        first = min(undone)
        undone = {op.index for op in pending_dir if op.index >= first}
    kept = durable | {op.index for op in pending_dir if op.index not in undone}
    lost: dict[int, int | None | tuple[int, ...]] = {}
    for ops in data.values():
        hit = [op.index for op in ops if drop(op)]
        if model.data_in_order and hit:
            hit = [op.index for op in ops if op.index >= hit[0]]
        lost.update(dict.fromkeys(hit))
    return CrashState(k, frozenset(kept), lost)


def _all_kept(slot: list[_Alt]) -> _Alt:
    for alt in slot:
        if all(v is True or v == "whole" for _, v in alt):
            return alt
    return slot[-1]


# -- materialising --------------------------------------------------------------------

_Tree = dict[str, bytes | None]  # path -> content (None: a directory)


def _build(trace: Trace, state: CrashState) -> _Tree:
    """The tree a crash state leaves: path -> bytes, or None for a directory; hard links
    appear as equal contents (see `materialise` for the real thing)."""
    names, content = _names_and_content(trace, state)
    return {
        p: (None if ino in trace.dir_inodes else bytes(content.get(ino, b"")))
        for p, ino in names.items()
    }


def _names_and_content(
    trace: Trace, state: CrashState
) -> tuple[dict[str, int], dict[int, bytearray]]:
    names = dict(trace.initial_names)
    content = {ino: bytearray(b) for ino, b in trace.initial_data.items()}
    for op in trace.ops[: state.k]:
        if op.kind in DIR_OPS:
            if op.index not in state.dir_kept:
                continue
            if op.kind in ("create", "mkdir", "link"):
                names[op.path] = op.inode
            elif op.kind == "unlink":
                if names.get(op.path) == op.inode:
                    del names[op.path]
            else:  # rename (a directory's moves every name under it)
                if names.get(op.src) == op.inode:
                    del names[op.src]
                    if op.inode in trace.dir_inodes:
                        for p in [p for p in names if p.startswith(op.src + "/")]:
                            names[op.path + p[len(op.src) :]] = names.pop(p)
                names[op.path] = op.inode
        elif op.kind in DATA_OPS:
            buf = content.setdefault(op.inode, bytearray())
            whole = op.index not in state.data
            v = state.data.get(op.index)
            if not whole and v is None:
                continue
            if op.kind == "truncate":
                del buf[op.size :]
                buf.extend(bytes(op.size - len(buf)))
                continue
            if isinstance(v, tuple):  # some blocks persisted: the size reached disk
                _apply_blocks(buf, op, v)
                continue
            if whole or v is None:
                data = op.data
            elif v == GARBAGE:
                data = bytes(0x80 | ((i * 37 + op.index) & 0x7F) for i in range(len(op.data)))
            else:
                data = bytes(len(op.data)) if v == -1 else op.data[:v]
            end = op.offset + len(data)
            if len(buf) < op.offset:
                buf.extend(bytes(op.offset - len(buf)))
            buf[op.offset : end] = data
    # a name whose parent directory is gone is gone too
    alive: dict[str, int] = {}
    for path in sorted(names, key=lambda p: (p.count("/"), p)):
        parent = _parent(path)
        if path == "" or (parent in alive and alive[parent] in trace.dir_inodes):
            alive[path] = names[path]
    return alive, content


def _apply_blocks(buf: bytearray, op: Op, kept: tuple[int, ...]) -> None:
    """A write of which only the blocks `kept` persisted: the others keep what was there
    (zeros past the old end)."""
    end = op.offset + len(op.data)
    if len(buf) < end:
        buf.extend(bytes(end - len(buf)))
    for b in kept:
        lo, hi = max(op.offset, b * BLOCK), min(end, (b + 1) * BLOCK)
        buf[lo:hi] = op.data[lo - op.offset : hi - op.offset]


def materialise(trace: Trace, state: CrashState, dest: Path) -> None:
    """Write the tree of `state` under `dest` (which must not exist)."""
    names, content = _names_and_content(trace, state)
    os.mkdir(dest, 0o700)
    first: dict[int, Path] = {}
    for path in sorted(names, key=lambda p: (p.count("/"), p)):
        if path == "":
            continue
        ino = names[path]
        target = dest / path
        if ino in trace.dir_inodes:
            os.mkdir(target, 0o700)
        elif ino in first:
            os.link(first[ino], target)
        else:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, bytes(content.get(ino, b"")))
            finally:
                os.close(fd)
            first[ino] = target


def _tree_of(root: str, modelled: Callable[[str], bool]) -> _Tree:
    """The modelled names under `root` and their bytes. Unmodelled files are never opened:
    another thread may be writing them (a store's index rows are written off the append
    path, and SQLite removes its `-shm` as it closes)."""
    tree: _Tree = {"": None}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if not modelled(rel):
                continue
            if os.path.isdir(full):
                tree[rel] = None
            else:
                with open(full, "rb") as f:
                    tree[rel] = f.read()
    return tree


def tree_signature(trace: Trace, state: CrashState) -> str:
    """A digest of the tree a state leaves (hard links included) and the acks before it."""
    names, content = _names_and_content(trace, state)
    h = hashlib.blake2b(digest_size=16)
    groups: dict[int, str] = {}
    for path in sorted(names):
        ino = names[path]
        h.update(path.encode() + b"\0")
        if ino in trace.dir_inodes:
            h.update(b"d")
        elif ino in groups:
            h.update(b"l" + groups[ino].encode())
        else:
            groups[ino] = path
            h.update(b"f" + hashlib.blake2b(bytes(content.get(ino, b""))).digest())
    for op in trace.acks(state.k):
        h.update(b"a" + op.label.encode())
    return h.hexdigest()


# -- exploring ------------------------------------------------------------------------


@dataclass(slots=True)
class Exploration:
    """What `explore` did: crash points, states enumerated, distinct states checked,
    crash points that were sampled, and the failures (state, message)."""

    model: str
    crash_points: int = 0
    enumerated: int = 0
    checked: int = 0
    sampled_points: int = 0
    failures: list[tuple[CrashState, str]] = field(default_factory=list)

    def summary(self) -> str:
        """One line for logs and the README."""
        return (
            f"{self.model}: {self.crash_points} crash points, {self.enumerated} states"
            f" enumerated, {self.checked} distinct checked"
            f" ({self.sampled_points} points sampled), {len(self.failures)} failures"
        )


Checker = Callable[[Path, list[Op], CrashState], None]


def explore(
    trace: Trace,
    model: Model,
    check: Checker,
    workdir: Path,
    *,
    exhaustive: int = 256,
    samples: int = 48,
    seed: int = 0,
    max_cuts: int = 6,
    max_failures: int = 5,
) -> Exploration:
    """Check every crash state of `trace` under `model`: materialise each distinct one
    in `workdir` and call ``check(dir, acks_before_crash, state)``, which raises
    AssertionError (or anything else) for a bad state. Failures are collected (the
    first `max_failures`), not raised."""
    result = Exploration(model.name)
    seen: set[str] = set()
    n = 0
    for k in range(len(trace.ops) + 1):
        states, sampled = crash_states(
            trace, model, k, exhaustive=exhaustive, samples=samples, seed=seed, max_cuts=max_cuts
        )
        result.crash_points += 1
        result.sampled_points += sampled
        result.enumerated += len(states)
        for st in states:
            sig = tree_signature(trace, st)
            if sig in seen:
                continue
            seen.add(sig)
            result.checked += 1
            n += 1
            dest = workdir / f"state-{n}"
            materialise(trace, st, dest)
            try:
                check(dest, trace.acks(st.k), st)
            except Exception as exc:  # noqa: BLE001 - every failure is reported with its state
                if len(result.failures) < max_failures:
                    result.failures.append((st, f"{type(exc).__name__}: {exc}"))
                else:
                    result.failures.append((st, ""))
            finally:
                _rmtree(dest)
    return result


def _rmtree(path: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            # (a checker's store left for the garbage collector may close its SQLite
            # index, and with it remove the -wal/-shm files, while this walks)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            os.rmdir(os.path.join(dirpath, name))
    os.rmdir(path)

"""Tombstones: deleting a session so that its id stays taken, and restoring it.

Written once for every engine, over the engine interface alone. `delete_session(core,
sid)` runs in two steps, each atomic on every engine:

1. **Fence.** A `session_deleted` event (`SessionDeleted`: when, by whom, the last seq
   and hash) is appended through the one write path, against the head the store folded.
   Every later write folds the lifecycle projection and is refused
   (SessionDeletedError, nothing written); a writer in another process that encoded
   against an older head gets HeadMovedError from the engine, catches up, folds the
   tombstone and is refused. So an append racing a delete either lands before the
   tombstone (and is deleted with the session) or is refused. Every projection folds
   the tombstone to its initial state (`projections.fold`): a deleted session reads as
   empty from this moment on.
2. **Erase.** The live log is replaced by one snapshot at the tombstone's seq whose
   states are the projections' initial states and the lifecycle state holding the
   tombstone (`install_snapshot` without history: the data lines are gone), then the
   archived history is dropped (`PruningEngine.prune_history`) and the fold caches are
   overwritten with the empty states.

3. **Shred.** An encrypted session's data key is destroyed (its key slot keeps only
   the record that it was forgotten: `eventstore.core.keys.shred_slot`), so the copies
   of its log the erase cannot reach (archives elsewhere, backups, replicas) can no
   longer be read, by any store, even with the master key.

The order is chosen so that no crash leaves a live session without its key, and no
acknowledged delete leaves data readable: the key is destroyed only once the tombstone
is durable (before it, the session is live and keeps its key), and after the erase, so
that the erased log (a plain snapshot: the tombstone holds no user content) is read
without any key; `delete_session` returns only after the shred. A crash between the
steps leaves a session that already reads as deleted and takes no write (its data lines
and key perhaps still stored); `delete_session` again, `erase` or `gc` finishes every
step. `purge=True` removes every trace instead, in the same order for an encrypted
session: tombstone, erase and shred, then `Engine.remove_session`, then the forgotten
key slot (`free_slot`), after which the id is simply free and a new session under it
gets a new key. `restore` removes a tombstoned session and its forgotten slot the same
way (shredding first a key a crash left), so the id starts a fresh session with a new
key and nothing written before the delete opens under it.
"""

from __future__ import annotations

import os
from datetime import datetime

import msgspec

from eventstore import entropy
from eventstore.core.keys import free_slot, has_slot, shred_slot
from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.core.validation import described, flag
from eventstore.engines.base import Head, HeadMovedError, PruningEngine
from eventstore.errors import EventStoreError, InvalidArgumentError
from eventstore.format.events import Event, SessionDeleted, Snapshot
from projections import Lifecycle, snapshot_entry, stored_in_snapshot

__all__ = [
    "Tombstone",
    "default_by",
    "deleted_sessions",
    "delete_session",
    "erase",
    "live_sessions",
    "restore",
    "tombstone_of",
]

_ATTEMPTS = 8  # erase retries against compactions landing meanwhile


class Tombstone(msgspec.Struct, frozen=True):
    """What is left of a deleted session: its id, when it was deleted and `by` whom, the
    `last_seq` and `last_h` (hash) of its last event before the delete, `seq` (the
    tombstone's own), and whether its data is `erased` (False only after a crash
    between the two steps of a delete: it reads as deleted, its lines are still stored)."""

    session_id: str
    deleted_at: datetime
    by: str
    last_seq: int
    last_h: str
    seq: int
    erased: bool


def default_by() -> str:
    """Who deletes when no `by` is given: the user and process id of this process."""
    try:
        import getpass

        user = getpass.getuser()
    except (ImportError, KeyError, OSError):
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user} (pid {os.getpid()})"


def _tombstone(core: SessionCore, session_id: str) -> SessionDeleted | None:
    state: Lifecycle = core.loaded(session_id, core.lifecycle, core.lifecycle.copy)
    return state.deleted


def _erased(head: Head, ev: SessionDeleted) -> bool:
    # the erased form: one line, the snapshot at the tombstone's seq
    return head.seq == ev.seq and head.base_seq == ev.seq


def tombstone_of(core: CoreOwner, session_id: str) -> Tombstone | None:
    """The session's tombstone (None: it is live, or has nothing stored)."""
    core = core_of(core)
    ev = _tombstone(core, session_id)
    if ev is None:
        return None
    head = core.engine.head(session_id)
    return Tombstone(session_id, ev.ts, ev.by, ev.last_seq, ev.last_h, ev.seq, _erased(head, ev))


def delete_session(
    core: CoreOwner,
    session_id: str,
    *,
    purge: bool = False,
    by: str | None = None,
    if_head: Head | None = None,
) -> bool:
    """Delete a session (see the module docstring): a tombstone, or with `purge` no
    trace at all. False if it had nothing stored (no tombstone is left then), or was
    already deleted (an interrupted erasure is finished). `if_head` (not with `purge`):
    delete only if the session is still at that chain point, checked under the
    tombstone's own expected-head append, so a write that lands first keeps the
    session (False) and one that comes after is refused by the tombstone."""
    core = core_of(core)
    if if_head is not None and (purge or not isinstance(if_head, Head)):
        raise InvalidArgumentError(f"if_head must be a Head, without purge, not {if_head!r}")
    flag(purge, "purge")
    if by is not None and not isinstance(by, str):
        raise InvalidArgumentError(f"by must be a str or None, not {described(by)}")
    core.session(session_id)  # validates the id, checks the store is open
    who = default_by() if by is None else by
    if purge:
        return _purge(core, session_id, who)
    fresh = _fence(core, session_id, who, if_head)
    if fresh is None:
        return False  # kept: its writer's events stand
    if _tombstone(core, session_id) is not None:
        erase(core, session_id)
    return fresh


def _purge(core: SessionCore, session_id: str, who: str) -> bool:
    """`delete_session(purge=True)`: an encrypted session is tombstoned, erased and its
    key shredded first (the module docstring says why), then every trace is removed."""
    if has_slot(core.engine, session_id):
        _fence(core, session_id, who, None)
        erase(core, session_id)
    sess = core.session(session_id)
    with sess.lock:
        removed = core.engine.remove_session(session_id)
        core.forget(session_id)
    free_slot(core.engine, session_id)  # (a live slot, a session written since, stays)
    return removed


def _fence(core: SessionCore, session_id: str, who: str, if_head: Head | None) -> bool | None:
    """Step 1: append the tombstone. True if this call appended it, False if there was
    nothing to fence (nothing stored, or deleted already), None if `if_head` moved."""
    fresh: list[bool] = []
    moved: list[bool] = []

    def build(head: Head, states: list[Lifecycle]) -> list[Event]:
        fresh[:] = moved[:] = []
        if head.seq == 0 or states[0].deleted is not None:
            return []  # nothing stored, or deleted already: nothing to fence
        if if_head is not None and not head.same_chain_point(if_head):
            moved.append(True)
            return []  # written to since the caller judged it: kept
        fresh.append(True)
        return [SessionDeleted(by=who, last_seq=head.seq, last_h=head.h)]

    core.write(session_id, build, None, (core.lifecycle,), after_tombstone=True)
    return None if moved else bool(fresh)


def erase(core: CoreOwner, session_id: str) -> bool:
    """Step 2 of a delete: replace a tombstoned session's log by the tombstone alone and
    drop its archived history and caches. False when there was nothing to erase (live,
    or erased already)."""
    core = core_of(core)
    sess = core.session(session_id)
    engine = core.engine
    for _ in range(_ATTEMPTS):
        ev = _tombstone(core, session_id)
        if ev is None:
            return False
        head = engine.head(session_id)
        line, empty = _tombstone_snapshot(core, ev, head)
        if _erased(head, ev):
            # what a delete killed after its install may have left: the caches and the
            # archive (each step is idempotent)
            core.caches.save_fold_caches(session_id, head, empty)
            _drop_history(core, session_id, head)
            _shred(core, session_id)
            return False
        try:
            done = engine.install_snapshot(session_id, line, head, keep_history=False)
        except HeadMovedError:
            continue  # a compaction replaced the log meanwhile: read it again
        with sess.lock:
            core.forget(session_id)
            sess.head = done.head
        core.caches.save_fold_caches(session_id, done.head, empty)
        _drop_history(core, session_id, done.head)
        _shred(core, session_id)
        return True
    return False


def _shred(core: SessionCore, session_id: str) -> None:
    """Step 3 of a delete: destroy an encrypted session's data key (see the module
    docstring), in the engine and in this store's memory."""
    shred_slot(core.engine, session_id)
    if core.keys is not None:
        core.keys.drop(session_id)


def _tombstone_snapshot(
    core: SessionCore, ev: SessionDeleted, head: Head
) -> tuple[bytes, dict[str, object]]:
    """The erased log's one line: a snapshot at the tombstone's seq whose states are
    the projections' initial ones (the lifecycle's: the tombstone), and those states."""
    states: dict[str, object] = {}
    for name, proj in core.projections.items():
        states[name] = Lifecycle(ev) if name == core.lifecycle.name else proj.initial()
    snap = Snapshot(
        base_h=head.link,
        states={
            name: snapshot_entry(core.projections[name], s)
            for name, s in states.items()
            if stored_in_snapshot(core.projections[name], s)
        },
        known=sorted(t for t in core.codec.types if t != "snapshot"),
        last_ts=ev.ts,
    )
    line, _ = core.codec.encode_snapshot(snap, ev.seq, head.link, entropy.now())
    return line, states


def _drop_history(core: SessionCore, session_id: str, head: Head) -> None:
    """Drop every archived segment before the tombstone (an engine that cannot prune
    keeps what earlier compactions archived: `PruningEngine`)."""
    if isinstance(core.engine, PruningEngine):
        core.engine.prune_history(session_id, head.seq + 1)


def restore(core: CoreOwner, session_id: str) -> bool:
    """Free a tombstoned session's id: its tombstone is removed, and the next write
    starts a fresh session. False (nothing changed) if it is not deleted."""
    core = core_of(core)
    sess = core.session(session_id)
    with sess.lock:
        # a tombstoned session takes no write, so what can change it between this check
        # and the removal is only another restore (and a fresh session written after
        # it): the tombstone is read from the engine right before the removal
        core.forget(session_id)
        if _tombstone(core, session_id) is None:
            return False
        _shred(core, session_id)  # (a key a crash left before its shred: never reused)
        removed = core.engine.remove_session(session_id)
        core.forget(session_id)
    free_slot(core.engine, session_id)  # the id's next session gets a new key
    return removed


def deleted_sessions(core: CoreOwner) -> list[Tombstone]:
    """Every tombstoned session's tombstone, by session id, the interrupted erasures
    included: folds the lifecycle projection of every session (a narrow fold: only
    snapshots and tombstones are decoded)."""
    core = core_of(core)
    core.check_open()
    found: list[Tombstone] = []
    for sid in core.engine.list_sessions():
        t = tombstone_of(core, sid)
        if t is not None:
            found.append(t)
    return found


def live_sessions(core: CoreOwner) -> list[str]:
    """The ids of every session but the erased tombstones, sorted. Cheap per session:
    only a session whose live log is one line (the erased form) is read; one whose
    erasure was interrupted by a crash is listed until `delete_session` finishes it."""
    core = core_of(core)
    core.check_open()
    engine = core.engine
    out: list[str] = []
    for sid in engine.list_sessions():
        try:
            head = engine.head(sid)
            if head.seq > 1 and head.base_seq == head.seq and _tombstone(core, sid) is not None:
                continue
        except EventStoreError:
            pass  # unreadable (a planted link, a damaged log): listed, its reads say why
        out.append(sid)
    return out

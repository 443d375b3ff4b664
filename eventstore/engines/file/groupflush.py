"""Group commit for the file engine's `durability="fsync"`: the durable appends that
threads of one process make to one session together share one flush.

Writers of one store take turns on a session (the store's session lock, then the
engine's writers' lock). A writer that, holding them, sees another thread of this
process queued behind it (`Group.queued`) *stages* its batch: the batch goes into the
journal's mirror, unflushed, and into `Group.staged` in memory, not yet into the log;
its writer keeps the engine's locks for the group (`Group.holding`: no other process
or thread can write the log meanwhile), takes a ticket and, once it has released the
store's lock, waits until a flush covers the ticket (`Group.wait`). The writers queued
behind it find the locks held for them and stage theirs the same way. The last writer
of the queue stages its own batch, then commits the group (`commit`): one `fdatasync`
of the journal, which covers every staged batch's mirror bytes, then every staged byte
written to the log in one call, then the locks released. A writer that leaves with a
group staged and nobody queued (it raised, or had nothing to write) commits it first
(`FileEngine._settle_group`). Any other user of the session's locks in this process (a
compaction, a repair, a removal, `close`, a direct `append`) commits a held group before
it waits for them (`FileEngine._release_group`): the writers the group waits for may be
queued behind that very thread's hold on the store's session lock. So no writer is
acknowledged before a flush that covers it, and none waits for a writer that is not
coming.

Why the log is written only after the flush: a power loss may keep a later write and
lose or garble an earlier one that was never flushed. Were each batch written to the
log at once, the log could come back with a garbled staged batch in its middle, valid
lines after it, and the mirror without it: a log no reader can read past. Flushed
first, the mirror holds every staged batch, and what the log lost of them after its
single write is copied back (`eventstore.engines.file.journal.lacking`), as for a lone
writer's append. Before the flush nothing of the group was acknowledged: whatever of
the mirror survives whole and chained may come back, the rest does not.

A commit that fails fails every staged batch: none is in the log, their bytes in the
mirror are voided (zeros, flushed), their writers get a StorageError that says so
(`StorageError` from the committing writer's own append, `Group.wait`'s reason for the
others), and the journal's epoch ends. The store above forgets what it folded of them
(`eventstore.core.session_core`).

Across processes nothing is shared beyond what the kernel shares (a flush of the
journal writes every process's pages of it): each process's writers wait for their own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from eventstore.engines.base import EncodedBatch, Engine, Head, WriterTurn
from eventstore.errors import StorageError

__all__ = ["IDLE_GROUP", "Group", "GroupTurn"]


class Group:
    """The group commit state of one session in this process (see the module docstring).

    `queued`: threads of this process that announced a durable append and have not yet
    taken the store's session lock. While `holding`, the engine's locks of the session
    are held for the group and `staged` holds the log bytes of its batches, to be
    written at log offset `staged_at`. Tickets: `issued` staged batches, the first
    `covered` of which a commit has settled (`failed`: ticket to why it failed)."""

    __slots__ = (
        "commit_lock",
        "cond",
        "covered",
        "failed",
        "holding",
        "issued",
        "queued",
        "staged",
        "staged_at",
    )

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        # held by whoever stages into the group or commits it: a writer in its turn,
        # or a thread that needs the session's locks the group holds (it commits first)
        self.commit_lock = threading.RLock()
        self.queued = 0
        self.holding = False
        self.staged = bytearray()
        self.staged_at = 0
        self.issued = 0
        self.covered = 0
        self.failed: dict[int, str] = {}

    def arrive(self) -> None:
        """A writer of this process is about to queue for the session."""
        with self.cond:
            self.queued += 1

    def enter(self) -> None:
        """The writer that arrived holds the store's session lock now."""
        with self.cond:
            self.queued -= 1

    def others_queued(self) -> bool:
        """Whether another writer of this process waits for the session (it will
        commit what is staged now)."""
        with self.cond:
            return self.queued > 0

    def stage(self, data: bytes, start: int) -> int:
        """Keep a batch's log bytes, to be written at `start`; its ticket."""
        if not self.holding:
            self.holding = True
            self.staged_at = start
        self.staged += data
        with self.cond:
            self.issued += 1
            return self.issued

    def take(self) -> tuple[int, bytes]:
        """The staged bytes and where they go in the log (the group is being committed)."""
        at, data = self.staged_at, bytes(self.staged)
        self.staged.clear()
        self.holding = False
        return at, data

    def settle(self, reason: str | None) -> None:
        """A commit covered every ticket issued (`reason` None), or failed them."""
        with self.cond:
            if self.covered == self.issued:
                return
            if reason is not None:
                for ticket in range(self.covered + 1, self.issued + 1):
                    self.failed[ticket] = reason
            self.covered = self.issued
            self.cond.notify_all()

    def wait(self, ticket: int) -> str | None:
        """Wait (the store's lock released) until a commit settled `ticket`: None, or
        why it failed."""
        with self.cond:
            while self.covered < ticket:
                self.cond.wait()
            return self.failed.pop(ticket, None)


IDLE_GROUP = Group()
"""The group of every session of an engine whose appends flush nothing
(`durability="flush"`): nothing is ever staged in it, so it never holds anything."""


class GroupTurn(WriterTurn):
    """A durable writer's turn on a file engine session: it counts as queued from
    `__enter__` to `start`, appends through `append_in_turn` (which stages the batch
    when others are queued, setting `ticket`), commits what is staged on `finish`
    when nobody is queued (`settle`: True when that commit failed), and waits on
    `__exit__` for the commit that covers its batch."""

    __slots__ = ("append_in_turn", "group", "path", "settle", "ticket")

    def __init__(
        self,
        engine: Engine,
        session_id: str,
        group: Group,
        path: str,
        append_in_turn: Callable[[GroupTurn, EncodedBatch, Head], Head],
        settle: Callable[[], bool],
    ) -> None:
        super().__init__(engine, session_id)
        self.group = group
        self.path = path
        self.append_in_turn = append_in_turn
        self.settle = settle
        self.ticket = 0

    def __enter__(self) -> GroupTurn:
        self.group.arrive()
        return self

    def start(self) -> None:
        self.group.enter()

    def append(self, batch: EncodedBatch, expected: Head) -> Head:
        return self.append_in_turn(self, batch, expected)

    def finish(self) -> bool:
        if self.group.holding and not self.group.others_queued():
            return self.settle()
        return False

    def __exit__(self, exc_type: object, *exc: object) -> None:
        ticket, self.ticket = self.ticket, 0
        if ticket:
            reason = self.group.wait(ticket)
            if reason is not None and exc_type is None:
                raise StorageError(
                    f"{self.path}: the flush this append shared failed ({reason}):"
                    " nothing of it was stored"
                )

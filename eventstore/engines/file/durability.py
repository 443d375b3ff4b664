"""`durability="fsync"` in the file engine: an append made durable through the journal's
mirror (`eventstore.engines.file.journal`) instead of flushing the growing log, and the
journal's epoch ended whenever the log is replaced (`bump_generation`).

Every function here runs with the session's writers' lock held (`SessionState`: its
descriptors, the epoch this process last found, the lock file's hints).
"""

from __future__ import annotations

import os
from typing import NoReturn

from eventstore import entropy
from eventstore.engines.base import EncodedBatch
from eventstore.engines.file import journal as file_journal
from eventstore.engines.file.layout import datasync, pwrite_all, write_all
from eventstore.engines.file.logfile import open_existing
from eventstore.engines.file.session import GEN_BYTES, SessionState, write_lock_head
from eventstore.errors import EventStoreError, StorageError
from eventstore.logger import log

__all__ = [
    "bump_generation",
    "commit_staged",
    "epoch_named",
    "make_durable",
    "retire_journal",
    "scrub_journal",
    "set_hints",
    "stage",
    "start_epoch",
    "start_epoch_after",
]


def bump_generation(sess: SessionState, *, retire: bool = True) -> None:
    """Tell every process's cached descriptors that the log is being replaced (the
    writers' lock is held). Called before the replacing step: a crash after it
    costs others one reopen; the other order could leave them writing to a file
    that is no longer the log. `retire`: the journal's epoch goes with the log being
    replaced (see `retire_journal`); a removal, which takes the journal with it,
    passes False."""
    if retire:
        retire_journal(sess)
    gen = (int.from_bytes(os.pread(sess.lock_fd, GEN_BYTES, 0), "big") + 1) % (1 << 64)
    # the journal's hints, where there are any, go with the log being replaced: no
    # epoch mirrors the next one (a lock file without hints stays 8 bytes)
    hints = (0, 0) if len(sess.head) > GEN_BYTES else None
    write_lock_head(sess, gen.to_bytes(GEN_BYTES, "big"), hints)
    sess.drop_log_fd()


def retire_journal(sess: SessionState) -> None:
    """End the journal's epoch before the log is replaced (writers' lock held): the
    log is flushed (what only the mirror held is then durable in it), then the
    header is cleared and flushed. Else a replacement that cuts the log short (a
    repair) would have the lines it dropped copied back after a crash, the content
    check finding the line before the epoch still in place."""
    paths = sess.paths
    if len(sess.head) > GEN_BYTES:
        # first no writer may go on mirroring (the hints name the epoch): if this
        # fails, the epoch stays whole, and so does everything it mirrors
        write_lock_head(sess, sess.gen, (0, 0))
    if sess.journal_fd < 0 and not os.path.lexists(paths.journal):
        return
    fd = sess.journal_fd if sess.journal_fd >= 0 else file_journal.open_journal(paths.journal)
    try:
        if file_journal.read_epoch(fd) is None:
            return
        log_fd, _ = open_existing(paths.log)
        if log_fd is not None:
            try:
                datasync(log_fd)
            finally:
                os.close(log_fd)
        file_journal.retire(fd)
    finally:
        if fd != sess.journal_fd:
            os.close(fd)
    sess.epoch = None


def scrub_journal(sess: SessionState) -> None:
    """Zero the journal's mirror (writers' lock held, after a log was replaced without
    keeping history, its epoch retired by the replacement): the bytes it mirrored are
    the replaced log's, which must not outlive it in the journal (a deleted session's,
    a compaction's that dropped them on purpose)."""
    paths = sess.paths
    if sess.journal_fd < 0 and not os.path.lexists(paths.journal):
        return
    fd = sess.journal_fd if sess.journal_fd >= 0 else file_journal.open_journal(paths.journal)
    try:
        if file_journal.read_epoch(fd) is None:  # retired: nothing relies on the mirror
            pwrite_all(fd, bytes(file_journal.SIZE), file_journal.DATA_AT)
            datasync(fd)
    finally:
        if fd != sess.journal_fd:
            os.close(fd)


def make_durable(
    sess: SessionState, fd: int, batch: EncodedBatch, start: int, ident: tuple[int, int]
) -> None:
    """Flush an append `FileEngine._write` wrote at `start` (writers' lock held): into the
    journal's mirror when the epoch the lock file's hints name mirrors this log up
    to `start` and has room, else by flushing the log itself, which then starts a
    new epoch at its end (`eventstore.engines.file.journal`). An OSError means
    nothing was made durable: the caller cuts the append back off."""
    data = batch.data
    number, mirrored = file_journal.hints(sess.head)
    ep = sess.epoch
    if ep is None or ep.number != number:
        ep = sess.epoch = epoch_named(sess, number, ident)
    voided = True  # nothing of the batch is in the mirror, or zeros are over it
    if ep is not None and mirrored == start and file_journal.fits(ep, start, len(data)):
        try:
            file_journal.mirror(sess.journal_fd, ep, data, start)
        except OSError:
            # flush the log instead; the bytes may be in the mirror, and if that
            # flush fails too they must not come back after a crash: zeros over
            # them, flushed (if that fails too, the caller says the batch may return)
            sess.epoch = None
            try:
                file_journal.mirror(sess.journal_fd, ep, bytes(len(data)), start)
            except OSError:
                voided = False
        else:
            set_hints(sess, ep.number, start + len(data))
            return
    try:
        datasync(fd)
    except OSError as exc:
        exc.mirror_kept = not voided  # type: ignore[attr-defined]  # (for _write)
        raise
    start_epoch_after(sess, start + len(data), batch, ident)


def start_epoch_after(
    sess: SessionState, end: int, batch: EncodedBatch, ident: tuple[int, int]
) -> None:
    """Start an epoch at the end of a batch the log itself made durable; a failure
    costs the next append the same again, never this one its durability."""
    try:
        start_epoch(sess, end, batch.last_seq, batch.link, ident)
    except (OSError, EventStoreError) as exc:  # (a planted link): the append is durable
        # in the log; the next one tries again
        sess.epoch = None
        log.debug("eventstore: %s: starting a journal epoch failed: %s", sess.paths.journal, exc)


def epoch_named(
    sess: SessionState, number: int, ident: tuple[int, int]
) -> file_journal.Epoch | None:
    """The journal's epoch, if it is the one numbered `number` and mirrors the log
    `ident` (another process of this store may have started it)."""
    if number == 0:
        return None
    try:
        if sess.journal_fd < 0:
            sess.journal_fd = file_journal.open_journal(sess.paths.journal)
        if not file_journal.whole(sess.journal_fd):
            return None  # cut short (a mirror write would leave a hole before it)
        ep = file_journal.read_epoch(sess.journal_fd)
    except (OSError, EventStoreError):
        return None
    return ep if ep is not None and ep.number == number and ep.ident == ident else None


def start_epoch(
    sess: SessionState, start: int, seq: int, link: str, ident: tuple[int, int]
) -> None:
    """Start a new epoch of the journal at log offset `start` (durable in the log up
    to there), creating the journal on the session's first durable append."""
    if sess.journal_fd < 0:
        sess.journal_fd = file_journal.create(sess.paths.journal)
    number = entropy.random_bits(64) | 1  # (never 0: "no epoch")
    ep = file_journal.Epoch(number, start, ident, seq, link)
    file_journal.start_epoch(sess.journal_fd, ep)
    sess.epoch = ep
    set_hints(sess, number, start)


def set_hints(sess: SessionState, number: int, end: int) -> None:
    """Write the lock file's hints (never flushed: a lost hint costs a new epoch)."""
    gen = sess.gen if len(sess.gen) == GEN_BYTES else bytes(GEN_BYTES)
    try:
        write_lock_head(sess, gen, (number, end))
    except OSError:
        sess.epoch = None


# -- group commit (`eventstore.engines.file.groupflush`) ------------------------------------


def stage(sess: SessionState, batch: EncodedBatch, start: int, ident: tuple[int, int]) -> bool:
    """Stage a batch for a group commit (writers' lock held, kept for the group): its
    bytes into the mirror of the epoch that mirrors the log up to `start`, unflushed,
    and into `sess.group`; False when that epoch cannot take it (none, another's, or
    full: the caller commits what is staged and appends as a lone writer does)."""
    data = batch.data
    number, mirrored = file_journal.hints(sess.head)
    ep = sess.epoch
    if ep is None or ep.number != number:
        ep = sess.epoch = epoch_named(sess, number, ident)
    if ep is None or mirrored != start or not file_journal.fits(ep, start, len(data)):
        return False
    try:
        file_journal.mirror(sess.journal_fd, ep, data, start, flush=False)
    except OSError:
        return False  # (unflushed, and the next writer mirrors over it)
    set_hints(sess, ep.number, start + len(data))
    return True


def commit_staged(sess: SessionState, fd: int) -> None:
    """Commit the group's staged batches (writers' lock held for the group): flush the
    journal, whose mirror holds them, then write them to the log open at `fd` in one
    call. Settles every ticket; on failure voids their mirror bytes, ends the epoch
    and raises StorageError (nothing of them was stored, or it says they may return)."""
    group = sess.group
    at, data = group.take()
    try:
        try:
            datasync(sess.journal_fd)
        except OSError as exc:
            _fail_staged(sess, at, data, "flushing the journal", exc)
        try:
            write_all(fd, data)
        except OSError as exc:
            try:
                os.ftruncate(fd, at)
            except OSError:
                pass  # the next writer sets the torn tail aside (the journal is voided below)
            _fail_staged(sess, at, data, "writing the log", exc)
    except BaseException:
        group.settle("interrupted")  # (no-op once settled): no writer waits forever
        raise
    group.settle(None)


def _fail_staged(sess: SessionState, at: int, data: bytes, step: str, exc: OSError) -> NoReturn:
    """A group commit failed at `step`: zeros over the staged batches' mirror bytes,
    flushed (else they could come back after a crash), the tickets failed, the epoch
    ended (`end_epoch`); raises the StorageError the committing writer gets."""
    ep, voided = sess.epoch, False
    if ep is not None:
        try:
            file_journal.mirror(sess.journal_fd, ep, bytes(len(data)), at)
            voided = True
        except OSError:
            pass
    end_epoch(sess)
    why = f"{step} failed: {exc.strerror or exc}"
    if not voided:
        why += "; voiding them in the journal failed too: they may return after a crash"
    sess.group.settle(why)
    raise StorageError(
        f"{sess.paths.log}: a group commit at byte {at} failed ({why}); nothing of its"
        " appends was stored" + ("" if voided else " unless a crash brings them back"),
        exc.errno,
    ) from exc


def end_epoch(sess: SessionState) -> None:
    """After a failed flush: no later batch may be mirrored behind bytes the disk may
    not hold, so the lock file's hints name no epoch and the next durable append
    flushes the log and starts one (best effort: a mismatch costs a new epoch too)."""
    sess.epoch = None
    if len(sess.gen) == GEN_BYTES:
        try:
            write_lock_head(sess, sess.gen, (0, 0))
        except OSError:
            pass

"""Copy sessions between any two engines, byte for byte, history included.

`migrate_session(src, dst, session_id)` reads the source's history (the kept segments,
then the live log) and replays it into the destination through the engine interface
alone: runs of committed lines become appends, and each point where the source
installed a snapshot becomes `install_snapshot(..., keep_history=True)` at the same
sequence number with the same snapshot line. Every line keeps its exact bytes, so the
hash chain, `verify` and `export` agree on both sides.

Idempotent and resumable: what the destination already holds must be a prefix of the
source's plan (an earlier, interrupted run); the copy continues after it. A destination
that holds anything else is refused (`MigrationError`) and left unchanged.

Every byte of history the source keeps is copied, with its segmentation (each kept
segment comes back as one), or nothing is. Where the source kept a segment boundary
but not the snapshot line that made it (the file and memory engines archive only the
lines after a log's opening snapshot, so a compaction's snapshot leaves with the next
one), the copy compacts at that seq with the destination's own projections ("cut"):
the same boundary, and on a destination that keeps such lines (PostgreSQL) a snapshot
line of its own there. Otherwise: a history the interface cannot replay is
refused (`MigrationError`) before anything is written at the destination. That is a
history pruned by `prune_archive` (it starts after seq 1, without a snapshot standing
in), and a hole: a compaction that kept no history after one that did (an archive of
seq 1..20, then the lines up to seq 30 compacted away), since a snapshot can only be
installed over the lines it covers. Pruning the archive before the hole's snapshot
(on an engine that prunes) leaves a history that starts at that snapshot, which copies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec

from eventstore.core.segments import pruned_start
from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.engines.base import (
    EMPTY_HEAD,
    EncodedBatch,
    Engine,
    KeyEngine,
)
from eventstore.errors import EventStoreError
from eventstore.format.chain import split_hash
from eventstore.format.codec import EventCodec
from eventstore.format.crypt import key_id_of
from eventstore.format.depth import HEAD_DECODER
from eventstore.format.events import LineHead
from eventstore.ops import compaction

__all__ = [
    "MigrationError",
    "MigrationResult",
    "Step",
    "migrate_session",
    "plan_of",
    "same_history",
]

_heads = HEAD_DECODER
_MAX_LINES = 1000
_MAX_BYTES = 4 << 20  # lines per destination append: fewer round trips, bounded memory


class MigrationError(EventStoreError):
    """The destination holds something other than a prefix of the source's history."""


class Step(msgspec.Struct, frozen=True):
    """One step of a session's replay: `kind` is "open" (a log that starts with a
    snapshot), "line" (a committed line), "install" (a snapshot over the lines before)
    or "cut" (a segment boundary whose snapshot line was not kept: `line` is empty)."""

    kind: str
    seq: int
    line: bytes
    h: str
    link: str
    closes: bool  # a line that ends its batch (every snapshot does)


class MigrationResult(msgspec.Struct, frozen=True):
    """What `migrate_session` did: lines and snapshots written now, the steps the
    destination already had, and the steps of the whole history."""

    session_id: str
    written: int
    already: int
    total: int


def _committed_lines(data: bytes, where: str) -> Iterator[tuple[LineHead, bytes]]:
    """The lines of complete batches (a torn tail is left out, as readers do)."""
    pending: list[tuple[LineHead, bytes]] = []
    start = 0
    while True:
        nl = data.find(b"\n", start)
        if nl < 0:
            return
        line = data[start : nl + 1]
        start = nl + 1
        if not line.strip():
            continue
        try:
            head = _heads.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MigrationError(f"{where}: undecodable line at byte {start}: {exc}") from None
        pending.append((head, line))
        if not head.more or head.type == "snapshot":
            yield from pending
            pending = []


def _step(kind: str, head: LineHead, line: bytes, where: str) -> Step:
    split = split_hash(line[:-1])
    if split is None:
        raise MigrationError(f"{where}: seq {head.seq} has no hash")
    h = split[1]
    if head.type == "snapshot":
        return Step(kind, head.seq, line, h, head.base_h or "", True)
    return Step(kind, head.seq, line, h, h, not head.more)


def plan_of(engine: Engine, session_id: str) -> list[Step]:
    """The replay steps of a session's whole history; MigrationError for one that cannot
    be replayed (see the module docstring)."""
    plan: list[Step] = []
    with engine.history(session_id) as hist:
        for seg in hist:
            where = seg.where
            first_of_segment = True
            for head, line in _committed_lines(seg.read(), where):
                starts, first_of_segment = first_of_segment, False
                last = plan[-1].seq if plan else 0
                if head.type == "snapshot":
                    if plan and plan[0].seq <= head.seq:
                        while plan and plan[-1].seq > head.seq:
                            plan.pop()  # the newer segment holds these as copies
                        last = plan[-1].seq if plan else 0
                    if plan and last == head.seq:
                        if plan[-1].line != line:
                            plan.append(_step("install", head, line, where))
                        continue
                    if plan:
                        raise _hole_error(where, session_id, plan[0].seq, last, head.seq)
                    plan = [_step("open", head, line, where)]  # a log opening with it
                    continue
                if head.seq <= last:
                    continue  # a copy of a line an older segment already gave
                if starts and head.seq == last + 1 and plan and plan[-1].kind == "line":
                    # a kept segment boundary without its snapshot line (see module doc)
                    plan.append(Step("cut", last, b"", "", "", True))
                if head.seq != last + 1:
                    kept = pruned_start(hist)[0] if not plan else 1
                    if kept > 1:  # not damage: verify calls pruned history clean
                        raise MigrationError(
                            f"{where}: session {session_id!r}: events 1..{kept - 1} were"
                            f" pruned, so its history starts at seq {kept}; migrate copies"
                            " a history from its beginning, and cannot copy this one"
                        )
                    raise MigrationError(
                        f"{where}: seq {head.seq} follows seq {last}: run verify on the source"
                    )
                plan.append(_step("line", head, line, where))
    return plan


def _hole_error(where: str, session_id: str, first: int, last: int, snap: int) -> MigrationError:
    return MigrationError(
        f"{where}: session {session_id!r}: its kept history holds seq {first}..{last}, then"
        f" resumes at the snapshot of seq {snap}: seq {last + 1}..{snap} were compacted"
        " without an archive, and a snapshot can only be installed over the lines it"
        " covers, so this history cannot be copied whole; nothing was written. To copy"
        f" the session without seq {first}..{last}, prune its archive before seq {snap}"
        f" first (`eventstore compact ROOT {session_id} --prune-archive-before {snap}`)"
    )


def migrate_session(
    src: Engine,
    dst: Engine | CoreOwner,
    session_id: str,
    progress: Callable[[int, int], None] | None = None,
) -> MigrationResult:
    """Copy one session's history from `src` to `dst` (see the module docstring).

    `dst` is an engine, or a store (its projections then build the snapshot of a "cut";
    an engine gets the built-in ones). `progress(done, total)` is called after every
    destination write.
    """
    plan = plan_of(src, session_id)
    target = core_of(dst) if not isinstance(dst, Engine) else None
    dst_engine = target.engine if target is not None else dst
    assert isinstance(dst_engine, Engine)
    have = plan_of(dst_engine, session_id)
    if len(have) > len(plan) or any(not _same(a, b) for a, b in zip(have, plan, strict=False)):
        first = next(
            (a.seq for a, b in zip(have, plan, strict=False) if not _same(a, b)), len(plan)
        )
        raise MigrationError(
            f"{dst_engine.url}: session {session_id!r} already holds other lines"
            f" (from seq {first}); remove it there first or pick another destination"
        )
    dst = dst_engine
    _copy_key_slot(src, dst, session_id)
    head = dst.head(session_id) if have else EMPTY_HEAD
    done = len(have)
    i = done
    while i < len(plan):
        step = plan[i]
        if step.kind == "install":
            head = dst.install_snapshot(session_id, step.line, head, keep_history=True).head
            i += 1
        elif step.kind == "cut":
            core = target if target is not None else SessionCore(dst, EventCodec())
            report = compaction.compact(core, session_id, archive=True, force=True)
            head = dst.head(session_id)
            if report.last_seq != step.seq or head.seq != step.seq:
                raise MigrationError(
                    f"{dst.url}: session {session_id!r}: the compaction at seq {step.seq}"
                    f" covered seq {report.last_seq} (another writer?): run migrate again"
                )
            i += 1
        else:
            j = i + 1
            size = len(step.line)
            while (
                j < len(plan)
                and plan[j].kind == "line"
                and j - i < _MAX_LINES
                and (size < _MAX_BYTES or not plan[j - 1].closes)
            ):
                size += len(plan[j].line)
                j += 1
            while j > i + 1 and not plan[j - 1].closes:
                j -= 1  # never split a batch: one append holds whole batches
            run = plan[i:j]
            if not run[-1].closes:
                raise MigrationError(
                    f"{src.url}: session {session_id!r}: batch at seq {run[0].seq} has no end"
                )
            batch = EncodedBatch(
                data=b"".join(s.line for s in run),
                first_seq=run[0].seq,
                last_seq=run[-1].seq,
                hashes=tuple(s.h for s in run),
                link=run[-1].link,
            )
            head = dst.append(session_id, batch, head)
            i = j
        if progress is not None:
            progress(i, len(plan))
    return MigrationResult(session_id, len(plan) - done, done, len(plan))


def _copy_key_slot(src: Engine, dst: Engine, session_id: str) -> None:
    """Copy an encrypted session's key slot (its data key, wrapped: no key is needed or
    seen) before any of its lines, so the destination never holds a sealed line
    without its key. MigrationError if the destination keeps no key slots, or holds
    another key for the session."""
    dk = key_id_of(session_id)
    data = src.load_key_slot(dk) if isinstance(src, KeyEngine) else None
    if data is None:
        return
    if not isinstance(dst, KeyEngine):
        raise MigrationError(
            f"{dst.url}: session {session_id!r} is encrypted and this engine keeps no key"
            " slots: nothing was copied"
        )
    if not dst.create_key_slot(dk, data) and dst.load_key_slot(dk) != data:
        raise MigrationError(
            f"{dst.url}: session {session_id!r}: the destination holds another data key"
            f" {dk!r} for it: nothing was copied"
        )


def _same(a: Step, b: Step) -> bool:
    """The same step: the same bytes, or the same boundary where one side kept no
    snapshot line (a "cut") and the other its own."""
    if "cut" in (a.kind, b.kind):
        return {a.kind, b.kind} <= {"cut", "install"} and a.seq == b.seq
    return a.kind == b.kind and a.line == b.line


def same_history(a: Engine, b: Engine, session_id: str) -> bool:
    """Whether two engines hold the same replay steps for a session (byte for byte,
    but for the snapshot lines of boundaries one of them does not keep)."""
    pa, pb = plan_of(a, session_id), plan_of(b, session_id)
    return len(pa) == len(pb) and all(_same(x, y) for x, y in zip(pa, pb, strict=True))

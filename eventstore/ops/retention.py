"""Retention policies: what a store keeps, applied at automatic compaction and by `gc`.

Owns `Policy` (how long an idle session lives, how long archived history is kept, how
many lines a live log may hold before it is compacted) and `gc`, which applies one to
every session of a store. Writes little of its own: every removal goes through an
existing atomic operation, so each is recorded where `verify` and the audit read it:
an idle session is deleted with a tombstone (`lifecycle.expire_one`, whose tombstone
append re-checks the head it judged, so a session written to meanwhile is kept), old
archived segments are pruned behind an `archive_pruned` event (`lifecycle.prune_archive`)
and a long live log is compacted with its lines archived (`compaction.compact`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import msgspec

from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.core.validation import described, flag, optional_age, optional_whole
from eventstore.engines.base import PruningEngine
from eventstore.errors import EventStoreError, InvalidArgumentError, UnsupportedError
from eventstore.ops import lifecycle, tombstone

__all__ = ["GcReport", "Policy", "check_engine", "gc", "over", "prune_old_archive"]


class Policy(msgspec.Struct, frozen=True):
    """A retention policy; None leaves that part off.

    `idle`: a session whose last event is older than this is deleted, leaving a
    tombstone (by `gc` only: a session being appended to is not idle). `archive_older_than`:
    archived history whose newest line is older than this is pruned, behind an
    `archive_pruned` event (every engine but PostgreSQL). `keep_events`: a
    session whose live log holds more lines than this is compacted (its lines archived;
    skipped, as automatic compaction is, when the snapshot would not be smaller).
    Given to `SessionStore(retention=...)`, `keep_events` and `archive_older_than` are
    applied after each append as automatic compaction is; `SessionStore.gc` applies all
    three to every session."""

    idle: timedelta | None = None
    archive_older_than: timedelta | None = None
    keep_events: int | None = None

    def __post_init__(self) -> None:
        optional_age(self.idle, "Policy.idle")
        optional_age(self.archive_older_than, "Policy.archive_older_than")
        n = optional_whole(self.keep_events, "Policy.keep_events")
        if n is not None and n < 1:
            raise InvalidArgumentError(f"Policy.keep_events must be >= 1, not {n}")


class GcReport(msgspec.Struct):
    """What `gc` did, or with `dry_run` would do. `tombstoned`: the sessions deleted
    (idle); `kept`: judged idle but written to before the delete, so kept; `compacted`:
    the sessions compacted; `pruned`: one report per session whose archive was pruned
    (its segments and bytes); `failed`: (session, why) — the other sessions went on.
    `bytes_freed`: the bytes the store's sessions take less afterwards (live logs and
    archives; a compaction archives what it replaces, so it frees nothing by itself);
    on a dry run, the bytes of the sessions that would be tombstoned and the segments
    that would be pruned."""

    dry_run: bool
    sessions: int = 0
    tombstoned: list[str] = msgspec.field(default_factory=list)
    kept: list[str] = msgspec.field(default_factory=list)
    compacted: list[str] = msgspec.field(default_factory=list)
    pruned: list[lifecycle.PruneReport] = msgspec.field(default_factory=list)
    failed: list[tuple[str, str]] = msgspec.field(default_factory=list)
    bytes_freed: int = 0

    @property
    def pruned_segments(self) -> int:
        """How many archived segments were (or would be) pruned."""
        return sum(len(p.segments) for p in self.pruned)

    @property
    def pruned_bytes(self) -> int:
        """The bytes of those segments."""
        return sum(p.bytes for p in self.pruned)


def check_engine(core: CoreOwner, policy: Policy) -> None:
    """UnsupportedError when the policy prunes archives and the engine cannot."""
    engine = core_of(core).engine
    if policy.archive_older_than is not None and not isinstance(engine, PruningEngine):
        raise UnsupportedError(
            f"the {engine.url} engine cannot prune archived history: a policy with"
            " archive_older_than cannot apply to it"
        )


def over(policy: Policy, lines: int) -> bool:
    """Whether a live log of `lines` lines holds more than the policy keeps."""
    return policy.keep_events is not None and lines > policy.keep_events


def prune_old_archive(
    core: CoreOwner,
    session_id: str,
    policy: Policy,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
) -> lifecycle.PruneReport | None:
    """Prune the session's archived history older than `archive_older_than` (run after
    each automatic compaction, and by `gc`); None when the policy keeps it all."""
    if policy.archive_older_than is None:
        return None
    cutoff = _before(now, policy.archive_older_than)
    if cutoff is None:
        return None
    return lifecycle.prune_archive(core, session_id, cutoff, dry_run=dry_run)


def _before(now: datetime | None, age: timedelta) -> datetime | None:
    """`now - age`, None when that is before the calendar (nothing is that old)."""
    try:
        return (now or datetime.now(UTC)) - age
    except OverflowError:
        return None


def _session_bytes(core: SessionCore, session_id: str) -> int:
    """The bytes a session takes: its archived segments and its live log."""
    with core.engine.history(session_id) as hist:
        return sum(seg.size for seg in hist.segments)


def gc(
    core: CoreOwner,
    policy: Policy,
    *,
    dry_run: bool = False,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> GcReport:
    """Apply `policy` to every session of the store (as of `now`), one at a time: an
    idle one is tombstoned; any other is compacted if its live log holds more than
    `keep_events` lines, then its archive older than `archive_older_than` pruned. Safe
    beside live writers (each step is an atomic operation that re-checks the head it
    acts on). A session that fails is reported and the rest go on. `dry_run` changes
    nothing and reports what would go. `progress(done, total)` is called before each
    session and once at the end. UnsupportedError, nothing changed, when the policy
    prunes archives and the engine cannot."""
    core = core_of(core)
    if not isinstance(policy, Policy):
        raise InvalidArgumentError(f"policy must be a Policy, not {described(policy)}")
    flag(dry_run, "dry_run")
    if now is not None and (not isinstance(now, datetime) or now.utcoffset() is None):
        raise InvalidArgumentError(f"now must be a timezone-aware datetime, not {now!r}")
    check_engine(core, policy)
    now = now or datetime.now(UTC)
    core.check_open()
    report = GcReport(dry_run)
    sessions = tombstone.live_sessions(core)
    freed = 0
    for i, sid in enumerate(sessions):
        if progress is not None:
            progress(i, len(sessions))
        try:
            freed += _gc_one(core, sid, policy, now, dry_run, report)
        except (EventStoreError, OSError) as exc:
            report.failed.append((sid, " ".join(str(exc).split())))
    if progress is not None:
        progress(len(sessions), len(sessions))
    report.sessions = len(sessions)
    report.bytes_freed = freed
    return report


def _gc_one(
    core: SessionCore,
    sid: str,
    policy: Policy,
    now: datetime,
    dry_run: bool,
    report: GcReport,
) -> int:
    """Apply the policy to one session, adding to `report`; the bytes it freed."""
    before = _session_bytes(core, sid)
    if tombstone.tombstone_of(core, sid) is not None:
        # a delete killed before its erasure: deleted already, it takes no more events
        # (no pruning record); finishing the erasure is what is left to do
        if not dry_run:
            tombstone.erase(core, sid)
        return 0 if dry_run else before - _session_bytes(core, sid)
    idle_cut = None if policy.idle is None else _before(now, policy.idle)
    if idle_cut is not None:
        res = lifecycle.expire_one(core, sid, idle_cut, dry_run=dry_run, purge=False)
        if res is not None and res.result != "kept":
            if res.result == "failed":
                report.failed.append((sid, res.error or "failed"))
                return 0
            if res.result == "gone":
                return 0
            report.tombstoned.append(sid)
            return before if dry_run else before - _session_bytes(core, sid)
        if res is not None:
            report.kept.append(sid)
    head = core.engine.head(sid)
    if over(policy, head.seq - head.base_seq + 1):
        # loaded when first used: the session API's hot path imports this module
        from eventstore.ops import compaction

        done = compaction.compact(core, sid, archive=True, dry_run=dry_run)
        if done.compacted or (dry_run and done.skipped is None):
            report.compacted.append(sid)
    pruned = prune_old_archive(core, sid, policy, now=now, dry_run=dry_run)
    if pruned is not None and pruned.segments:
        report.pruned.append(pruned)
    if dry_run:
        return 0 if pruned is None else pruned.bytes
    return before - _session_bytes(core, sid)

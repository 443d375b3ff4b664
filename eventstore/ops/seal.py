"""Seals: signed heads, written into a session's log (and to a witness), and checked.

A seal is a `seal` line (`eventstore.format.events.Sealed`) appended right after the line
it seals: it carries the session id, the sealed line's seq and `h` (which chains every
line before it), the time, the key id and the policy's `every`, signed with the store's
Ed25519 key (`eventstore.signing`). Being a line of the log, it travels with the log
(migrate, export, archives) and is covered by the chain like any other; it folds to
nothing. A compaction does not carry seals in its snapshot: the archive keeps the
sealed lines, and a sealing store seals the snapshot it installed at once (a seal of a
head no segment holds any more could prove nothing).

`Sealer` is what a store opened with a signing key runs: it seals a session at close
(when it wrote to it since its last seal), after compaction, and after a write once
`SealPolicy.every` events or `SealPolicy.seconds` seconds have passed since the last
seal it wrote (checked at writes: no thread wakes a store up to seal). Every seal is also
appended, as one JSON line of its facts (`SealFacts`), to the policy's witness file when
one is given: an append-only place outside the store.

`check_seals` is what `verify` adds when given a public key or a witness (findings in
its report, never exceptions): each seal's signature (`seal_signature`, `seal_key`,
`seal_session`), that the history holds the sealed `h` at the sealed seq
(`seal_mismatch`: rewritten after the seal, a recomputed chain included; `seal_ahead`:
the history ends before a sealed seq, i.e. it was cut short), a session with no seal
(`seal_missing`), more than `every` events after a seal before the next
(`seal_overdue`), and a witness seal whose line the log no longer holds (`seal_dropped`).
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

import msgspec

from eventstore import entropy
from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.core.validation import described
from eventstore.engines.base import Head, open_engine, redact_text
from eventstore.errors import (
    EventStoreError,
    InvalidArgumentError,
    SessionDeletedError,
    StorageError,
    UnknownSessionError,
)
from eventstore.format.codec import EventCodec
from eventstore.format.events import Event, Sealed, SealWitnessed, Snapshot
from eventstore.format.reader import Problem, Severity
from eventstore.logger import log
from eventstore.ops import history
from eventstore.regular import read_regular
from eventstore.signing import key_id, sign, signature_checks
from projections.lifecycle import is_erased_tombstone

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "SealFacts",
    "SealHistory",
    "SealPolicy",
    "Sealer",
    "StoreWitness",
    "Witness",
    "append_witness",
    "check_witness",
    "check_seals",
    "is_store_url",
    "load_witness",
    "read_witness",
    "witness_writer",
]


_MESSAGE_PREFIX = b"eventstore-seal-v1\n"
_encoder = msgspec.json.Encoder()


class SealPolicy(msgspec.Struct, frozen=True):
    """When a store opened with a signing key seals a session.

    `every`: after a write that brings the events since the session's last seal to this
    many (None: never by count); `verify` reports a session where more follow a seal.
    `seconds`: after a write that comes this long after the last seal this store wrote,
    or after its first write to the session (None: never by time; checked at writes
    only). `on_close`: at `close()`, every
    session this store wrote to since its last seal. `witness`: where every seal is also
    written: the path of an append-only JSONL file, or the URL of another store (a
    `seal_witnessed` event in its session of the same id); None: nowhere.
    """

    every: int | None = 1000
    seconds: float | None = None
    on_close: bool = True
    witness: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        if self.every is not None and (
            not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1
        ):
            raise InvalidArgumentError(f"every must be an int >= 1 or None, not {self.every!r}")
        if self.seconds is not None and (
            not isinstance(self.seconds, (int, float)) or self.seconds <= 0
        ):
            raise InvalidArgumentError(f"seconds must be > 0 or None, not {self.seconds!r}")
        check_witness(self.witness)


def check_witness(witness: object) -> None:
    """InvalidArgumentError unless `witness` is None or a witness: a non-empty str or
    `os.PathLike` of one (a file's path, or a store's URL). Anything else failed with
    Python's own TypeError, a policy's only at its first seal, after that seal was
    written."""
    text = os.fspath(witness) if isinstance(witness, (str, os.PathLike)) else None
    if witness is not None and (not isinstance(text, str) or not text):
        raise InvalidArgumentError(
            f"a witness must be a file's path or a store's URL, not {described(witness)}"
        )


class SealFacts(msgspec.Struct, kw_only=True, frozen=True):
    """What a seal says and its signature: a witness file's line, and a seal line's
    payload. `seq` and `h`: the sealed line."""

    session_id: str
    seq: int
    h: str
    at: datetime
    key_id: str
    every: int | None = None
    sig: str = ""

    def message(self) -> bytes:
        """The bytes the signature signs (everything but the signature)."""
        body = [self.session_id, self.seq, self.h, self.at, self.key_id, self.every]
        return _MESSAGE_PREFIX + _encoder.encode(body)

    @classmethod
    def of(cls, seal: Sealed) -> SealFacts:
        """The facts of a seal line."""
        return cls(
            session_id=seal.session_id,
            seq=seal.sealed_seq,
            h=seal.sealed_h,
            at=seal.at,
            key_id=seal.key_id,
            every=seal.every,
            sig=seal.sig,
        )


_witness_decoder = msgspec.json.Decoder(SealFacts)


class Sealer:
    """The seals of one store: its signing key, policy, and what it wrote since each
    session's last seal (see the module docstring). Safe to share between threads."""

    def __init__(
        self,
        key: Ed25519PrivateKey,
        policy: SealPolicy,
        witness: Callable[[SealFacts], None] | None = None,
    ) -> None:
        self.key = key
        self.witness = witness  # what writes each seal to the policy's witness
        self.key_id = key_id(key)
        self.policy = policy
        self._lock = threading.Lock()
        self._unsealed: dict[str, int] = {}  # lines since the last seal known, if written
        # the seq of the last seal line this store knows of, per session (0: none known;
        # another process's seals are unknown here, so it seals early, never late)
        self._seal_seq: dict[str, int] = {}
        self._since: dict[str, float] = {}  # when this store last sealed (monotonic)
        self._sealed_h: dict[str, str] = {}  # the h of the seal line this store wrote last

    def seal(
        self, core: CoreOwner, session_id: str, *, check_last: bool = True
    ) -> SealFacts | None:
        """Seal the session's head now; None when it has no line, or its last line is
        already a seal of the line before it (`check_last`: read it to know; without,
        only this store's own last seal is known)."""
        core = core_of(core)
        if check_last and self._last_is_seal(core, session_id):
            return None
        made: list[SealFacts] = []

        def build(head: Head, states: object) -> list[Event]:
            made.clear()
            if head.seq == 0 or head.h == self._sealed_h.get(session_id):
                return []
            facts = SealFacts(
                session_id=session_id,
                seq=head.seq,
                h=head.h,
                at=entropy.now(),
                key_id=self.key_id,
                every=self.policy.every,
            )
            facts = msgspec.structs.replace(facts, sig=sign(self.key, facts.message()))
            made.append(facts)
            return [_seal_line(facts)]

        # (called under the session's lock too: a seal never waits for a shared flush)
        result = core.write(session_id, build, None, share_flush=False)
        with self._lock:
            self._unsealed.pop(session_id, None)
            self._since[session_id] = time.monotonic()
        if result is None or not made:
            return None
        head = core.session(session_id).head
        with self._lock:
            self._seal_seq[session_id] = result.last_seq
            if head is not None and head.seq == result.last_seq:
                self._sealed_h[session_id] = head.h
        if self.witness is not None:
            try:
                self.witness(made[0])
            except OSError as exc:
                # the seal is in the log; the witness lacks it (verify --witness says
                # nothing of it: a witness only vouches for what it holds)
                raise StorageError(
                    f"session {session_id!r}: sealed seq {made[0].seq}, but writing the seal"
                    f" to the witness failed: {exc}",
                    exc.errno,
                ) from exc
        return made[0]

    def _last_is_seal(self, core: SessionCore, session_id: str) -> bool:
        n = core.engine.head(session_id).seq
        if n == 0:
            return False
        last = list(history.read_events(core, session_id, from_seq=n, to_seq=n))
        return bool(last) and type(last[-1]) is Sealed and last[-1].sealed_seq == n - 1

    def after_write(
        self, core: CoreOwner, session_id: str, last_seq: int, first_seq: int | None = None
    ) -> None:
        """Note a committed write of seqs `first_seq`..`last_seq`; seal when the policy says
        so: the lines since the last seal this store knows of (any writer's) reach `every`."""
        policy = self.policy
        now = time.monotonic()
        with self._lock:
            if self._seal_seq.get(session_id, 0) >= (first_seq or last_seq):
                # the log restarted under this id (a purge, or a restore after a delete):
                # the seal known went with the old log, and the count starts again
                self._seal_seq.pop(session_id, None)
                self._sealed_h.pop(session_id, None)
            n = last_seq - self._seal_seq.get(session_id, 0)
            self._unsealed[session_id] = n
            since = self._since.setdefault(session_id, now)
        due = (policy.every is not None and n >= policy.every) or (
            policy.seconds is not None and now - since >= policy.seconds
        )
        if due:
            self.seal_quietly(core, session_id)

    def seal_quietly(self, core: CoreOwner, session_id: str) -> None:
        """Seal, logging a failure instead of raising it: the write before it is
        committed, and failing it would make its caller retry and duplicate it (`verify`
        reports the seal missing)."""
        try:
            self.seal(core, session_id, check_last=False)
        except SessionDeletedError:
            pass  # deleted since its last write: a tombstone ends the log, no seal follows
        except Exception as exc:  # noqa: BLE001 - the write it follows is committed
            log.warning("eventstore: sealing %r failed: %s", session_id, exc)

    def close(self, core: CoreOwner) -> None:
        """Seal every session this store wrote to since its last seal (policy `on_close`)."""
        if not self.policy.on_close:
            return
        with self._lock:
            pending = [sid for sid, n in self._unsealed.items() if n > 0]
        for sid in pending:
            self.seal_quietly(core, sid)

    def release(self) -> None:
        """Release the witness (a witness store), once the store closes."""
        if isinstance(self.witness, StoreWitness):
            self.witness.close()


def _seal_line(facts: SealFacts) -> Sealed:
    return Sealed(
        session_id=facts.session_id,
        sealed_seq=facts.seq,
        sealed_h=facts.h,
        at=facts.at,
        key_id=facts.key_id,
        every=facts.every,
        sig=facts.sig,
    )


def append_witness(path: str | os.PathLike[str], facts: SealFacts) -> None:
    """Append `facts` as one line to the witness file (created 0600), flushed to the disk."""
    line = _encoder.encode(facts) + b"\n"
    # (not blocking, and only a regular file: a FIFO there would hang the sealing writer)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.write(fd, line)  # one write of one line with O_APPEND: lines never interleave
        os.fsync(fd)
    finally:
        os.close(fd)


def is_store_url(witness: str | os.PathLike[str]) -> bool:
    """Whether a witness is another store's URL (else the path of a witness file)."""
    return "://" in os.fspath(witness)


class Witness(msgspec.Struct):
    """What a witness holds of one session: its seals, and the problems reading it
    (`where`: the file or the store, as a report names it)."""

    where: str
    facts: list[SealFacts]
    problems: list[Problem]


class StoreWitness:
    """A witness that is another store (`SealPolicy(witness=URL)`): each seal a
    `seal_witnessed` event in its session of the same id, appended like any event (so
    the witness store's own chain covers them). Opened at the first seal; safe to share
    between threads."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        self.url = url
        self.create = create  # False for reading: a witness store not there is a finding
        self.where = redact_text(url)
        self._core: SessionCore | None = None
        self._lock = threading.Lock()

    def core(self) -> SessionCore:
        """The witness store's session core (opened once)."""
        with self._lock:
            if self._core is None:
                engine = open_engine(self.url, create=self.create)
                self._core = SessionCore(engine, EventCodec(), caches=False)
            return self._core

    def __call__(self, facts: SealFacts) -> None:
        """Append `facts` to the witness store."""
        event = SealWitnessed(
            session_id=facts.session_id,
            sealed_seq=facts.seq,
            sealed_h=facts.h,
            at=facts.at,
            key_id=facts.key_id,
            every=facts.every,
            sig=facts.sig,
        )
        self.core().write(facts.session_id, lambda head, states: [event], None)

    def read(self, session_id: str) -> Witness:
        """The seals the witness store holds of `session_id`."""
        try:
            events = history.read_events(self.core(), session_id, types=[SealWitnessed])
            facts = [SealFacts.of(e) for e in events if type(e) is SealWitnessed]
        except UnknownSessionError:
            facts = []
        except (EventStoreError, OSError) as exc:
            why = f"cannot read the witness: {redact_text(str(exc))}"
            return Witness(self.where, [], [Problem(self.where, 0, None, "witness", why)])
        return Witness(self.where, facts, [])

    def close(self) -> None:
        """Release the witness store."""
        with self._lock:
            if self._core is not None:
                self._core.close()
                self._core = None


def witness_writer(witness: str | os.PathLike[str] | None) -> Callable[[SealFacts], None] | None:
    """What writes each seal to a policy's witness: a `StoreWitness` for a store URL,
    an append to the witness file for a path, None for no witness."""
    if witness is None:
        return None
    if is_store_url(witness):
        return StoreWitness(os.fspath(witness))
    return functools.partial(append_witness, witness)


def load_witness(witness: str | os.PathLike[str], session_id: str) -> Witness:
    """What a witness (a file's path or a store's URL) holds of `session_id`."""
    check_witness(witness)
    if not is_store_url(witness):
        return read_witness(witness, session_id)
    store = StoreWitness(os.fspath(witness), create=False)  # a reader creates no store
    try:
        return store.read(session_id)
    finally:
        store.close()


def read_witness(path: str | os.PathLike[str], session_id: str) -> Witness:
    """A witness file's seals of `session_id`, and a problem for each line that is not a
    seal (or the file that cannot be read)."""
    where = os.fspath(path)
    try:
        data = read_regular(path)  # (a FIFO or device there would hang the reader)
    except OSError as exc:
        why = f"cannot read the witness: {exc.strerror}"
        return Witness(where, [], [Problem(where, 0, None, "witness", why)])
    found: list[SealFacts] = []
    problems: list[Problem] = []
    offset = 0
    for line in data.splitlines(keepends=True):
        if line.strip():
            try:
                facts = _witness_decoder.decode(line)
            except msgspec.MsgspecError as exc:
                problems.append(
                    Problem(where, offset, None, "witness", f"a line that is not a seal: {exc}")
                )
            else:
                if facts.session_id == session_id:
                    found.append(facts)
        offset += len(line)
    return Witness(where, found, problems)


class SealHistory(msgspec.Struct):
    """What `verify` read of a session that seals are checked against: each line by seq
    (the first segment holding a seq wins: an archive holds the original of a line a
    snapshot replaced), with the segment it was read from, and each snapshot line's
    own `h` by seq. `installed`: the seqs compactions installed a snapshot at (the last
    seq of each archived segment), held or not: a later compaction replaces the snapshot
    the log opened with, and no archive keeps it."""

    lines: dict[int, tuple[Event, str]]
    snapshot_h: dict[int, str]
    hashes: dict[int, str]
    head_seq: int
    installed: set[int] = msgspec.field(default_factory=set)


def check_seals(
    session_id: str,
    hist: SealHistory,
    public_key: Ed25519PublicKey | None,
    witness: Witness | None,
) -> list[Problem]:
    """The seal findings of a session (see the module docstring)."""
    found: list[Problem] = []
    seals = [(ev, where) for ev, where in hist.lines.values() if type(ev) is Sealed]
    seals.sort(key=lambda s: s[0].seq)
    if public_key is not None:
        kid = key_id(public_key)
        for ev, where in seals:
            found.extend(
                _check_one(SealFacts.of(ev), where, ev.seq, hist, public_key, kid, session_id)
            )
        found.extend(_check_policy(hist, [ev for ev, _ in seals]))
    if witness is not None:
        found.extend(witness.problems)
        kid = key_id(public_key) if public_key is not None else ""
        where = witness.where
        for f in witness.facts:
            found.extend(_check_one(f, where, None, hist, public_key, kid, session_id))
            held = hist.lines.get(f.seq + 1)
            if held is not None and (type(held[0]) is not Sealed or held[0].sig != f.sig):
                found.append(
                    Problem(
                        held[1], 0, f.seq + 1, "seal_dropped",
                        f"the witness holds a seal of seq {f.seq} (key {f.key_id}) made at"
                        f" {f.at.isoformat()}; the log's line after seq {f.seq} is not that"
                        " seal: it was dropped or replaced",
                    )
                )  # fmt: skip
    return found


def _check_one(
    facts: SealFacts,
    where: str,
    line_seq: int | None,
    hist: SealHistory,
    public_key: Ed25519PublicKey | None,
    kid: str,
    session_id: str,
) -> list[Problem]:
    """One seal: its session, key and signature (with a public key), and the history's
    line at the sealed seq."""
    what = f"the seal of seq {facts.seq} (key {facts.key_id}, made {facts.at.isoformat()})"
    seq = line_seq if line_seq is not None else facts.seq
    if facts.session_id != session_id:
        return [Problem(where, 0, seq, "seal_session",
                        f"{what} names session {facts.session_id!r}, not this one")]  # fmt: skip
    if public_key is not None:
        if facts.key_id != kid:
            return [Problem(where, 0, seq, "seal_key",
                            f"{what}: the public key given is {kid}, another key, so its"
                            " signature cannot be checked")]  # fmt: skip
        if not signature_checks(public_key, facts.message(), facts.sig):
            return [Problem(where, 0, seq, "seal_signature",
                            f"{what} has a signature key {kid} did not make: the seal"
                            " was forged or edited")]  # fmt: skip
    if line_seq is not None and facts.seq != line_seq - 1:
        return [Problem(where, 0, seq, "seal_mismatch",
                        f"{what} stands at seq {line_seq}, not right after the line it seals"
                        )]  # fmt: skip
    return _check_sealed_line(facts, where, seq, hist, what)


def _check_sealed_line(
    facts: SealFacts, where: str, seq: int, hist: SealHistory, what: str
) -> list[Problem]:
    """Whether the history holds the sealed `h` at the sealed seq."""
    n = facts.seq
    if n > hist.head_seq:
        return [Problem(where, 0, seq, "seal_ahead",
                        f"{what}, but the history ends at seq {hist.head_seq}: events after"
                        " it were cut off")]  # fmt: skip
    held = hist.lines.get(n)
    if held is None:
        return [Problem(where, 0, seq, "seal_unchecked",
                        f"{what}: no segment holds seq {n} any more (pruned or compacted"
                        " without an archive), so it cannot be checked", "warning")]  # fmt: skip
    line, _ = held
    if facts.h in (hist.hashes.get(n), hist.snapshot_h.get(n)):
        return []
    if n in hist.installed and n not in hist.snapshot_h:
        # a sealing store seals each snapshot it installs (its own `h`), and the next
        # compaction replaces it: the archive keeps the lines it stood for, not it
        return [Problem(where, 0, seq, "seal_unchecked",
                        f"{what}: it seals the snapshot a compaction installed at seq {n},"
                        " which a later compaction replaced (an archive keeps the lines a"
                        " snapshot stood for, not the snapshot), so it cannot be checked",
                        "warning")]  # fmt: skip
    if type(line) is Snapshot and facts.h == line.base_h:
        # sealed before a compaction without an archive: the snapshot's states stand in
        # for the line that was sealed, and nothing holds that line to compare
        return [Problem(where, 0, seq, "seal_unchecked",
                        f"{what}: a snapshot replaced that line without an archive; its"
                        " base_h is the sealed hash, but its states cannot be checked"
                        " against the seal", "warning")]  # fmt: skip
    held_h = hist.hashes.get(n)
    return [Problem(where, 0, seq, "seal_mismatch",
                    f"{what} signs hash {facts.h}, but the history's line at seq {n} has"
                    f" hash {held_h}: the history was rewritten after the seal")]  # fmt: skip


def _check_policy(hist: SealHistory, seals: list[Sealed]) -> list[Problem]:
    """`seal_missing` for a session with no seal at all; `seal_overdue` for a run of more
    than `every` events (beyond the batch that reached `every`) with no seal after it.
    A deleted session's log is its tombstone alone, which nothing can seal (a write after
    it is refused): it has no policy to keep."""
    lines = [ev for ev, _ in sorted(hist.lines.values(), key=lambda x: x[0].seq)]
    if not seals:
        if not lines or is_erased_tombstone(lines[-1]):
            return []
        where = hist.lines[lines[-1].seq][1]
        return [Problem(where, 0, None, "seal_missing",
                        f"the session has {len(lines)} lines and no seal")]  # fmt: skip
    found: list[Problem] = []
    every = seals[0].every
    run: list[Event] = []
    for ev in lines:
        if type(ev) is Sealed:
            found.extend(_overdue(hist, run, every, sealed=True))
            every, run = ev.every, []
        else:
            run.append(ev)
    found.extend(_overdue(hist, run, every, sealed=False))
    return found


def _batch_starts(run: list[Event]) -> list[int]:
    """The index in `run` where each batch starts (a line with `more` 0 closes one)."""
    starts = [0]
    for i, ev in enumerate(run[:-1]):
        if ev.more == 0:
            starts.append(i + 1)
    return starts


def _overdue(
    hist: SealHistory, run: Iterable[Event], every: int | None, *, sealed: bool
) -> list[Problem]:
    """A run of lines between seals is late when the lines before its last batch already
    reached `every` (the writer seals right after the batch that reaches it). One more
    batch is a warning: another process's append can come between a write and its seal."""
    run = list(run)
    if every is None or not run:
        return []
    starts = _batch_starts(run)
    if starts[-1] < every:
        return []
    severity: Severity = "warning" if len(starts) < 2 or starts[-2] < every else "error"
    first, last = run[0].seq, run[-1].seq
    after = "before the next seal" if sealed else "and no seal after them"
    why = " (one batch late: another writer's append may have come first)"
    return [Problem(hist.lines[last][1], 0, last, "seal_overdue",
                    f"{len(run)} lines (seq {first}..{last}) with no seal between them"
                    f" {after}; the policy seals every {every}"
                    f"{why if severity == 'warning' else ''}", severity)]  # fmt: skip

"""The exceptions eventstore raises. Every one is an `EventStoreError`."""

from __future__ import annotations

__all__ = [
    "ConcurrencyError",
    "CorruptLogError",
    "EventStoreError",
    "FeatureNotFoundError",
    "HistoryPrunedError",
    "HistoryUnavailableError",
    "IdempotencyConflictError",
    "InvalidArgumentError",
    "InvalidRecordError",
    "InvalidSessionIdError",
    "NestingTooDeepError",
    "SessionExistsError",
    "SnapshotVersionError",
    "StorageError",
    "StoreClosedError",
    "UnknownEngineError",
    "UnknownProjectionError",
    "UnknownSessionError",
    "UnsafePathError",
    "UnsupportedError",
]


class EventStoreError(Exception):
    """Base class of every error eventstore raises on purpose."""


class InvalidSessionIdError(EventStoreError, ValueError):
    """A session id that is empty, too long, or contains a NUL character."""


class InvalidRecordError(EventStoreError, TypeError):
    """A record or event of the wrong type or shape was given to a write."""


class NestingTooDeepError(InvalidRecordError):
    """A write whose log line would nest arrays and objects deeper than the limit
    (`eventstore.format.depth.MAX_DEPTH`): every reader could not read it back, so
    nothing is written."""


class FeatureNotFoundError(EventStoreError, KeyError):
    """`update_feature_pass` named a feature that is not in the feature list."""

    def __init__(self, session_id: str, feature_id: str) -> None:
        super().__init__(f"session {session_id!r} has no feature {feature_id!r}")
        self.session_id = session_id
        self.feature_id = feature_id

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class CorruptLogError(EventStoreError):
    """A log line that cannot be trusted, anywhere but a torn tail.

    Carries the file, the byte offset of the bad line and the sequence number
    it should have had (or had), so a person can find it with `tail -c +N`.
    """

    def __init__(self, path: object, offset: int, seq: int | None, reason: str) -> None:
        where = f"{path}: byte {offset}"
        if seq is not None:
            where += f" (seq {seq})"
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.offset = offset
        self.seq = seq
        self.reason = reason


class ConcurrencyError(EventStoreError):
    """An append's `expected_seq` did not match the session's last sequence (or its
    `expected_h` the last line's `h`, the sequence matching: another log)."""

    def __init__(
        self, session_id: str, expected: int, actual: int, other_line: bool = False
    ) -> None:
        found = f"{actual}, another line's" if other_line else f"{actual}"
        super().__init__(
            f"session {session_id!r}: expected last sequence {expected}, found {found}"
        )
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


class SnapshotVersionError(EventStoreError):
    """A snapshot holds a projection state of another version and no archive can rebuild it."""


class UnsafePathError(EventStoreError):
    """A path eventstore would use is a symlink or not the kind of file expected."""


class StorageError(EventStoreError, OSError):
    """The filesystem refused a read or a write (a full disk, an I/O error, a directory
    that cannot be read); nothing was acknowledged.

    `errno` is the operating system's error number. The log is left as it was, or with a
    torn tail that the next writer truncates.
    """

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(errno, message)

    def __str__(self) -> str:
        return str(self.strerror)


class UnknownSessionError(EventStoreError, LookupError):
    """An audit asked about a session that has no log (and no archive) in this store."""


class SessionExistsError(EventStoreError):
    """A session was to be created from nothing (a fork's destination) but already holds
    events; nothing was written."""


class HistoryUnavailableError(EventStoreError, LookupError):
    """The events asked for are not in any file: compacted without an archive, or beyond
    the session's last sequence number."""


class HistoryPrunedError(HistoryUnavailableError):
    """Events asked for were pruned from the archive (`prune_archive`, which records it
    by an `archive_pruned` event): `requested` is the first sequence number the request
    needs, `first_kept` the first one the session still holds (read from there).
    `asked` says what was asked for when it was more than events from `requested` on
    (e.g. "the state as of seq 20")."""

    def __init__(
        self, session_id: str, requested: int, first_kept: int, asked: str | None = None
    ) -> None:
        super().__init__(
            f"session {session_id!r}: {asked or f'seq {requested}'} was asked for, but"
            f" events 1..{first_kept - 1} were pruned from the archive (recorded by an"
            f" archive_pruned event); the first seq still kept is {first_kept}"
        )
        self.session_id = session_id
        self.requested = requested
        self.first_kept = first_kept
        self.asked = asked


class StoreClosedError(EventStoreError):
    """The store was used after `close()`."""


class UnknownEngineError(EventStoreError, ValueError):
    """A store URL whose scheme no storage engine serves (or whose engine cannot be
    imported, e.g. an optional extra that is not installed)."""


class UnsupportedError(EventStoreError, NotImplementedError):
    """The store's engine does not offer an optional operation (e.g. pruning history, a
    global feed); a NotImplementedError too, what 0.1.0 raised for the feed."""


class InvalidArgumentError(EventStoreError, ValueError, TypeError):
    """An argument eventstore cannot use (a durability it does not offer, a time that is
    not ISO 8601, a value of a type the parameter does not take); nothing was changed.
    A ValueError, and a TypeError too (what a wrong-typed argument raised in 0.1.0)."""


class UnknownProjectionError(EventStoreError, KeyError):
    """A projection name that is not registered with the store."""

    def __str__(self) -> str:  # a KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class IdempotencyConflictError(EventStoreError):
    """An idempotency key reused for a different request; nothing was written.

    The same request with the same key replays the first result. `key`, `session_id`
    and `first_seq`/`last_seq` (what the key was first given to) say where.
    """

    def __init__(self, session_id: str, key: str, first_seq: int, last_seq: int) -> None:
        span = f"seq {first_seq}" if first_seq == last_seq else f"seq {first_seq}..{last_seq}"
        super().__init__(
            f"session {session_id!r}: idempotency key {key!r} was used for a different"
            f" request ({span}); use a new key for a new request"
        )
        self.session_id = session_id
        self.key = key
        self.first_seq = first_seq
        self.last_seq = last_seq


class SigningKeyError(EventStoreError, ValueError):
    """A signing or public key eventstore cannot use for seals (a missing or unreadable
    key file, not an Ed25519 key, a public key where a private one must sign, a store
    asked to seal without a signing key), or the `crypto` extra missing. `key_id` names
    the key when it is known (never any key material); nothing was written."""

    def __init__(self, message: str, key_id: str | None = None) -> None:
        super().__init__(message)
        self.key_id = key_id


class SessionDeletedError(EventStoreError):
    """A write to a session that was deleted with a tombstone (`delete_session` without
    `purge`); nothing was written. `session_id`, `deleted_at` (aware datetime) and `by`
    say which and when; `SessionStore.restore(session_id)` frees the id again."""

    def __init__(self, session_id: str, deleted_at: object, by: str = "") -> None:
        when = deleted_at.isoformat() if hasattr(deleted_at, "isoformat") else str(deleted_at)
        who = f" by {by!r}" if by else ""
        super().__init__(
            f"session {session_id!r} was deleted at {when}{who}: nothing was written"
            " (restore it to use the id again)"
        )
        self.session_id = session_id
        self.deleted_at = deleted_at
        self.by = by


class KeyMissingError(EventStoreError, LookupError):
    """An encrypted session's data key cannot be had: the store holds no master key
    under `key_id` (the id of the master key that wrapped it), or no wrapped data key
    for the session. Nothing was written. `session_id` when known; no key material."""

    def __init__(self, key_id: str, session_id: str | None, reason: str) -> None:
        where = f"session {session_id!r}: " if session_id is not None else ""
        super().__init__(f"{where}key {key_id!r}: {reason}")
        self.key_id = key_id
        self.session_id = session_id


class KeyForgottenError(KeyMissingError):
    """The session's data key was destroyed (`SessionStore.forget_key`): nothing of the
    session can be read or written again; its log still verifies."""


class WrongKeyError(EventStoreError):
    """A master key given under `key_id` does not unwrap the data key it should (another
    key under the same id), or a sealed payload fails its authentication. Nothing was
    written. Names the key id, never the key."""

    def __init__(self, key_id: str, session_id: str | None, reason: str) -> None:
        where = f"session {session_id!r}: " if session_id is not None else ""
        super().__init__(f"{where}key {key_id!r}: {reason}")
        self.key_id = key_id
        self.session_id = session_id


class EncryptedSessionError(EventStoreError):
    """An operation that would write an encrypted session's state in the clear (a
    snapshot, a fork) is refused; nothing was written."""

"""The data keys of a store opened with a `KeyRing`: each session's, created on its first
encrypted append, found by the codec when it decrypts an encrypted line, rewrapped by `rekey`,
destroyed by `forget` (and by a delete: `shred_slot`, `free_slot`).

A slot goes one way: none -> a wrapped key (created, only where none is; rewrapped by
`rekey`) -> forgotten (the key destroyed, the time kept) -> none again (only a forgotten
slot is removed, compare and delete, and only once no log of the session is left: a
purge, a restore, or the first write to an id whose log is gone). So no slot a live
session's lines need is ever removed, and a log restored from a backup finds either the
forgotten record (KeyForgottenError) or a newer key that does not open its lines.

A session's data key lives in a key slot of the engine (`eventstore.engines.base.KeyEngine`,
named by `eventstore.format.crypt.key_id_of`), wrapped by the ring's master keys; the
unwrapped key is kept in this process's memory only, for as long as the store is open.
"""

from __future__ import annotations

import threading

from eventstore import entropy
from eventstore.engines.base import Engine, Head, KeyEngine
from eventstore.errors import (
    EventStoreError,
    KeyForgottenError,
    KeyMissingError,
    UnsupportedError,
)
from eventstore.format.crypt import (
    DataKey,
    KeyRing,
    KeySlot,
    decode_slot,
    encode_slot,
    key_id_of,
)

__all__ = ["CacheCipher", "SessionKeys", "free_slot", "has_slot", "key_engine", "shred_slot"]


def key_engine(engine: Engine) -> KeyEngine:
    """`engine` if it keeps key slots; UnsupportedError naming it otherwise."""
    if not isinstance(engine, KeyEngine):
        raise UnsupportedError(
            f"the engine of {engine.url!r} keeps no key slots: encryption needs one"
            " (file and memory stores keep them)"
        )
    return engine


def has_slot(engine: Engine, session_id: str) -> bool:
    """Whether `engine` keeps a key slot (live or forgotten) of the session."""
    return isinstance(engine, KeyEngine) and engine.load_key_slot(key_id_of(session_id)) is not None


def shred_slot(engine: Engine, session_id: str) -> str | None:
    """Destroy the session's data key in `engine` (no master key needed): its slot is
    replaced by one holding no wrap, only the time. Returns the data key id, None if the
    session has no slot (or `engine` keeps none). A forgotten slot is left as it is."""
    if not isinstance(engine, KeyEngine):
        return None
    dk = key_id_of(session_id)
    data = engine.load_key_slot(dk)
    if data is None:
        return None
    if decode_slot(data, dk).forgotten is None:
        engine.replace_key_slot(dk, encode_slot(KeySlot(dk, forgotten=entropy.now())))
    return dk


def free_slot(engine: Engine, session_id: str) -> bool:
    """Remove the session's key slot if it is forgotten (a live key is never removed:
    False), so that the id's next session gets a new key. Call only once its log is
    gone. True if a slot was removed."""
    if not isinstance(engine, KeyEngine):
        return False
    dk = key_id_of(session_id)
    data = engine.load_key_slot(dk)
    if data is None or decode_slot(data, dk).forgotten is None:
        return False
    return engine.remove_key_slot(dk, data)


class SessionKeys:
    """The data keys of one store's sessions (see the module docstring)."""

    def __init__(self, engine: Engine, ring: KeyRing) -> None:
        self.engine = key_engine(engine)
        self.ring = ring
        self._keys: dict[str, DataKey] = {}
        self._names: dict[str, str] = {}  # data key id -> session id, as far as seen
        self._guard = threading.Lock()

    def note(self, session_id: str) -> None:
        """Remember which session a data key id is (so errors name the session)."""
        self._names[key_id_of(session_id)] = session_id

    def _slot(self, dk: str) -> KeySlot | None:
        data = self.engine.load_key_slot(dk)
        return None if data is None else decode_slot(data, dk)

    def _unwrapped(self, slot: KeySlot) -> DataKey:
        sid = self._names.get(slot.dk)
        if slot.forgotten is not None:
            raise KeyForgottenError(
                slot.dk,
                sid,
                f"the session's data key was destroyed (forget_key at"
                f" {slot.forgotten.isoformat()}): nothing of it can be read or written",
            )
        key = self.ring.unwrap(slot, sid)
        if key is None:
            kids = ", ".join(repr(w.kid) for w in slot.wraps)
            raise KeyMissingError(
                slot.wraps[0].kid if slot.wraps else slot.dk,
                sid,
                f"data key {slot.dk!r} is wrapped by master key(s) {kids}; the store's"
                f" key ring holds {self.ring.key_ids!r}",
            )
        data_key = DataKey(slot.dk, key)
        with self._guard:
            return self._keys.setdefault(slot.dk, data_key)

    def opener(self, dk: str) -> DataKey:
        """The data key of id `dk`, to open an encrypted line (the codec's `opener`)."""
        found = self._keys.get(dk)
        if found is not None:
            return found
        slot = self._slot(dk)
        if slot is None:
            raise KeyMissingError(dk, self._names.get(dk), "no key slot holds this data key")
        return self._unwrapped(slot)

    def for_writing(self, session_id: str, first: bool = False) -> DataKey:
        """The session's data key, created (and its slot kept, durably) if it has none.
        `first`: the write starts the session (no log is stored): the slot is read
        again, not the key kept in memory (another process may have purged or restored
        the id meanwhile, destroying that key), and a forgotten slot left by a purge or
        restore is removed so the new session gets a new key."""
        dk = key_id_of(session_id)
        found = None if first else self._keys.get(dk)
        if found is not None:
            return found
        self._names[dk] = session_id
        if first:
            self.drop(session_id)
            free_slot(self.engine, session_id)
        slot = self._slot(dk)
        if slot is None:
            key = DataKey.new_key()
            slot = KeySlot(dk, [self.ring.wrap(key)])
            if self.engine.create_key_slot(dk, encode_slot(slot)):
                with self._guard:
                    return self._keys.setdefault(dk, DataKey(dk, key))
            slot = self._slot(dk)  # another writer created it first: use theirs
            if slot is None:  # pragma: no cover - a slot is never removed
                raise KeyMissingError(dk, session_id, "its key slot vanished")
        return self._unwrapped(slot)

    def forget(self, session_id: str) -> str | None:
        """Destroy the session's data key: its slot is replaced by one holding no wrap
        (and the time), and this store's copy in memory is dropped. Returns the data key
        id, None if the session never had one."""
        self._names[key_id_of(session_id)] = session_id
        dk = shred_slot(self.engine, session_id)
        self.drop(session_id)
        return dk

    def drop(self, session_id: str) -> None:
        """Drop this store's copy in memory of the session's data key (its slot is read
        again when next needed)."""
        with self._guard:
            self._keys.pop(key_id_of(session_id), None)

    def if_any(self, session_id: str) -> DataKey | None:
        """The session's data key if it has one this store can unwrap, else None (no
        error: for what is only worth doing with one, a fold cache)."""
        dk = key_id_of(session_id)
        found = self._keys.get(dk)
        if found is not None:
            return found
        try:
            slot = self._slot(dk)
            return None if slot is None else self._unwrapped(slot)
        except EventStoreError:
            return None

    def is_forgotten(self, session_id: str) -> bool:
        """Whether the session's data key was destroyed."""
        slot = self._slot(key_id_of(session_id))
        return slot is not None and slot.forgotten is not None


class CacheCipher:
    """Encrypts the fold caches of a store with keys (`eventstore.core.fold_cache`): a cache
    of a session with a data key is kept encrypted with it, as one blob bound to the
    projection's name and the head it was folded to; a session without one (a plain
    session) gets none. A cache that does not open is not used (the log is the truth)."""

    def __init__(self, keys: SessionKeys) -> None:
        self.keys = keys

    @staticmethod
    def _bound(name: str, head: Head) -> bytes:
        return f"|cache|{name}|{head.seq}|{head.h}|{head.link}".encode()

    def encrypt(
        self, session_id: str, name: str, head: Head, pieces: list[bytes]
    ) -> list[bytes] | None:
        """`pieces` encrypted as one, or None: keep no cache."""
        key = self.keys.if_any(session_id)
        if key is None:
            return None
        return [key.encrypt_bytes(b"".join(pieces), self._bound(name, head))]

    def decrypt(self, session_id: str, name: str, head: Head, data: bytes) -> bytes | None:
        """The cache's bytes, or None: do not use it."""
        key = self.keys.if_any(session_id)
        return None if key is None else key.decrypt(data, self._bound(name, head))


def rekey(engine: Engine, old: KeyRing, new: KeyRing) -> tuple[int, int]:
    """Rewrap every data key `old` unwraps with `new`'s current master key, dropping the
    old wraps (the logs are not touched). Returns (rewrapped, left: slots `old` holds no
    key of, or forgotten). WrongKeyError if a key of `old` does not unwrap its slot."""
    keeper = key_engine(engine)
    done = left = 0
    for dk in keeper.list_key_slots():
        if _rewrap(keeper, dk, old, new):
            done += 1
        else:
            left += 1
    return done, left


def _rewrap(keeper: KeyEngine, dk: str, old: KeyRing, new: KeyRing) -> bool:
    """Rewrap slot `dk` if `old` unwraps it; False if it is gone, forgotten or not
    `old`'s. Replaced only if it still holds what was read (compare and replace): a
    forget landing between the read and the write must win, or the key is back."""
    while True:
        data = keeper.load_key_slot(dk)
        slot = None if data is None else decode_slot(data, dk)
        key = None if slot is None or slot.forgotten is not None else old.unwrap(slot, None)
        if data is None or key is None:
            return False
        if keeper.replace_key_slot(dk, encode_slot(KeySlot(dk, [new.wrap(key)])), data):
            return True

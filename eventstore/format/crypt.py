"""Encryption at rest of a log line's payload: master keys, data keys, encrypted lines.

Every primitive is the `cryptography` package's (the `crypto` extra): AES-256-GCM encrypts
a payload, AES key wrap (RFC 3394) wraps a data key with a master key. Nothing here is
cipher code of its own.

- A `KeyRing` holds master keys by key id: the current one wraps new data keys, every
  one unwraps. Its repr names key ids, never keys.
- A `DataKey` is one session's key (random, 256 bits) with its id, `key_id_of(session)`.
- An encrypted line keeps the envelope a reader needs to order and check it (`type`, `seq`,
  `ts`, `more`, `key`, `v`) in the clear and carries the payload as one field, last
  before `h`: ``"_enc":"<data key id>.<base64 of nonce + ciphertext + tag>"``. The hash
  chain (`eventstore.format.chain`) is computed over that encrypted line, so the chain is
  checked without any key. The authenticated data is the data key id and the clear
  envelope's bytes: a payload moved to another line does not open. `_enc` cannot be a
  field of an `Event` (msgspec fields never start with `_`), so a plain line never
  looks encrypted.
- A snapshot keeps its shape; each state entry is encrypted as one JSON string
  (`encrypt_states`, `decrypt_states`), bound to the snapshot's seq, `base_h` and the name.
- A `KeySlot` is what a store keeps per session (`eventstore.engines.base.KeyEngine`):
  the data key wrapped under one or more master keys, or the record that it was
  forgotten. It holds no key in the clear.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path

import msgspec

from eventstore import entropy
from eventstore.errors import (
    CorruptLogError,
    InvalidArgumentError,
    KeyMissingError,
    StorageError,
    UnsupportedError,
    WrongKeyError,
)
from eventstore.format.chain import HASH_SUFFIX_LEN
from eventstore.regular import KEY_FILE_MAX, read_regular

__all__ = [
    "ENC_MARK",
    "DataKey",
    "KeyRing",
    "KeySlot",
    "WrappedKey",
    "decode_slot",
    "encode_slot",
    "key_id_of",
    "line_tag",
    "decrypt_line",
    "decrypt_lines",
    "decrypt_states",
    "encrypt_body",
    "encrypt_states",
    "encrypted_key_id",
    "states_encrypted",
    "tags_in",
]

ENC_MARK = b',"_enc":"'
"""What opens an encrypted payload field (a quick test over many lines: `ENC_MARK in data`)."""

_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NONCE_LEN = 12
_KEY_LEN = 32
_KEY_FILE_TAG = "eventstore-master-key"


def _aead() -> type:
    """AESGCM, or UnsupportedError naming the extra to install."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:  # pragma: no cover - the crypto extra is in the test extra
        raise UnsupportedError(
            "encryption needs the cryptography package: pip install -e '.[crypto]'"
        ) from None
    return AESGCM


class _Envelope(msgspec.Struct, omit_defaults=True):
    """The clear envelope of a line, encoded as the codec encodes an event's first fields
    (the tag, then `seq`, `ts`, `more`, `key`, `v`; `h` is appended after)."""

    type: str
    seq: int
    ts: datetime
    more: int = 0
    key: str | None = None
    v: int = 1


_envelope_encoder = msgspec.json.Encoder()
_envelope_decoder = msgspec.json.Decoder(_Envelope)


def key_id_of(session_id: str) -> str:
    """The id of a session's data key (and of its key slot): 20 hex digits of BLAKE2b
    over the session id. It names the slot without the session id and is the same on
    every engine, so a migrated store finds its keys."""
    return hashlib.blake2b(session_id.encode(), digest_size=10, person=b"es-datakey").hexdigest()


class KeyRing:
    """Master keys by key id (each 32 bytes, for AES-256 key wrap). `current` (the only
    key's id when there is one) wraps new data keys; every key unwraps.

    `KeyRing.load(path, ...)` reads key files written by `KeyRing.write_new(path, key_id)`
    (one line: a tag, the key id and 64 hex digits; mode 0600). The repr and every error
    name key ids only.
    """

    def __init__(self, keys: Mapping[str, bytes], current: str | None = None) -> None:
        if not isinstance(keys, Mapping):
            raise InvalidArgumentError(
                f"a KeyRing takes a mapping of key ids to keys, not {type(keys).__name__}"
            )
        if not keys:
            raise InvalidArgumentError("a KeyRing needs at least one master key")
        # an entry is named by its place, never by its id: in a mapping given the wrong
        # way round ({key: id}, {key.hex(): id}) the "id" is the key itself
        for n, (kid, key) in enumerate(keys.items(), 1):
            if not isinstance(kid, str) or not _KEY_ID.fullmatch(kid):
                raise InvalidArgumentError(
                    f"master key #{n}: its id must be a str matching {_KEY_ID.pattern},"
                    f" not this {type(kid).__name__}"
                )
            if not isinstance(key, bytes) or len(key) != _KEY_LEN:
                raise InvalidArgumentError(
                    f"master key #{n}: the key must be 32 bytes, not {type(key).__name__}"
                    f" of length {len(key) if isinstance(key, (bytes, str)) else '?'}"
                )
        if current is None:
            if len(keys) != 1:
                raise InvalidArgumentError("a KeyRing of several keys needs current=KEY_ID")
            current = next(iter(keys))
        if current not in keys:
            raise InvalidArgumentError(f"current key {current!r} is not in the ring")
        self._keys = dict(keys)
        self.current = current

    @property
    def key_ids(self) -> list[str]:
        """The ids of the ring's keys (the current one first)."""
        return [self.current, *(k for k in self._keys if k != self.current)]

    def __repr__(self) -> str:
        return f"KeyRing(key_ids={self.key_ids!r}, current={self.current!r})"

    @classmethod
    def load(cls, *paths: str | os.PathLike[str], current: str | None = None) -> KeyRing:
        """A ring of the keys in the key files `paths` (the first file's key is current
        unless `current` names another)."""
        keys: dict[str, bytes] = {}
        first = None
        for path in paths:
            if not isinstance(path, (str, os.PathLike)):
                raise InvalidArgumentError(f"a key file is a path, not {type(path).__name__}")
            kid, key = _read_key_file(Path(path))
            if keys.get(kid, key) != key:  # (one would silently stand in for the other)
                raise InvalidArgumentError(
                    f"two key files hold different master keys under one id {kid!r}"
                    f" (the second: {os.fspath(path)!r})"
                )
            keys[kid] = key
            first = kid if first is None else first
        return cls(keys, current if current is not None else first)

    @staticmethod
    def write_new(path: str | os.PathLike[str], key_id: str) -> None:
        """Write a new random master key under `key_id` to `path` (created, mode 0600;
        an existing file is never overwritten)."""
        if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
            raise InvalidArgumentError(f"a master key id must match {_KEY_ID.pattern}")
        line = f"{_KEY_FILE_TAG} {key_id} {entropy.random_bytes(_KEY_LEN).hex()}\n"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            why = (
                "it exists (a key file is never overwritten)"
                if exc.errno == errno.EEXIST
                else exc.strerror
            )
            raise StorageError(
                f"cannot create key file {os.fspath(path)!r}: {why}", exc.errno
            ) from None
        with os.fdopen(fd, "w") as f:
            f.write(line)

    def wrap(self, key: bytes) -> WrappedKey:
        """`key` wrapped by the current master key."""
        from cryptography.hazmat.primitives.keywrap import aes_key_wrap

        wrapped = aes_key_wrap(self._keys[self.current], key)
        return WrappedKey(kid=self.current, key=base64.b64encode(wrapped).decode())

    def unwrap(self, slot: KeySlot, session_id: str | None) -> bytes | None:
        """The data key of `slot`, unwrapped by the first of its wraps that a master key
        of the ring opens (every wrap whose id the ring holds is tried: one slot may
        hold two wraps under one id, one of them damaged or by another key); None if
        the ring holds none of their ids. WrongKeyError, naming the first such id, if
        no key of a matching id unwraps it."""
        from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap

        refused = None
        for w in slot.wraps:
            master = self._keys.get(w.kid)
            if master is None:
                continue
            try:
                return aes_key_unwrap(master, base64.b64decode(w.key, validate=True))
            except (InvalidUnwrap, binascii.Error, ValueError):
                refused = w.kid if refused is None else refused
        if refused is not None:
            raise WrongKeyError(refused, session_id, f"does not unwrap the data key {slot.dk!r}")
        return None


def _read_key_file(path: Path) -> tuple[str, bytes]:
    try:
        text = read_regular(path, KEY_FILE_MAX).decode("utf-8")
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read key file {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"{str(path)!r} is not an eventstore master key file") from None
    parts = text.split()
    if len(parts) != 3 or parts[0] != _KEY_FILE_TAG or not _KEY_ID.fullmatch(parts[1]):
        raise InvalidArgumentError(f"{str(path)!r} is not an eventstore master key file")
    try:
        key = bytes.fromhex(parts[2])
    except ValueError:
        key = b""
    if len(key) != _KEY_LEN:
        # (the id is not named: in a file with its fields swapped it is the key)
        raise InvalidArgumentError(f"{str(path)!r}: its key is not 64 hex digits")
    return parts[1], key


class WrappedKey(msgspec.Struct, frozen=True):
    """A data key wrapped by master key `kid` (base64)."""

    kid: str
    key: str


class KeySlot(msgspec.Struct, frozen=True, omit_defaults=True):
    """A session's key slot: the data key `dk` wrapped under one or more master keys, or,
    once forgotten, no wrap and the time it was forgotten."""

    dk: str
    wraps: list[WrappedKey] = msgspec.field(default_factory=list)
    forgotten: datetime | None = None


_slot_decoder = msgspec.json.Decoder(KeySlot)


def encode_slot(slot: KeySlot) -> bytes:
    """The bytes an engine keeps for a key slot."""
    return msgspec.json.encode(slot)


def decode_slot(data: bytes, dk: str) -> KeySlot:
    """A key slot from its bytes; KeyMissingError (naming the data key id) if unreadable."""
    try:
        slot = _slot_decoder.decode(data)
    except msgspec.MsgspecError:
        raise KeyMissingError(dk, None, "its key slot is unreadable") from None
    if slot.dk != dk:
        raise KeyMissingError(dk, None, f"its key slot names another data key {slot.dk!r}")
    return slot


class DataKey:
    """One session's data key, unwrapped (kept in memory only): encrypts and opens payloads."""

    __slots__ = ("_aead", "dk")

    def __init__(self, dk: str, key: bytes) -> None:
        self.dk = dk
        self._aead = _aead()(key)

    def __repr__(self) -> str:
        return f"DataKey({self.dk!r})"

    @staticmethod
    def new_key() -> bytes:
        """A fresh random 256-bit data key."""
        return entropy.random_bytes(_KEY_LEN)

    def encrypt(self, payload: bytes, envelope: bytes) -> bytes:
        """The encrypted token of `payload` for the line whose clear part is `envelope`."""
        nonce = entropy.random_bytes(_NONCE_LEN)
        ct = self._aead.encrypt(nonce, payload, self.dk.encode() + envelope)
        return self.dk.encode() + b"." + base64.b64encode(nonce + ct)

    def encrypt_bytes(self, data: bytes, bound: bytes) -> bytes:
        """`data` encrypted as binary (nonce, ciphertext, tag), bound to `bound`: for what
        is not a log line (a fold cache)."""
        nonce = entropy.random_bytes(_NONCE_LEN)
        out: bytes = nonce + self._aead.encrypt(nonce, data, self.dk.encode() + bound)
        return out

    def decrypt(self, blob: bytes, envelope: bytes) -> bytes | None:
        """The payload of an encrypted token's blob; None if it does not authenticate."""
        from cryptography.exceptions import InvalidTag

        if len(blob) < _NONCE_LEN + 16:
            return None
        view = memoryview(blob)
        try:
            out: bytes = self._aead.decrypt(
                view[:_NONCE_LEN], view[_NONCE_LEN:], self.dk.encode() + envelope
            )
        except InvalidTag:
            return None
        return out


def encrypt_body(body: bytes, ev_type: str, seq: int, ts: datetime, more: int, key: str | None,
              v: int, data_key: DataKey) -> bytes:  # fmt: skip
    """The encrypted form of an event's encoded `body` (no `h` yet): its envelope in the
    clear, its payload fields as one encrypted field."""
    env = _envelope_encoder.encode(_Envelope(ev_type, seq, ts, more, key, v))
    prefix = env[:-1]
    if not body.startswith(prefix):  # (the codec's field order; checked, never assumed)
        raise AssertionError("an event's encoding does not open with its envelope")
    # the payload encrypted is the fields after the envelope as they stand (`,"f":...`,
    # or nothing), and the authenticated data is the clear envelope itself: a payload
    # opens only under its own data key, type, seq, time, batch marker and key
    payload = body[len(prefix) : -1]
    return prefix + ENC_MARK + data_key.encrypt(payload, prefix) + b'"}'


def _encrypted_field(line: bytes) -> tuple[int, int] | None:
    """(where `ENC_MARK` starts, where the token ends) in a whole line (no newline, `h`
    last) whose last payload field is an encrypted one; None for a plain line."""
    end = len(line) - HASH_SUFFIX_LEN - 1
    if end < 0 or line[end : end + 1] != b'"':
        return None
    at = line.rfind(ENC_MARK, 0, end)
    if at < 0:
        return None
    token = line[at + len(ENC_MARK) : end]
    if b'"' in token or b"\\" in token:
        return None
    return at, end


def encrypted_key_id(line: bytes) -> str | None:
    """The data key id an encrypted line was encrypted with; None for a plain line."""
    found = _encrypted_field(line)
    if found is None:
        return None
    token = line[found[0] + len(ENC_MARK) : found[1]]
    return token.split(b".", 1)[0].decode("ascii", "replace")


def decrypt_line(
    line: bytes, opener: Callable[[str], DataKey], where: object = "?", offset: int = 0
) -> bytes:
    """The plain form of an encrypted line (a plain line as it is): its payload fields in
    place of the encrypted one, its `h` kept (the hash of the encrypted line, as read).
    `opener` gives the data key of an id (KeyMissingError, KeyForgottenError). A payload
    that does not authenticate is a CorruptLogError naming the line."""
    found = _encrypted_field(line)
    if found is None:
        return line
    at, end = found
    start = at + len(ENC_MARK)
    dot = line.find(b".", start, end)
    envelope = line[:at]
    if dot < 0:
        raise CorruptLogError(
            where, offset, _seq_of(envelope), "an encrypted payload names no data key"
        )
    try:
        # (not strict: a changed character fails the authentication below)
        blob = binascii.a2b_base64(memoryview(line)[dot + 1 : end])
    except (binascii.Error, ValueError):
        blob = b""
    data_key = opener(line[start:dot].decode("ascii", "replace"))
    payload = data_key.decrypt(blob, envelope)
    if payload is None:
        raise CorruptLogError(
            where,
            offset,
            _seq_of(envelope),
            f"its encrypted payload does not authenticate under data key {data_key.dk!r}",
        )
    return envelope + payload + line[end + 1 :]


def _seq_of(envelope: bytes) -> int | None:
    try:
        return _envelope_decoder.decode(envelope + b"}").seq
    except msgspec.MsgspecError:
        return None


def _state_aad(seq: int, base_h: str, name: str) -> bytes:
    """What a snapshot's encrypted state is bound to: its snapshot's seq and base, its name."""
    return f"|snapshot|{seq}|{base_h}|".encode() + name.encode()


# the lifecycle state (a tombstone: no user content) stays plain in a snapshot, and a decode
# of nothing but tombstones opens no state: a write must learn that a session is deleted
# without its data key, which `forget_key` may have destroyed
PLAIN_STATES = frozenset({"lifecycle"})
KEYLESS_TYPES = frozenset({"session_deleted"})


def encrypt_states(
    states: dict[str, msgspec.Raw], seq: int, base_h: str, data_key: DataKey
) -> dict[str, msgspec.Raw]:
    """A snapshot's states, each entry encrypted as one JSON string (`"<data key id>.<base64>"`):
    the snapshot line keeps its shape (`layout`, `length`), only the entries are opaque
    (those of `PLAIN_STATES` excepted)."""
    return {
        name: raw
        if name in PLAIN_STATES
        else msgspec.Raw(b'"' + data_key.encrypt(bytes(raw), _state_aad(seq, base_h, name)) + b'"')
        for name, raw in states.items()
    }


def states_encrypted(states: dict[str, msgspec.Raw]) -> bool:
    """Whether a snapshot's states are encrypted (an entry is a JSON string, never an object)."""
    return any(bytes(memoryview(raw)[:1]) == b'"' for raw in states.values())


def decrypt_states(
    states: dict[str, msgspec.Raw], seq: int, base_h: str, opener: Callable[[str], DataKey]
) -> dict[str, msgspec.Raw]:
    """A snapshot's encrypted states opened (a plain entry as it is). A state that does not
    authenticate is a CorruptLogError naming the snapshot's seq and the state."""
    out: dict[str, msgspec.Raw] = {}
    for name, raw in states.items():
        data = bytes(raw)
        if data[:1] != b'"':
            out[name] = raw
            continue
        token = data[1:-1]
        dk, dot, b64 = token.partition(b".")
        try:
            blob = binascii.a2b_base64(b64) if dot else b""
        except (binascii.Error, ValueError):
            blob = b""
        data_key = opener(dk.decode("ascii", "replace"))
        plain = data_key.decrypt(blob, _state_aad(seq, base_h, name))
        if plain is None:
            raise CorruptLogError(
                "snapshot", 0, seq, f"its encrypted state {name!r} does not authenticate"
                f" under data key {data_key.dk!r}",
            )  # fmt: skip
        out[name] = msgspec.Raw(plain)
    return out


def decrypt_lines(
    data: bytes, opener: Callable[[str], DataKey], wanted: Callable[[bytes], bool]
) -> bytes:
    """`data` (lines) with every encrypted line `wanted(line)` picks opened."""
    out: list[bytes] = []
    for line in data.split(b"\n"):
        if ENC_MARK in line and wanted(line):
            line = decrypt_line(line, opener)
        out.append(line)
    return b"\n".join(out)


def line_tag(line: bytes) -> bytes:
    """The `type` of a line as the codec writes it (`{"type":"TAG",...`), b"" if not so."""
    if not line.startswith(b'{"type":"'):
        return b""
    end = line.find(b'"', 9)
    return line[9:end] if end > 0 else b""


def tags_in(tags: Iterable[str]) -> frozenset[bytes]:
    """`tags` as the bytes `line_tag` gives."""
    return frozenset(t.encode() for t in tags)

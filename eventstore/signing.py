"""Keys for sealed stores: loading Ed25519 signing and public keys, their key ids, signing
and checking a message, and the keyed MAC of the caches; the one module that touches
`cryptography` (the `crypto` extra) for seals.

Every primitive is `cryptography`'s: Ed25519 signatures, HMAC-SHA256, HKDF-SHA256.
Nothing here knows what a seal says (`eventstore.ops.seal` does); this module only turns
keys given as objects or PEM files into keys, names them, and signs and MACs bytes.

A key id is `ed25519:` and the first 16 hex digits of the SHA-256 of the raw 32-byte
public key: it names a key in seals and errors without revealing anything of it. No
message raised here holds key material, only key ids and file paths.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, cast

from eventstore.errors import SigningKeyError
from eventstore.regular import KEY_FILE_MAX, read_regular

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "CacheMac",
    "cache_mac",
    "key_id",
    "load_public_key",
    "load_signing_key",
    "sign",
    "signature_checks",
]

_CACHE_MAC_INFO = b"eventstore cache mac v1"


def _crypto() -> ModuleType:
    """The `cryptography` module of Ed25519 keys; SigningKeyError when the extra is missing."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SigningKeyError(
            "sealing needs the cryptography library: pip install -e '.[crypto]'"
        ) from None
    return ed25519


def key_id(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The id naming `key` (a private key is named by its public key)."""
    from cryptography.hazmat.primitives import serialization

    ed = _crypto()
    public = cast(
        "Ed25519PublicKey", key.public_key() if isinstance(key, ed.Ed25519PrivateKey) else key
    )
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def _read_pem(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        return read_regular(path, KEY_FILE_MAX)
    except OSError as exc:
        raise SigningKeyError(
            f"cannot read the {what} file {os.fspath(path)!r}: {exc.strerror}"
        ) from None


def load_signing_key(key: object) -> Ed25519PrivateKey:
    """An Ed25519 private key from `key`: the key object itself, or the path of an
    unencrypted PEM (PKCS#8) file holding one. SigningKeyError for anything else (a public
    key cannot sign: its key id is named)."""
    ed = _crypto()
    if isinstance(key, ed.Ed25519PrivateKey):
        return cast("Ed25519PrivateKey", key)
    if isinstance(key, ed.Ed25519PublicKey):
        raise SigningKeyError(
            f"key {key_id(key)} is a public key: sealing needs its private key", key_id(key)
        )
    if not isinstance(key, (str, os.PathLike)):
        raise SigningKeyError(
            f"a signing key must be an Ed25519PrivateKey or a PEM file path, not"
            f" {type(key).__name__}"
        )
    from cryptography.hazmat.primitives import serialization

    data = _read_pem(key, "signing key")
    try:
        loaded = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        # (a public key file, an encrypted one, or not PEM: say which when we can)
        try:
            public = serialization.load_pem_public_key(data)
        except (ValueError, TypeError):
            raise SigningKeyError(
                f"{os.fspath(key)!r} is not an unencrypted PEM Ed25519 private key"
            ) from None
        if isinstance(public, ed.Ed25519PublicKey):
            kid = key_id(public)
            raise SigningKeyError(
                f"{os.fspath(key)!r} holds public key {kid}: sealing needs its private key", kid
            ) from None
        raise SigningKeyError(f"{os.fspath(key)!r} is not an Ed25519 key") from None
    if not isinstance(loaded, ed.Ed25519PrivateKey):
        raise SigningKeyError(f"{os.fspath(key)!r} is not an Ed25519 key")
    return cast("Ed25519PrivateKey", loaded)


def load_public_key(key: object) -> Ed25519PublicKey:
    """An Ed25519 public key from `key`: a public or private key object, or the path of a
    PEM file holding either (a private key's public half is taken). SigningKeyError for
    anything else."""
    ed = _crypto()
    if isinstance(key, ed.Ed25519PublicKey):
        return cast("Ed25519PublicKey", key)
    if isinstance(key, ed.Ed25519PrivateKey):
        return cast("Ed25519PublicKey", key.public_key())
    if not isinstance(key, (str, os.PathLike)):
        raise SigningKeyError(
            f"a public key must be an Ed25519PublicKey or a PEM file path, not {type(key).__name__}"
        )
    from cryptography.hazmat.primitives import serialization

    data = _read_pem(key, "public key")
    try:
        loaded: object = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        try:
            loaded = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError):
            raise SigningKeyError(f"{os.fspath(key)!r} is not a PEM Ed25519 key") from None
    if not isinstance(loaded, ed.Ed25519PublicKey):
        raise SigningKeyError(f"{os.fspath(key)!r} is not an Ed25519 key")
    return cast("Ed25519PublicKey", loaded)


def sign(key: Ed25519PrivateKey, message: bytes) -> str:
    """The Ed25519 signature of `message`, as hex."""
    return str(key.sign(message).hex())


def signature_checks(key: Ed25519PublicKey, message: bytes, signature: str) -> bool:
    """Whether `signature` (hex) is `key`'s signature of `message`."""
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(bytes.fromhex(signature), message)
    except (InvalidSignature, ValueError):
        return False
    return True


class CacheMac:
    """The keyed MAC of a store's caches: HMAC-SHA256 with a key of its own."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        self._key = key

    def start(self) -> RunningMac:
        """A MAC to feed bytes to, in order (`update`), then read (`hexdigest`)."""
        return RunningMac(self._key)

    def digest(self, pieces: Iterable[bytes]) -> bytes:
        """The HMAC-SHA256 of `pieces` (in order), as 64 hex digits (ASCII bytes)."""
        mac = self.start()
        for piece in pieces:
            mac.update(piece)
        return mac.hexdigest()


class RunningMac:
    """An HMAC-SHA256 being computed (`CacheMac.start`)."""

    __slots__ = ("_mac",)

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives import hashes, hmac

        self._mac = hmac.HMAC(key, hashes.SHA256())

    def update(self, data: bytes) -> None:
        """Feed `data`."""
        self._mac.update(data)

    def hexdigest(self) -> bytes:
        """The MAC of everything fed, as 64 hex digits (ASCII bytes); once only."""
        return bytes(self._mac.finalize().hex(), "ascii")


def cache_mac(key: object) -> CacheMac:
    """The cache MAC of a store opened with `key`: an Ed25519 private key (the MAC key is
    derived from it by HKDF-SHA256, so it is another key than the one that signs), or
    `bytes` of at least 32 (a separate `cache_key`, derived the same way)."""
    _crypto()
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    if isinstance(key, bytes):
        if len(key) < 32:
            raise SigningKeyError(f"a cache key must have at least 32 bytes, not {len(key)}")
        secret = key
    else:
        secret = load_signing_key(key).private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
    derived = HKDF(hashes.SHA256(), 32, salt=None, info=_CACHE_MAC_INFO).derive(secret)
    return CacheMac(derived)

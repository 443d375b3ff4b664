"""Validated copies of the records a caller hands the store: what every write path (the
session API, the legacy import) checks before anything is encoded; and the checks of the
plain arguments of the API and the operations (a sequence number, a flag, an
idempotency key), each an InvalidArgumentError or InvalidRecordError naming the
parameter, raised before anything is read or written."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from eventstore.errors import InvalidArgumentError, InvalidRecordError
from eventstore.format.codec import validated_copy
from eventstore.records import FeatureRecord, SessionManifest
from eventstore.session_ids import validate_session_id

__all__ = [
    "check_key",
    "described",
    "listed",
    "projections_of",
    "upcasters_of",
    "exactly",
    "feature_list",
    "flag",
    "manifest_of",
    "optional_age",
    "optional_whole",
    "records",
    "whole",
]

T = TypeVar("T")


def manifest_of(session_id: str, manifest: object) -> SessionManifest:
    """A validated copy of a manifest that names this session."""
    validate_session_id(session_id)  # a bad id is reported as such, before the manifest
    m = validated_copy(manifest, SessionManifest, "manifest")
    if m.session_id != session_id:
        raise InvalidRecordError(f"the manifest names session {m.session_id!r}, not {session_id!r}")
    return m


def feature_list(values: object, what: str) -> list[FeatureRecord]:
    """A validated copy of a feature list whose ids are unique."""
    features = records(values, FeatureRecord, what)
    seen: set[str] = set()
    for i, f in enumerate(features):
        if f.id in seen:
            raise InvalidRecordError(f"{what}[{i}]: feature id {f.id!r} appears twice")
        seen.add(f.id)
    return features


def exactly(values: object, cls: type[T]) -> list[T] | None:
    """`values` as a new list when it is a list or tuple of exactly `cls` instances (no
    subclass), else None: the records the hot path validates as it encodes them."""
    if type(values) is not list and type(values) is not tuple:
        return None
    for v in values:
        if type(v) is not cls:
            return None
    return list(values)


def records(values: object, cls: type[T], what: str) -> list[T]:
    """Validated copies of a list of `cls` records (`what` names it in errors)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidRecordError(f"{what} must be a list of {cls.__name__}")
    return [validated_copy(v, cls, f"{what}[{i}]") for i, v in enumerate(values)]


def described(value: object) -> str:
    """A wrong argument for a message: its type and (the start of) its repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:39] + '…'}"


def whole(value: object, what: str) -> int:
    """`value` if it is an int (not a bool), else InvalidArgumentError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{what} must be an int, not {described(value)}")
    return value


def optional_whole(value: object, what: str) -> int | None:
    """`whole`, or None."""
    return None if value is None else whole(value, what)


def optional_age(value: object, what: str) -> timedelta | None:
    """None, or `value` if it is a timedelta >= 0, else InvalidArgumentError naming
    `what` (an age a policy measures back from now)."""
    if value is None:
        return None
    if not isinstance(value, timedelta) or value < timedelta(0):
        raise InvalidArgumentError(f"{what} must be a timedelta >= 0, not {described(value)}")
    return value


def flag(value: object, what: str) -> bool:
    """`value` if it is a bool, else InvalidArgumentError (None or 0 is no False: a
    caller passing one meant something the store cannot tell)."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{what} must be True or False, not {described(value)}")
    return value


def listed(values: object, what: str) -> list[Any]:
    """`values` as a new list: any iterable but a str, bytes or mapping (whose items
    would be characters, ints or keys), else InvalidArgumentError naming `what`."""
    if type(values) is list or type(values) is tuple:
        # the usual case, told apart without the ABC checks below: a process's first
        # `isinstance(_, Mapping)` walks the ABC's registry, ~0.2 ms of a cold call
        return list(values)
    if isinstance(values, (str, bytes, bytearray, Mapping)) or not isinstance(values, Iterable):
        raise InvalidArgumentError(f"{what} must be a list, not {described(values)}")
    return list(values)


_PROJECTION_METHODS = ("initial", "apply", "encode_state", "decode_state", "copy")


def _check_projection(p: object) -> None:
    """InvalidArgumentError unless `p` has what eventstore needs of a projection
    (`projections.Projection`: a str `name`, an int `version`, `event_types` and the
    methods): one without them failed later, at a fold or a compaction, with Python's
    own AttributeError."""
    name = getattr(p, "name", None)
    version = getattr(p, "version", None)
    lacking = [m for m in _PROJECTION_METHODS if not callable(getattr(p, m, None))]
    if not isinstance(name, str) or isinstance(version, bool) or not isinstance(version, int):
        lacking.insert(0, "a str name and an int version")
    elif not hasattr(p, "event_types"):
        lacking.insert(0, "event_types")
    if lacking:
        raise InvalidArgumentError(f"{described(p)} is not a projection: no {', '.join(lacking)}")


def projections_of(values: object) -> list[Any]:
    """`values` (a store's `projections`) as a list, each one checked to be a projection."""
    found = listed(values, "projections")
    for p in found:
        _check_projection(p)
    return found


def upcasters_of(values: object) -> list[tuple[Any, Any, Any]]:
    """`values` (a store's `upcasters`) as a list of (event type, from version, function)
    triples, else InvalidArgumentError (each part is checked as it is registered:
    `EventCodec.register_upcaster`)."""
    found = listed(values, "upcasters")
    for entry in found:
        if not isinstance(entry, (tuple, list)) or len(entry) != 3:
            raise InvalidArgumentError(
                "upcasters must hold (event type, from version, function) triples, not"
                f" {described(entry)}"
            )
    return [tuple(entry) for entry in found]


def check_key(key: object) -> None:
    """An idempotency key: a non-empty str encodable as UTF-8, else InvalidRecordError."""
    if not isinstance(key, str) or not key:
        raise InvalidRecordError("idempotency_key must be a non-empty str")
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRecordError(
                f"idempotency_key {key!r} is not encodable as UTF-8 (lone surrogate)"
            ) from None

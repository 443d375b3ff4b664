"""Validated copies of the records a caller hands the store: what every write path (the
session API, the legacy import) checks before anything is encoded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from eventstore.errors import InvalidRecordError
from eventstore.format.codec import validated_copy
from eventstore.records import FeatureRecord, SessionManifest
from eventstore.session_ids import validate_session_id

__all__ = ["exactly", "feature_list", "manifest_of", "records"]

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

"""The fingerprint of a keyed request: what an idempotency key's first request asked to
write, so a retry with the same key is told from a different request under that key."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from eventstore.format.events import Event, UnknownEvent, event_tag

__all__ = ["fingerprint"]

# the envelope of a line: where and when it was appended, not what was asked for
_ENVELOPE = frozenset({"seq", "ts", "more", "key", "v", "h"})


def fingerprint(events: Sequence[Event]) -> str:
    """A digest of a request's events' types and payloads, without the envelope
    (sequence, time of append, key, hash) and with every time inside a record masked, so
    a retry that rebuilt its records (fresh default times) is the same request, while a
    time set where there was none is not."""
    digest = hashlib.blake2b(digest_size=16)
    for ev in events:
        if type(ev) is UnknownEvent:
            data = msgspec.json.decode(ev.raw)
        else:
            data = _request_form(ev)
            data["type"] = event_tag(type(ev))
        payload = {k: v for k, v in data.items() if k not in _ENVELOPE}
        digest.update(msgspec.json.encode(payload, order="sorted") + b"\n")
    return digest.hexdigest()


def _request_form(value: Any) -> Any:
    """`value` as plain data for a fingerprint: Structs as dicts of every field, times
    masked, raw JSON decoded, enums as their values."""
    if isinstance(value, datetime):
        return "<time>"
    if isinstance(value, msgspec.Raw):
        return _request_form(msgspec.json.decode(value))
    if isinstance(value, msgspec.Struct):
        return {f: _request_form(getattr(value, f)) for f in value.__struct_fields__}
    if isinstance(value, dict):
        return {str(k): _request_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_request_form(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value

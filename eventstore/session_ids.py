"""What a session id may be: any non-empty string of at most 1,024 UTF-8 bytes, with no
NUL. Every engine and every entry point checks ids here, so a bad id gets the same
`InvalidSessionIdError` (a `ValueError`) wherever it is given."""

from __future__ import annotations

from urllib.parse import quote

from eventstore.errors import InvalidArgumentError, InvalidSessionIdError

__all__ = ["MAX_SESSION_ID_BYTES", "id_part", "validate_session_id"]

MAX_SESSION_ID_BYTES = 1024


def validate_session_id(session_id: object) -> str:
    """Return `session_id` if it is a usable id, else raise `InvalidSessionIdError`."""
    if not isinstance(session_id, str):
        raise InvalidSessionIdError(f"session id must be a str, got {type(session_id).__name__}")
    if not session_id:
        raise InvalidSessionIdError("session id must not be empty")
    if "\x00" in session_id:
        raise InvalidSessionIdError(f"session id {session_id!r} contains a NUL character")
    try:
        size = len(session_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidSessionIdError(
            f"session id {session_id!r} is not encodable as UTF-8 (lone surrogate)"
        ) from None
    if size > MAX_SESSION_ID_BYTES:
        raise InvalidSessionIdError(
            f"session id is {size} bytes of UTF-8; the limit is {MAX_SESSION_ID_BYTES}"
        )
    return session_id


def id_part(text: object, what: str) -> str:
    """One part of a session id an adapter composes from its keys (an app, a user, a
    project...): a non-empty str, percent-encoded, `.` included (the parts' separator);
    `InvalidArgumentError` naming `what` otherwise."""
    if not isinstance(text, str) or not text:
        raise InvalidArgumentError(f"{what} must be a non-empty str, got {text!r}")
    try:
        return quote(text, safe="").replace(".", "%2E")
    except UnicodeEncodeError:  # a lone surrogate: no id can carry it
        raise InvalidArgumentError(
            f"{what} {text!r} is not encodable as UTF-8 (lone surrogate)"
        ) from None

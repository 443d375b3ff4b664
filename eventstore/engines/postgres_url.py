"""Store URLs of the PostgreSQL engine: parsing them, and printing them without secrets.

Imports nothing of psycopg, so the CLI can redact a URL (and say what is wrong with it)
without the `[postgres]` extra installed.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .postgres_schema import quote_schema

__all__ = ["DEFAULT_SCHEMA", "redact_url", "split_url"]

DEFAULT_SCHEMA = "eventstore"


def redact_url(url: str) -> str:
    """`url` with any password (in the authority or a `password=` parameter) replaced
    by `***`: what every message and the CLI print. A path (no `://`) is returned as is."""
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        if ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k == "password" for k, _ in pairs):
            query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def split_url(url: str) -> tuple[str, str]:
    """(the libpq connection URL, the schema name) of a store URL; `postgres://` is
    accepted as `postgresql://`. ValueError for a URL that is not one, or a bad schema."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {redact_url(url)}")
    schema = DEFAULT_SCHEMA
    kept: list[tuple[str, str]] = []
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        if k == "schema":
            schema = v
        else:
            kept.append((k, v))
    quote_schema(schema)  # validates
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(kept), ""))
    return conninfo, schema

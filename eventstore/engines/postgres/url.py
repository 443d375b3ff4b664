"""Store URLs of the PostgreSQL engine: parsing them, and printing them without secrets.

Imports nothing of psycopg, so the CLI can redact a URL (and say what is wrong with it)
without the `[postgres]` extra installed.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from eventstore.engines.base import redact_url
from eventstore.engines.postgres.schema import quote_schema

__all__ = ["DEFAULT_SCHEMA", "redact_url", "split_url"]

DEFAULT_SCHEMA = "eventstore"


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
    conninfo = urlunsplit(
        ("postgresql", parts.netloc, parts.path, urlencode(kept, quote_via=quote), "")
    )
    return conninfo, schema

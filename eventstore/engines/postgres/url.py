"""Store URLs of the PostgreSQL engine: parsing them, and printing them without secrets.

Imports nothing of psycopg, so the CLI can redact a URL (and say what is wrong with it)
without the `[postgres]` extra installed.

No secret (the URL's password, a `password=` or `sslpassword=` parameter) may reach a
message: a URL libpq would misread (a password with a raw `@`, `/`, `?`, `#` or a `%`
that starts no escape) is refused here without quoting it, and `scrub` takes every
secret of a URL out of a text the server or libpq wrote.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from eventstore.engines.base import redact_url, split_userinfo
from eventstore.engines.postgres.schema import quote_schema
from eventstore.errors import InvalidArgumentError

__all__ = ["DEFAULT_SCHEMA", "redact_url", "scrub", "secrets_of", "split_url"]

DEFAULT_SCHEMA = "eventstore"

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def split_url(url: str) -> tuple[str, str]:
    """(the libpq connection URL, the schema name) of a store URL; `postgres://` is
    accepted as `postgresql://`, in any case. InvalidArgumentError for a URL that is not
    one, a bad schema, or (never quoting it) a password libpq would misread."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("postgresql", "postgres"):  # (case-insensitive)
        raise InvalidArgumentError(f"not a PostgreSQL URL: {redact_url(url)}")
    userinfo, _ = split_userinfo(rest)
    if userinfo is not None:
        _check_userinfo(userinfo, redact_url(url))
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unmatched [ in the host
        raise InvalidArgumentError(f"not a valid URL ({exc}): {redact_url(url)}") from None
    schema = DEFAULT_SCHEMA
    kept: list[tuple[str, str]] = []
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        if k == "schema":
            schema = v
        else:
            kept.append((k, v))
    quote_schema(schema)  # validates
    # (not urlunsplit: with no authority, `postgresql:///db` would lose its `//`, and
    # libpq would read what is left as key=value options)
    query = urlencode(kept, quote_via=quote)
    conninfo = f"postgresql://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")
    return conninfo, schema


def _check_userinfo(userinfo: str, shown: str) -> None:
    user, colon, password = userinfo.partition(":")
    for name, text in (("user name", user), ("password", password if colon else "")):
        if _BAD_ESCAPE.search(text) or any(c in text for c in "@/?#[]"):
            raise InvalidArgumentError(
                f"{shown}: the {name} in the URL must be percent-encoded"
                " (% as %25, @ as %40, / as %2F, ? as %3F, # as %23, [ ] as %5B %5D)"
            )


def secrets_of(url: str) -> list[str]:
    """Every secret a store URL holds, in each form a message could show it (as written
    and decoded): the userinfo's password, `password=` and `sslpassword=` values."""
    found: list[str] = []
    _, _, rest = url.partition("://")
    userinfo, _ = split_userinfo(rest)
    if userinfo is not None and ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    query = rest.partition("?")[2].partition("#")[0]
    for raw in query.split("&"):
        key, eq, value = raw.partition("=")
        if eq and unquote(key).strip().lower().endswith("password"):
            found.append(value)
    forms = {f for s in found for f in (s, unquote(s), unquote(s.replace("+", " "))) if f}
    # urllib's URL parsing drops tabs and line breaks (the URL handed to libpq, which
    # quotes what it cannot parse, lacks them)
    forms |= {f.translate(_DROPPED_BY_URLSPLIT) for f in forms} - {""}
    return sorted(forms, key=len, reverse=True)


_DROPPED_BY_URLSPLIT = dict.fromkeys(map(ord, "\t\r\n"))


def scrub(text: str, secrets: list[str]) -> str:
    """`text` with every occurrence of each secret replaced by `***`."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text

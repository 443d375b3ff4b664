"""The CLI's text building (eventstore.cli.format) and URL redaction (cli_store), over
generated inputs: tables fit the width they are given, shortening keeps a prefix, sizes
and plurals read right, and no URL password is ever printed."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventstore.cli.format import (
    display_width,
    fmt_bytes,
    plural,
    shorten,
    table,
)
from eventstore.engines.base import redact_text as redact_url

text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=80)
wide_or_narrow = st.sampled_from(["a", "é", "日", "✓", " ", "-"])


@given(
    st.text(st.one_of(wide_or_narrow, st.characters(codec="utf-8")), max_size=60),
    st.integers(2, 80),
)
def test_shorten_fits_and_keeps_a_prefix(s: str, width: int) -> None:
    out = shorten(s, width)
    assert display_width(out) <= width
    flat = " ".join(s.split())
    if display_width(flat) <= width:
        assert out == flat
    else:
        assert out.endswith("…") and flat.startswith(out[:-1])
    assert shorten(s, width, full=True) == s


@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), text, st.text(wide_or_narrow, max_size=300)), max_size=8
    ),
    st.integers(60, 200),
)
def test_a_table_with_a_flexible_column_fits_its_width(
    rows: list[tuple[int, str, str]], width: int
) -> None:
    rows = [(n, shorten(a, 20), b) for n, a, b in rows]  # the fixed columns stay narrow
    out = table(["N", "NAME", "TEXT"], rows, right=(0,), flex=2, width=width)
    lines = out.splitlines()
    assert len(lines) == len(rows) + 1
    assert all(display_width(line) <= width for line in lines), out
    for line, (n, _, _) in zip(lines[1:], rows, strict=True):
        assert line.split()[0] == str(n)


def test_full_tables_are_never_cut() -> None:
    long = "word " * 100
    out = table(["A", "B"], [["x", long]], flex=1, width=40, full=True)
    assert long.strip() in out


@pytest.mark.parametrize(
    ("n", "shown"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (9_100, "9.1 kB"), (1_250_000, "1.2 MB"),
     (3 * 10**9, "3.0 GB"), (5 * 10**12, "5000.0 GB")],
)  # fmt: skip
def test_fmt_bytes(n: int, shown: str) -> None:
    assert fmt_bytes(n) == shown


def test_plural() -> None:
    assert [plural(n, "entry", "entries") for n in (0, 1, 2)] == [
        "0 entries",
        "1 entry",
        "2 entries",
    ]
    assert plural(1, "feature") == "1 feature" and plural(3, "feature") == "3 features"


secret = st.text(
    alphabet=string.ascii_letters + string.digits + "!$%^*()~-_.+=:@", min_size=6, max_size=20
).filter(lambda s: not s.startswith(("@", ":")))


@given(
    st.sampled_from(["postgresql", "postgres", "redis", "http"]),
    st.from_regex(r"[a-z]{1,8}", fullmatch=True),
    secret,
)
def test_a_url_password_never_survives_redaction(scheme: str, user: str, password: str) -> None:
    url = f"{scheme}://{user}:{password}@db.example:5432/store?sslmode=require"
    for shown in (redact_url(url), redact_url(f"cannot connect to {url}: refused")):
        assert password not in shown
        assert f"{scheme}://{user}:***@db.example:5432/store" in shown
    query = f"{scheme}://db.example/store?user={user}&password={password}"
    assert password not in redact_url(query)


def test_redaction_leaves_other_text_alone() -> None:
    for plain in (
        "/var/lib/store",
        "file:///tmp/x",
        "memory://shared",
        "a:b@c",
        "postgresql://u@h/db",
    ):
        assert redact_url(plain) == plain

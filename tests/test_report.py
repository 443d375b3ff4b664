"""The session report (eventstore.report, `eventstore report`): what the page holds, that
hostile text cannot break out of it, that it fetches nothing, and that it stays under its
size limit at 10,000 turns. The page as a browser draws it: tests/test_report_browser.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import cli_in_process, log_path, one_line_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import (
    FeatureRecord,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    RunStatus,
    SessionManifest,
    SessionStore,
    ToolUseBlock,
    UnknownSessionError,
)
from eventstore.cli.app import main
from eventstore.ops.audit import stats
from eventstore.report.page import (
    MAX_BYTES,
    ReportLimits,
    build_report,
    fit_cap,
    report_data,
)

T0 = datetime(2026, 11, 29, 15, 0, tzinfo=UTC)

HOSTILE = [
    "</script><img src=x onerror=alert(1)>",
    "</SCRIPT ><script>alert(2)</script>",
    "<!--<script>",
    "<script>alert(3)</script>",
    '\u2028\u2029 line separators "quotes" \\ back\\slash',
    "]]></style></title><svg onload=alert(4)>",
]


# -- reading a page ----------------------------------------------------------------------


class Page(HTMLParser):
    """A page as an HTML parser (and so a browser's tokenizer) sees it."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.styles: list[str] = []
        self.title = ""
        self._open: str | None = None
        self._attrs: dict[str, str | None] = {}
        self._text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style", "title"):
            self._open, self._attrs, self._text = tag, dict(attrs), []

    def handle_data(self, data: str) -> None:
        if self._open:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == self._open:
            text = "".join(self._text)
            if tag == "script":
                self.scripts.append((self._attrs, text))
            elif tag == "style":
                self.styles.append(text)
            else:
                self.title = text
            self._open = None

    def data(self) -> dict[str, Any]:
        """The embedded JSON document, decoded the way the page's script decodes it."""
        (text,) = [t for a, t in self.scripts if a.get("type") == "application/json"]
        return json.loads(text)  # type: ignore[no-any-return]

    def names(self) -> list[str]:
        return [t for t, _ in self.tags]


def page_of(store: SessionStore, sid: str, **kw: Any) -> Page:
    return Page(build_report(store, sid, generated_at=T0, **kw))


# -- sessions ------------------------------------------------------------------------------


def feature(i: int, passes: bool = False, fid: str | None = None) -> FeatureRecord:
    return FeatureRecord(
        id=fid or f"feat-{i:03d}",
        category="core",
        description=f"feature number {i}",
        steps=["open", "check"],
        passes=passes,
    )


def write_session(store: SessionStore, sid: str = "s1", *, n_features: int = 5) -> None:
    """Two runs, flips both ways, progress notes, a transcript with a tool result."""
    manifest = SessionManifest(
        session_id=sid,
        active_branch="feature/report",
        current_objective="Show the session as one page",
        last_known_good_commit="abc1234",
        metadata={"repo": "example/report"},
    )
    store.initialize_session_if_missing(
        sid,
        manifest,
        [feature(i) for i in range(n_features)],
        initial_progress_entry=ProgressEntry(run_id="run-1", summary="plan written", created_at=T0),
        initial_checkpoint=RunCheckpoint(run_id="run-1", started_at=T0),
    )
    store.append_transcript_messages(
        sid,
        [
            Message(role=Role.SYSTEM, content="You are a careful agent."),
            Message(role=Role.USER, content="Make feat-000 pass."),
        ],
    )
    store.update_feature_pass(sid, "feat-000", True)
    store.append_transcript_messages(
        sid,
        [
            Message(role=Role.ASSISTANT, content="Running the tests."),
            Message(role=Role.TOOL, content="$ pytest\n3 passed"),
        ],
    )
    store.update_feature_pass(sid, "feat-001", True)
    store.update_feature_pass(sid, "feat-001", True)  # no change: not a flip
    store.append_progress_entry(
        sid, ProgressEntry(run_id="run-1", summary="feat-000 and feat-001 pass", created_at=T0)
    )
    store.record_run_checkpoint(
        sid,
        RunCheckpoint(
            run_id="run-1",
            started_at=T0,
            completed_at=T0 + timedelta(minutes=30),
            status=RunStatus.SUCCEEDED,
            note="two features",
        ),
    )
    later = T0 + timedelta(hours=1)
    store.record_run_checkpoint(sid, RunCheckpoint(run_id="run-2", started_at=later))
    store.update_feature_pass(sid, "feat-001", False)  # a regression
    store.append_progress_entry(
        sid, ProgressEntry(run_id="run-2", summary="feat-001 broke again", created_at=later)
    )
    store.record_run_checkpoint(
        sid,
        RunCheckpoint(
            run_id="run-2",
            started_at=later,
            completed_at=later + timedelta(minutes=10),
            status=RunStatus.FAILED,
            note="regression",
        ),
    )
    store.append_transcript_messages(sid, [Message(role=Role.ASSISTANT, content="Done for now.")])


# -- what the page holds -----------------------------------------------------------------


def test_the_page_holds_the_session(store: SessionStore) -> None:
    write_session(store)
    page = page_of(store, "s1")
    d = page.data()
    state = store.load_bootstrap_state("s1")
    report = store.verify("s1")
    st_ = stats(store, "s1")

    assert "s1" in page.title
    assert d["manifest"]["current_objective"] == "Show the session as one page"
    assert d["manifest"]["active_branch"] == "feature/report"
    assert d["manifest"]["last_known_good_commit"] == "abc1234"
    assert d["verify"]["ok"] is True and d["verify"]["problems"] == []
    assert d["verify"]["head_hash"] == report.head_hash
    assert d["verify"]["head_seq"] == report.head_seq == store.last_seq("s1")
    assert d["sizes"]["log_bytes"] == st_.log_bytes > 0
    assert d["sizes"]["events"] == st_.events
    assert d["sizes"]["messages"] == 5 and d["sizes"]["features"] == 5

    # the current features, failing ones named, each with the seq of its last flip
    assert [(f["id"], f["passes"]) for f in d["features"]] == [
        (f.id, f.passes) for f in state.feature_list
    ]
    failing = {f["id"] for f in d["features"] if not f["passes"]}
    assert failing == {"feat-001", "feat-002", "feat-003", "feat-004"}

    # flips: the two real changes up and one down; the repeated update is not one
    flips = [(f[2], f[3]) for f in d["flips"]]
    assert flips == [("feat-000", True), ("feat-001", True), ("feat-001", False)]
    by_id = {f["id"]: f for f in d["features"]}
    assert by_id["feat-001"]["flipped_at"] == d["flips"][-1][0]
    assert by_id["feat-002"]["flipped_at"] is None

    # runs: latest status per run, its notes in order
    runs = {r["run_id"]: r for r in d["runs"]}
    assert runs["run-1"]["status"] == "succeeded" and runs["run-1"]["checkpoints"] == 2
    assert runs["run-2"]["status"] == "failed" and runs["run-2"]["note"] == "regression"
    assert [p[1] for p in runs["run-1"]["progress"]] == [
        "plan written",
        "feat-000 and feat-001 pass",
    ]
    assert runs["run-1"]["completed_at"] == "2026-11-29T15:30:00Z"

    # the transcript, in order, each message with the event that appended it
    messages = store.load_transcript_messages("s1")
    assert [(m["role"], m["content"]) for m in d["messages"]] == [
        (m.role.value, m.content) for m in messages
    ]
    assert [m["index"] for m in d["messages"]] == [1, 2, 3, 4, 5]
    seqs = {ev.seq for ev in store.read_events("s1", types=["messages_appended"])}
    assert {m["seq"] for m in d["messages"]} == seqs
    assert d["messages"][0]["seq"] == d["messages"][1]["seq"]  # one append, two messages

    # every event in the table, in order, with the counts per type
    events = list(store.read_events("s1"))
    assert [e[0] for e in d["events"]] == [ev.seq for ev in events]
    assert d["event_types"] == st_.by_type
    assert d["unreadable"] is None
    assert d["omitted"] == {
        "events": 0,
        "messages": 0,
        "chart_points": 0,
        "messages_cut": 0,
        "content_cap": None,
    }


def test_the_chart_counts_what_state_at_says(store: SessionStore) -> None:
    """Every chart point equals the bootstrap state as of its seq (an independent fold)."""
    write_session(store)
    store.replace_feature_list("s1", [feature(i, passes=i % 2 == 0) for i in range(7)])
    store.update_feature_pass("s1", "feat-005", True)
    d = page_of(store, "s1").data()
    assert len(d["chart"]) == 7  # the first list, four updates, the new list, one update
    for seq, ts, passing, total in d["chart"]:
        then = store.state_at("s1", seq=seq)
        assert (passing, total) == (
            sum(f.passes for f in then.feature_list),
            len(then.feature_list),
        )
        assert ts.endswith("Z")
    assert d["chart"][-1][2:] == [5, 7]


feature_ops = st.lists(
    st.one_of(
        st.tuples(st.just("pass"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("replace"), st.integers(0, 6), st.booleans()),
    ),
    max_size=25,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=feature_ops)
def test_flips_are_exactly_the_changes(tmp_path: Path, ops: list[tuple[str, int, bool]]) -> None:
    with SessionStore(tmp_path / f"s{time.monotonic_ns()}") as store:
        store.initialize_session_if_missing(
            "h",
            SessionManifest(session_id="h", active_branch="b", current_objective="o"),
            [feature(i) for i in range(3)],
        )
        for op, n, flag in ops:
            ids = {f.id for f in store.load_bootstrap_state("h").feature_list}
            if op == "replace":
                store.replace_feature_list("h", [feature(i, passes=flag) for i in range(n)])
            elif f"feat-{n:03d}" in ids:
                store.update_feature_pass("h", f"feat-{n:03d}", flag)
        d = page_of(store, "h").data()
        expected = []
        for ev in store.read_events("h", types=["feature_pass_updated"]):
            before = {f.id: f.passes for f in store.state_at("h", seq=ev.seq - 1).feature_list}
            if before.get(ev.feature_id, ev.passes) != ev.passes:
                expected.append([ev.seq, ev.feature_id, ev.passes])
        assert [[f[0], f[2], f[3]] for f in d["flips"]] == expected
        for seq, _, passing, total in d["chart"]:
            then = store.state_at("h", seq=seq).feature_list
            assert (passing, total) == (sum(f.passes for f in then), len(then))


def test_an_unknown_session_is_an_error(store: SessionStore) -> None:
    write_session(store)
    with pytest.raises(UnknownSessionError, match="nope"):
        build_report(store, "nope")


def test_a_tampered_log_is_reported_on_the_page(store: SessionStore, root: Path) -> None:
    write_session(store)
    log = log_path(root, "s1")
    log.write_bytes(log.read_bytes().replace(b"plan written", b"plan WRITTEN"))
    with SessionStore(root) as fresh:
        d = page_of(fresh, "s1").data()
    assert d["verify"]["ok"] is False
    assert d["verify"]["problems_total"] >= d["verify"]["errors"] >= 1
    assert d["verify"]["problems"][0]["severity"] == "error"  # errors first
    # the page is drawn: with the session where reads do not check hashes, or, where they
    # do (the engines' one line reader), with what verify found and why the rest is empty
    if d["unreadable"] is None:
        assert any(r["run_id"] == "run-1" for r in d["runs"])
    else:
        assert "hash" in d["unreadable"] and d["runs"] == []


def test_a_log_that_does_not_read_still_gives_a_page(install_log: Any, root: Path) -> None:
    """A bad line in the middle: loads refuse the log, and the page shows what verify
    found (where, what) with the other sections empty."""
    install_log("corrupt_middle.jsonl", "bad")
    with SessionStore(root) as store:
        report = store.verify("bad")
        d = page_of(store, "bad").data()
    assert d["verify"]["ok"] is False and d["verify"]["errors"] >= 1
    assert d["verify"]["head_hash"] == report.head_hash
    assert d["unreadable"] is not None and "seq 10" in d["unreadable"]
    assert d["messages"] == [] and d["events"] == [] and d["features"] == []


def test_a_torn_tail_is_a_warning(store: SessionStore, root: Path) -> None:
    write_session(store)
    with open(log_path(root, "s1"), "ab") as f:
        f.write(b'{"type":"progress_appended","seq":99')  # a crash mid-append
    with SessionStore(root) as fresh:
        d = page_of(fresh, "s1").data()
    assert d["verify"]["ok"] is True and d["verify"]["errors"] == 0
    assert d["verify"]["problems_total"] == 1
    assert d["verify"]["problems"][0]["severity"] == "warning"


def test_a_compacted_session_keeps_its_history(store: SessionStore) -> None:
    write_session(store)
    before = page_of(store, "s1").data()
    store.compact("s1", archive=True)
    after = page_of(store, "s1").data()
    assert after["chart"] == before["chart"] and after["flips"] == before["flips"]
    assert after["messages"] == before["messages"]
    assert after["sizes"]["archive_files"] == 1


def test_history_compacted_away_still_draws(store: SessionStore) -> None:
    """Without an archive the snapshot stands in for the lost events: the chart starts
    there, and the messages it holds have no event of their own."""
    write_session(store)
    store.compact("s1", archive=False)
    store.append_transcript_messages("s1", [Message(role=Role.USER, content="after")])
    store.update_feature_pass("s1", "feat-004", True)
    d = page_of(store, "s1").data()
    assert len(d["messages"]) == 6
    assert all(m.get("seq") is None for m in d["messages"][:5])
    assert d["messages"][-1]["seq"] == store.last_seq("s1") - 1
    assert d["chart"][0][2] == 1  # the snapshot's state: feat-000 passes
    assert [f[2] for f in d["flips"]] == ["feat-004"]
    assert d["sizes"]["compacted_without_archive"] > 0


class WideMessage(msgspec.Struct, frozen=True):
    """A message with more fields than `Message` has here: the page must not care."""

    role: Role
    content: str | list[dict[str, str]]
    name: str | None = None
    tool_calls: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    created_at: datetime | None = None
    metadata: dict[str, str] = {}


def wide_messages() -> list[WideMessage]:
    return [
        WideMessage(
            role=Role.ASSISTANT,
            content=[{"type": "text", "text": "not text"}],
            tool_calls=[{"id": "c1", "name": "run", "arguments": '{"cmd": "ls"}'}],
            created_at=T0,
        ),
        WideMessage(role=Role.TOOL, content="listing", name="run", metadata={"k": "v"}),
        WideMessage(
            role=Role.ASSISTANT,
            content="Let me look.",
            blocks=[
                {"type": "thinking", "thinking": "the listing first", "signature": "sig"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls -la"}},
                {"type": "tool_result", "tool_use_id": "t1", "content": "a\nb", "is_error": True},
                {"type": "image", "source": "sha256:ab", "media_type": "image/png"},
            ],
        ),
    ]


def test_extra_message_fields_are_shown_generically(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages may grow fields (tool calls, a name, content blocks, a time): the page
    shows each non-empty one as text, content that is not text as JSON, and each typed
    block of a field on its own, labelled by type and name."""
    write_session(store)
    monkeypatch.setattr(store, "load_transcript_messages", lambda sid: wide_messages())
    d = page_of(store, "s1").data()
    first, second, third = d["messages"]
    assert json.loads(first["content"]) == [{"type": "text", "text": "not text"}]
    ((label, text),) = first["extras"]  # empty fields and the time are not extras
    assert label == "tool_calls" and json.loads(text)[0]["name"] == "run"
    assert first["ts"] == "2026-11-29T15:00:00Z"
    assert second["extras"] == [["name", "run"], ["metadata", '{\n  "k": "v"\n}']]
    labels = [x[0] for x in third["extras"]]
    # the text block repeats the content: left out; the others, each on its own
    assert labels == ["thinking", "tool_use: Bash", "tool_result (error)", "image"]
    extras = dict(map(tuple, third["extras"]))
    assert extras["thinking"] == "the listing first"
    assert json.loads(extras["tool_use: Bash"]) == {"id": "t1", "input": {"command": "ls -la"}}
    assert extras["tool_result (error)"] == "a\nb"
    assert json.loads(extras["image"]) == {"source": "sha256:ab", "media_type": "image/png"}


# -- hostile text cannot break out -----------------------------------------------------------


def write_hostile(store: SessionStore, sid: str, text: str) -> None:
    store.initialize_session_if_missing(
        sid,
        SessionManifest(
            session_id=sid,
            active_branch=text,
            current_objective=text,
            last_known_good_commit=text,
            metadata={text: text},
        ),
        [FeatureRecord(id=text, category=text, description=text, steps=[text], passes=False)],
        initial_progress_entry=ProgressEntry(run_id=text, summary=text, created_at=T0),
        initial_checkpoint=RunCheckpoint(run_id=text, started_at=T0, note=text),
    )
    store.append_transcript_messages(sid, [Message(role=Role.USER, content=text)])
    store.update_feature_pass(sid, text, True)


def assert_contained(page: Page, text: str) -> None:
    """Exactly the page's own three scripts and one style, nothing else active, and the
    text read back intact from the embedded data."""
    assert [a.get("type") for a, _ in page.scripts] == [None, "application/json", None]
    assert len(page.styles) == 1
    names = page.names()
    for tag in ("img", "svg", "iframe", "object", "embed", "link", "base", "form"):
        assert tag not in names, tag
    assert all(not k.startswith("on") for _, attrs in page.tags for k in attrs)
    d = page.data()
    assert d["messages"][0]["content"] == text
    assert d["manifest"]["current_objective"] == text
    assert d["features"][0]["id"] == text
    assert d["runs"][0]["progress"][0][1] == text
    assert d["flips"][0][2] == text


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_cannot_break_out(store: SessionStore, text: str) -> None:
    write_hostile(store, "evil", text)
    raw = build_report(store, "evil", generated_at=T0)
    data_text = raw.split('id="report-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data_text  # every < is \u003c: no </script, no <!--
    assert_contained(Page(raw), text)


@pytest.mark.parametrize("sid", ["</title><script>alert(1)</script>", "a\"'<b>&amp;"])
def test_a_hostile_session_id_is_escaped(store: SessionStore, sid: str) -> None:
    write_hostile(store, sid, "x")
    page = page_of(store, sid)
    assert sid in page.title
    assert [a.get("type") for a, _ in page.scripts] == [None, "application/json", None]
    assert page.data()["session_id"] == sid


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(st.sampled_from("<>/!-sScRiPt'\"&\\\u2028 \n"), min_size=1, max_size=40))
def test_no_text_breaks_out(tmp_path: Path, text: str) -> None:
    with SessionStore(tmp_path / f"h{time.monotonic_ns()}") as store:
        write_hostile(store, "h", text)
        assert_contained(page_of(store, "h"), text)


# -- offline: the page names nothing outside itself ----------------------------------------------


def test_the_page_loads_nothing(store: SessionStore) -> None:
    write_session(store)
    raw = build_report(store, "s1", generated_at=T0)
    page = Page(raw)
    for tag, attrs in page.tags:
        for key in ("src", "href", "srcset", "action", "data", "poster", "background"):
            value = attrs.get(key)
            assert value is None or value.startswith("#"), (tag, key, value)
    assert not re.search(r"url\(|@import", page.styles[0])
    # the policy forbids any load, and lets only the page's own scripts and style run
    (csp,) = [
        a["content"] for t, a in page.tags if a.get("http-equiv") == "Content-Security-Policy"
    ]
    assert csp is not None and "default-src 'none'" in csp and "unsafe-inline" not in csp
    for attrs, text in page.scripts:
        if attrs.get("type") is None:
            digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in csp
    style_digest = base64.b64encode(hashlib.sha256(page.styles[0].encode()).digest()).decode()
    assert f"style-src 'sha256-{style_digest}'" in csp


# -- size -------------------------------------------------------------------------------------


def test_fit_cap_examples() -> None:
    assert fit_cap([1, 2, 3], 6) is None
    assert fit_cap([10, 10, 10], 15) == 5
    assert fit_cap([1, 100, 100], 41) == 20  # the short one keeps all it has
    assert fit_cap([5, 5], 0) == 0


@given(lengths=st.lists(st.integers(0, 10_000), max_size=40), budget=st.integers(0, 200_000))
def test_fit_cap_is_the_largest_cap_within_budget(lengths: list[int], budget: int) -> None:
    cap = fit_cap(lengths, budget)
    if cap is None:
        assert sum(lengths) <= budget
        return
    assert sum(lengths) > budget
    assert sum(min(n, cap) for n in lengths) <= budget
    assert sum(min(n, cap + 1) for n in lengths) > budget


TURNS = 10_000


@pytest.fixture(scope="module")
def long_session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10,000 turns (user, assistant ~1.5 kB, tool ~0.8 kB), 50 features flipping."""
    root = tmp_path_factory.mktemp("long") / "store"
    with SessionStore(root) as store:
        store.initialize_session_if_missing(
            "long",
            SessionManifest(session_id="long", active_branch="main", current_objective="o"),
            [feature(i) for i in range(50)],
        )
        answer = "Here is the change. " * 75
        output = "$ pytest -q\n" + "." * 780
        for i in range(TURNS):
            store.append_transcript_messages(
                "long",
                [
                    Message(role=Role.USER, content=f"turn {i}: next step please"),
                    Message(role=Role.ASSISTANT, content=f"turn {i}. {answer}"),
                    Message(role=Role.TOOL, content=output),
                ],
            )
            if i % 50 == 0:
                # rounds over the 50 features: all pass, all fail, ...: each one a flip
                k = i // 50
                store.update_feature_pass("long", f"feat-{k % 50:03d}", k // 50 % 2 == 0)
    return root


@pytest.mark.slow
def test_ten_thousand_turns_fit_in_ten_megabytes(long_session: Path) -> None:
    with SessionStore(long_session) as store:
        t = time.perf_counter()
        raw = build_report(store, "long")
        seconds = time.perf_counter() - t
        transcript = store.load_transcript_messages("long")
    size = len(raw.encode("utf-8"))
    print(f"10,000 turns: {size:,} bytes, built in {seconds:.2f} s")
    assert size <= MAX_BYTES
    d = Page(raw).data()
    # every message is on the page (paged by the script), long ones cut, and said so
    assert len(d["messages"]) == len(transcript) == 3 * TURNS
    assert d["omitted"]["messages"] == 0 and d["omitted"]["events"] == 0
    cut = [m for m in d["messages"] if "length" in m]
    assert cut and d["omitted"]["messages_cut"] == len(cut)
    for m in cut:
        original = transcript[m["index"] - 1].content
        assert original.startswith(m["content"]) and m["length"] == len(original)
    assert all(len(e[3]) <= ReportLimits().summary_chars for e in d["events"])
    assert len(d["flips"]) == TURNS // 50


@pytest.mark.slow
def test_a_smaller_limit_cuts_more(long_session: Path) -> None:
    with SessionStore(long_session) as store:
        raw = build_report(store, "long", max_bytes=1_000_000)
        assert len(raw.encode("utf-8")) <= 1_000_000
        d = Page(raw).data()
        assert d["omitted"]["events"] > 0 and d["omitted"]["messages"] > 0
        # what is kept is the most recent history
        assert d["events"][-1][0] == store.last_seq("long")
        assert d["messages"][-1]["index"] == 3 * TURNS
        with pytest.raises(ValueError, match="limit is 2000"):
            build_report(store, "long", max_bytes=2000)


# -- the command -------------------------------------------------------------------------------


def test_cli_writes_the_page(
    store: SessionStore, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_session(store)
    out = tmp_path / "out" / "s1.html"
    out.parent.mkdir()
    out.write_text("an older page")
    assert main(["report", str(root), "s1", "-o", str(out)]) == 0
    page = Page(out.read_text(encoding="utf-8"))
    assert page.data()["session_id"] == "s1"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # it holds the whole transcript
    assert sorted(p.name for p in out.parent.iterdir()) == ["s1.html"]  # no temporary left
    assert "wrote" in capsys.readouterr().err


def test_cli_writes_to_stdout(
    store: SessionStore, root: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    write_session(store)
    assert main(["report", str(root), "s1", "-o", "-"]) == 0
    out = capsysbinary.readouterr().out
    assert out.startswith(b"<!doctype html>")
    assert Page(out.decode("utf-8")).data()["sizes"]["messages"] == 5


def test_cli_max_bytes(
    store: SessionStore, root: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    write_session(store)
    store.append_transcript_messages("s1", [Message(role=Role.USER, content="z" * 200_000)])
    assert main(["report", str(root), "s1", "-o", "-", "--max-bytes", "100000"]) == 0
    assert len(capsysbinary.readouterr().out) <= 100_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{root}", "nope", "-o", "-"], "no session 'nope'"),
        (["{root}/missing", "s1", "-o", "-"], "no store at"),
        (["{root}", "s1", "-o", "{root}/no/such/dir/page.html"], "cannot write"),
        # the report written over the log it reads replaced the session's whole history
        (["{root}", "s1", "-o", "{root}/sessions/s1/log.jsonl"], "inside the store"),
        (["{root}", "s1", "-o", "{root}/report.html"], "inside the store"),
        (["{root}", "", "-o", "-"], "session id"),
    ],
)
def test_cli_errors_are_one_line(
    store: SessionStore,
    root: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    write_session(store)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    code = main(["report", *(a.format(root=root) for a in args)])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before  # read-only


def test_cli_needs_an_output(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(root), "s1"]) == 2  # main(argv) returns argparse's status
    assert "-o/--output" in capsys.readouterr().err


def test_report_does_not_create_a_store(tmp_path: Path) -> None:
    assert main(["report", str(tmp_path / "none"), "s1", "-o", "-"]) == 2
    assert not (tmp_path / "none").exists()


def test_report_data_is_public_and_typed(store: SessionStore) -> None:
    write_session(store)
    data = report_data(store, "s1", generated_at=T0)
    assert data.generated_at == "2026-11-29T15:00:00Z"
    assert msgspec.json.decode(msgspec.json.encode(data))["session_id"] == "s1"
    assert store.load_bootstrap_state("s1").manifest is not None


# -- the README's claims -------------------------------------------------------------------

README = Path(__file__).resolve().parent.parent / "README.md"
SCREENSHOT = README.parent / "fixtures" / "screenshots" / "report.png"
CSS = Path(__file__).resolve().parent.parent / "eventstore" / "report" / "assets" / "report.css"


def report_page() -> str:
    """docs/report.md, the report's page of the docs."""
    return (README.parent / "docs" / "report.md").read_text(encoding="utf-8")


def test_the_docs_commands_write_the_same_page_to_a_file_and_stdout(tmp_path: Path) -> None:
    block = report_page().split("```sh\n", 1)[1].split("```", 1)[0]
    assert "eventstore report .eventstore demo -o demo.html" in block
    script = f'set -euo pipefail\neventstore() {{ "{sys.executable}" -m eventstore "$@"; }}\n'
    done = subprocess.run(
        ["bash", "-c", script + block],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    one = Page((tmp_path / "demo.html").read_text(encoding="utf-8")).data()
    two = Page((tmp_path / "stdout.html").read_text(encoding="utf-8")).data()
    assert one["session_id"] == two["session_id"] == "demo"
    assert one["sizes"] == two["sizes"] and one["sizes"]["features"] == 20


def test_the_docs_screenshot_is_a_small_png() -> None:
    data = SCREENSHOT.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert 50_000 < len(data) < 300_000
    assert "](../fixtures/screenshots/report.png)" in report_page()


def _luminance(hex_colour: str) -> float:
    channels = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    """The WCAG 2 contrast ratio of two #rrggbb colours."""
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_text_contrast_is_at_least_4_5() -> None:
    css = CSS.read_text(encoding="utf-8")
    var = dict(re.findall(r"--([a-z]+):\s*(#[0-9a-f]{6})", css))
    assert contrast("#000000", "#ffffff") == pytest.approx(21)
    for fg in ("fg", "muted", "info", "ok", "bad", "run"):
        for bg in ("bg", "panel"):
            assert contrast(var[fg], var[bg]) >= 4.5, (fg, bg)
    # every badge: white text on its background
    badges = re.findall(r"\.b-[a-z_]+[^{]*\{\s*background:\s*(#[0-9a-f]{6}|var\(--([a-z]+)\))", css)
    assert len(badges) >= 5
    for literal, name in badges:
        colour = var[name] if name else literal
        assert contrast("#ffffff", colour) >= 4.5, colour
    alert = re.search(r"#js-errors, \.alert \{ background: (#[0-9a-f]{6})", css)
    assert alert is not None and contrast(var["bad"], alert.group(1)) >= 4.5
    # the message backgrounds keep body text readable
    for bg in re.findall(r"li\.r-[a-z]+ \{ background: (#[0-9a-f]{6})", css):
        assert contrast(var["fg"], bg) >= 4.5 and contrast(var["muted"], bg) >= 4.5


def run_browser_tests(env_ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(Path(sys.executable).parent)  # python, but no chromium on PATH
    if env_ci is not None:
        env["CI"] = env_ci
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_report_browser.py",
            "-k",
            "dump_dom",
        ],
        cwd=README.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_browser_tests_fail_in_ci_without_chromium() -> None:
    if any(shutil.which(n, path=str(Path(sys.executable).parent)) for n in ("chromium",)):
        pytest.skip("a chromium beside python: cannot hide it")
    done = run_browser_tests("true")
    assert done.returncode == 1 and "no chromium: CI must run the browser tests" in done.stdout
    done = run_browser_tests(None)
    assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout


INSTALL = README.parent / ".ci" / "install-chromium.sh"


def run_install(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/bash", str(INSTALL)],
        env={"PATH": str(path), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def fake(directory: Path, name: str, body: str) -> None:
    tool = directory / name
    tool.write_text("#!/bin/bash\n" + body + "\n")
    tool.chmod(0o755)


def test_install_chromium_installs_only_when_missing(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "apt.log"
    fake(bin_, "id", "echo 0")
    # a fake apt-get that records its arguments; `install` puts a chromium on PATH
    fake(
        bin_,
        "apt-get",
        f'echo "$@" >> {log}\n'
        f'if [[ " $* " == *" install "* ]]; then printf "#!/bin/bash\\n" > {bin_}/chromium;'
        f" /bin/chmod 755 {bin_}/chromium; fi",
    )
    done = run_install(bin_, tmp_path)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2
    assert calls[0].endswith("update -q") and calls[1].endswith("install -y -q chromium")
    # again: chromium is there, apt-get is not called
    done = run_install(bin_, tmp_path)
    assert done.returncode == 0 and "already installed" in done.stdout
    assert len(log.read_text().splitlines()) == 2


def test_install_chromium_without_apt_says_so(tmp_path: Path) -> None:
    done = run_install(tmp_path, tmp_path)  # an empty PATH: no chromium, no apt-get
    assert done.returncode == 1 and "no apt-get" in done.stderr


# -- attacks -------------------------------------------------------------------------------


def _long_field(store: SessionStore, sid: str, field: str, text: str) -> None:
    write_session(store, sid)
    if field == "progress summary":  # a test log pasted into a progress note
        store.append_progress_entry(sid, ProgressEntry(run_id="run-3", summary=text, created_at=T0))
    elif field == "checkpoint note":
        store.record_run_checkpoint(sid, RunCheckpoint(run_id="run-3", started_at=T0, note=text))
    elif field == "feature description":
        store.replace_feature_list(
            sid,
            [FeatureRecord(id="f", category="c", description=text, steps=[], passes=False)],
        )
    elif field == "objective":
        store.save_manifest(
            sid, SessionManifest(session_id=sid, active_branch="main", current_objective=text)
        )
    else:  # a tool call's name (the label of its box)
        store.append_transcript_messages(
            sid,
            [
                Message(
                    Role.ASSISTANT,
                    "calling",
                    blocks=[ToolUseBlock(id="t1", name=text, input={"k": "v"})],
                )
            ],
        )


@pytest.mark.parametrize(
    "field",
    ["progress summary", "checkpoint note", "feature description", "objective", "tool name"],
)
def test_one_long_field_is_cut_and_the_page_stays_under_max_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        _long_field(store, "long", field, "y" * 300_000)
    page = tmp_path / "long.html"
    rc, _, err = cli_in_process(
        capsys, "report", str(root), "long", "-o", str(page), "--max-bytes", "200000"
    )
    assert rc == 0, err
    assert page.stat().st_size <= 200_000


def test_an_eleven_megabyte_progress_note_still_gets_a_default_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        _long_field(store, "long", "progress summary", "y" * 11_000_000)
    page = tmp_path / "long.html"
    rc, _, err = cli_in_process(capsys, "report", str(root), "long", "-o", str(page))
    assert rc == 0, err
    assert page.stat().st_size <= 10_000_000


def test_report_writes_a_long_but_legal_file_name(
    demo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    name = "r" * 245 + ".html"  # 250 bytes: NAME_MAX is 255
    rc, _, err = cli_in_process(capsys, "report", str(demo_root), "s1", "-o", str(out / name))
    assert rc == 0, err
    assert os.listdir(out) == [name]


def test_report_output_that_is_a_directory_or_a_symlink(
    demo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "target.html"
    target.write_text("keep")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    rc, _, err = cli_in_process(capsys, "report", str(demo_root), "s1", "-o", str(link))
    assert rc == 0, err
    assert target.read_text() == "keep" and not link.is_symlink()  # replaced, not followed
    for out in (tmp_path, demo_root / "sessions", tmp_path / "missing" / "x.html"):
        rc, _, err = cli_in_process(capsys, "report", str(demo_root), "s1", "-o", str(out))
        assert rc == 2
        one_line_error(err)
    leftovers = [p for p in tmp_path.rglob("*.tmp-*")]
    assert leftovers == []

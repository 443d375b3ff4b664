"""The session report in a real browser: headless Chromium draws the page, and the tests
look at what its script drew (`--dump-dom`), take a screenshot, drive the filters and the
pager through the DevTools protocol (over `--remote-debugging-pipe`), and check that the
page logs no error and requests nothing but itself.

Skipped only where no Chromium is installed and CI is not "true"; in CI a missing
Chromium fails (`.ci/install-chromium.sh` installs it). Every browser run is bounded by a
timeout.
"""

from __future__ import annotations

import html
import json
import os
import re
import select
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import log_path
from test_report import (  # noqa: F401 (long_session: a fixture)
    HOSTILE,
    T0,
    long_session,
    wide_messages,
    write_hostile,
    write_session,
)

from eventstore import (
    Event,
    FeatureRecord,
    ImageBlock,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    SessionManifest,
    SessionStore,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from eventstore.cli.app import main
from eventstore.report.page import build_report

pytestmark = pytest.mark.slow  # a headless Chromium

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",  # containers often give /dev/shm only 64 MB
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--no-first-run",
    "--hide-scrollbars",
    "--mute-audio",
]
TIMEOUT = 120  # seconds for one browser run (the 10,000-turn page takes a few)


@pytest.fixture(scope="module")
def chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no chromium: CI must run the browser tests (.ci/install-chromium.sh)")
        pytest.skip("no chromium installed (.ci/install-chromium.sh installs it)")
    return CHROMIUM


def run_chromium(
    chromium: str, tmp: Path, *args: str, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{time.monotonic_ns()}"
    return subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def dump_dom(chromium: str, page: Path, tmp: Path) -> str:
    """The DOM after the page's script ran; fails on any console message of the page."""
    done = run_chromium(chromium, tmp, "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    return done.stdout


def block(dom: str, start: str, end: str) -> str:
    """The text of the DOM from `start` to the next `end`."""
    i = dom.index(start)
    return dom[i : dom.index(end, i)]


def probe_is_clean(dom: str) -> None:
    assert '<body data-render-ms="' in dom and 'data-rendered="ok"' in dom
    assert '<pre id="js-errors" role="alert" hidden=""></pre>' in dom, block(
        dom, '<pre id="js-errors"', "</pre>"
    )


@pytest.fixture
def demo_page(tmp_path: Path) -> tuple[Path, Path]:
    """The demo session (two runs) and its report page."""
    root = tmp_path / "store"
    for _ in range(2):
        assert main(["demo", "--root", str(root), "--json"]) == 0
    page = tmp_path / "demo.html"
    assert main(["report", str(root), "demo", "-o", str(page)]) == 0
    return root, page


def test_dump_dom_shows_what_the_script_drew(
    chromium: str, demo_page: tuple[Path, Path], tmp_path: Path
) -> None:
    root, page = demo_page
    static = page.read_text(encoding="utf-8")
    dom = dump_dom(chromium, page, tmp_path)
    probe_is_clean(dom)
    with SessionStore(root) as store:
        state = store.load_bootstrap_state("demo")
        messages = store.load_transcript_messages("demo")
        events = list(store.read_events("demo"))
    # none of this is in the file: the script drew it from the embedded data
    for drawn in ('id="chart"', 'class="passing"', "data-feature=", "<tr data-seq="):
        assert drawn not in static and drawn in dom, drawn

    # the chart: a step line with one step per feature change, a marker per flip
    chart = block(dom, '<svg class="chart" id="chart"', "</svg>")
    passing = re.search(r'<path d="([^"]+)"[^>]*class="passing"', chart)
    assert passing is not None
    flips = [ev for ev in events if type(ev).__name__ == "FeaturePassUpdated"]
    assert passing.group(1).count("V") == len(flips)  # the first list, then one per update
    up = re.search(r'<path d="([^"]*)"[^>]*class="flip-up"', chart)
    assert up is not None and up.group(1).count("M") == len(flips) == 8
    n_pass = sum(f.passes for f in state.feature_list)
    assert f"{n_pass} of {len(state.feature_list)} features pass" in dom

    # the failing features, by id
    failing = block(dom, 'id="failing"', "</ul>")
    expected = [f.id for f in state.feature_list if not f.passes]
    assert re.findall(r'data-feature="([^"]+)"', failing) == expected

    # runs with their status and notes
    runs = block(dom, '<ol class="runs">', "</ol>")
    assert runs.count('class="s-succeeded"') == 2
    for entry in state.recent_progress:
        assert html.escape(entry.summary, quote=False) in runs

    # the messages of the first page, in order, with their roles
    shown = block(dom, '<ol class="messages" id="messages">', "</ol>")
    assert shown.count("<li ") == len(messages) == 22
    at = 0
    for m in messages:  # each in turn, after the one before
        at = shown.index(html.escape(m.content, quote=False), at) + 1
    assert shown.count('<details class="tool">') == sum(m.role.value == "tool" for m in messages)

    # the event table: every event (fewer than a page), the type filters
    table = block(dom, 'id="event-table"', "</table>")
    assert [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', table)] == [e.seq for e in events]
    assert 'data-key="feature_pass_updated"' in dom


def test_hostile_text_stays_text_in_the_browser(chromium: str, tmp_path: Path) -> None:
    with SessionStore(tmp_path / "store") as store:
        for i, text in enumerate(HOSTILE):
            write_hostile(store, f"evil-{i}", text)
            (tmp_path / f"evil-{i}.html").write_text(
                build_report(store, f"evil-{i}", generated_at=T0), encoding="utf-8"
            )
    for i, text in enumerate(HOSTILE):
        dom = dump_dom(chromium, tmp_path / f"evil-{i}.html", tmp_path)
        probe_is_clean(dom)
        body = dom[dom.index('<main id="app">') :]
        # text is serialized with < escaped: any "<img" here would be an element
        for element in ("<img", "<svg onload", "<script>alert", "<style"):
            assert element not in body, element
        assert html.escape(text, quote=False) in body  # drawn, as text


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_a_screenshot_shows_the_page(
    chromium: str, demo_page: tuple[Path, Path], tmp_path: Path
) -> None:
    _, page = demo_page
    shot = tmp_path / "report.png"
    done = run_chromium(
        chromium, tmp_path, f"--screenshot={shot}", "--window-size=1200,1800", page.as_uri()
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert png_size(shot) == (1200, 1800)
    # a drawn page: text, a chart and badges compress far worse than an empty one
    blank = tmp_path / "blank.html"
    blank.write_text("<!doctype html><title>blank</title>")
    empty = tmp_path / "blank.png"
    run_chromium(
        chromium, tmp_path, f"--screenshot={empty}", "--window-size=1200,1800", blank.as_uri()
    )
    assert shot.stat().st_size > 20 * empty.stat().st_size
    assert shot.stat().st_size > 50_000


def test_ten_thousand_turns_render(chromium: str, long_session: Path, tmp_path: Path) -> None:  # noqa: F811
    page = tmp_path / "long.html"
    assert main(["report", str(long_session), "long", "-o", str(page)]) == 0
    t = time.perf_counter()
    dom = dump_dom(chromium, page, tmp_path)
    seconds = time.perf_counter() - t
    probe_is_clean(dom)
    render_ms = int(re.search(r'data-render-ms="(\d+)"', dom).group(1))  # type: ignore[union-attr]
    size = page.stat().st_size
    print(f"10,000 turns: {size:,} bytes; script {render_ms} ms; browser run {seconds:.1f} s")
    assert "Messages 1–50 of 30,000" in dom
    shown = block(dom, '<ol class="messages" id="messages">', "</ol>")
    assert shown.count("<li ") == 50
    assert "turn 0: next step please" in shown and "turn 17:" not in shown
    assert len(re.findall(r"<tr data-seq=", block(dom, 'id="event-table"', "</table>"))) == 100


# -- the DevTools protocol: interaction, console and network -------------------------------


class DevTools:
    """A DevTools protocol client over `--remote-debugging-pipe` (NUL-separated JSON on
    the browser's fds 3 and 4): enough to open a page, run script in it and collect its
    console messages, exceptions and network requests."""

    def __init__(self, chromium: str, tmp: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # in the child: the pipe ends become fds 3 and 4
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen(
            [
                chromium,
                *FLAGS,
                f"--user-data-dir={tmp / 'devtools-profile'}",
                "--remote-debugging-pipe",
                "--window-size=1200,1800",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,
            pass_fds=(3, 4),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []
        self.session = ""

    def close(self) -> None:
        try:  # politely first: the browser takes its helper processes down with it
            self.send("Browser.close", timeout=10)
        except (OSError, RuntimeError, TimeoutError, EOFError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        os.close(self._to_browser)
        os.close(self._from_browser)

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError("the browser did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise EOFError("the browser closed its pipe")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\0", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def send(self, method: str, timeout: float = 60, **params: Any) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})  # type: ignore[no-any-return]
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            ev = self._read(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def open(self, url: str) -> None:
        targets = self.send("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", targetId=page["targetId"], flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.events.clear()
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def eval(self, expression: str) -> Any:
        """The value of the script `expression` in the page (its last statement's, awaited
        if a promise). Run as a block: its declarations do not outlive it."""
        result = self.send(
            "Runtime.evaluate",
            expression="{" + expression + "}",
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def problems(self) -> list[dict[str, Any]]:
        """Exceptions, console errors and warnings, and browser log errors so far."""
        serious = ("error", "warning")
        bad = []
        for ev in self.events:
            method, p = ev.get("method"), ev.get("params", {})
            if (
                method == "Runtime.exceptionThrown"
                or (method == "Runtime.consoleAPICalled" and p.get("type") in serious)
                or (method == "Log.entryAdded" and p["entry"]["level"] in serious)
            ):
                bad.append(ev)
        return bad

    def requests(self) -> list[str]:
        return [
            ev["params"]["request"]["url"]
            for ev in self.events
            if ev.get("method") == "Network.requestWillBeSent"
        ]


@pytest.fixture
def devtools(chromium: str, tmp_path: Path) -> Iterator[DevTools]:
    tools = DevTools(chromium, tmp_path)
    try:
        yield tools
    finally:
        tools.close()


SETTLE = "new Promise(r => setTimeout(r, 400))"  # longer than the filter box's 150 ms pause


def test_no_error_and_no_request_but_the_page(
    devtools: DevTools, demo_page: tuple[Path, Path]
) -> None:
    _, page = demo_page
    devtools.open(page.as_uri())
    assert devtools.eval("document.body.dataset.rendered") == "ok"
    assert devtools.eval("document.getElementById('js-errors').textContent") == ""
    assert devtools.problems() == []
    assert devtools.requests() == [page.as_uri()]


def test_print_hides_the_controls(devtools: DevTools, demo_page: tuple[Path, Path]) -> None:
    _, page = demo_page
    devtools.open(page.as_uri())
    display = (
        "[...document.querySelectorAll('.controls, .pager, #js-errors, button')]"
        ".map(e => getComputedStyle(e).display)"
    )
    assert "none" not in devtools.eval(display.replace("#js-errors, ", ""))
    devtools.send("Emulation.setEmulatedMedia", media="print")
    shown = devtools.eval(display)
    assert len(shown) > 5 and set(shown) == {"none"}
    assert devtools.eval("getComputedStyle(document.getElementById('chart')).display") == "block"


def test_filters_and_pages_work(devtools: DevTools, long_session: Path, tmp_path: Path) -> None:  # noqa: F811
    page = tmp_path / "long.html"
    assert main(["report", str(long_session), "long", "-o", str(page)]) == 0
    devtools.open(page.as_uri())
    count = "document.getElementById('msg-count').textContent"
    first = "document.querySelector('#messages > li strong').textContent"
    assert devtools.eval(count) == "Messages 1–50 of 30,000"

    # the pager: next page starts at #51
    devtools.eval("document.querySelector('#transcript .pager button:nth-of-type(3)').click()")
    assert devtools.eval(first) == "#51"

    # the filter box: text in a message, case-insensitive; the page goes back to the first
    devtools.eval(
        "const f = document.getElementById('msg-filter');"
        "f.value = 'TURN 9999:'; f.dispatchEvent(new Event('input'));" + SETTLE
    )
    assert devtools.eval(count) == "Messages 1–1 of 1 matching (30,000 in all)"
    assert devtools.eval(first) == "#29,998"

    # a role unchecked hides its messages
    devtools.eval(
        "const f = document.getElementById('msg-filter');"
        "f.value = ''; f.dispatchEvent(new Event('input'));" + SETTLE
    )
    devtools.eval("document.querySelector('#transcript input[data-key=tool]').click()")
    assert devtools.eval(count) == "Messages 1–50 of 20,000 matching (30,000 in all)"
    assert devtools.eval("document.querySelectorAll('#messages li.r-tool').length") == 0

    # the event table: only the checked types
    devtools.eval("document.querySelector('#events input[data-key=messages_appended]').click()")
    types = devtools.eval(
        "[...document.querySelectorAll('#event-table tbody tr td:nth-child(3)')]"
        ".map(td => td.textContent)"
    )
    assert types and "messages_appended" not in types
    assert devtools.problems() == []
    assert devtools.requests() == [page.as_uri()]


def test_long_messages_fold_and_tool_results_collapse(devtools: DevTools, tmp_path: Path) -> None:
    long_text = "\n".join(f"line {i}: " + "words " * 20 for i in range(60))
    with SessionStore(tmp_path / "store") as store:
        write_session(store)
        store.append_transcript_messages("s1", [Message(role=Role.ASSISTANT, content=long_text)])
        page = tmp_path / "s1.html"
        page.write_text(build_report(store, "s1"), encoding="utf-8")
    devtools.open(page.as_uri())
    state = devtools.eval(
        "const b = document.querySelector('#messages .folded button');"
        "const pre = b.previousElementSibling; const before = pre.textContent;"
        "const label = b.textContent; b.click();"
        "[before.length, pre.textContent, b.getAttribute('aria-expanded'), label]"
    )
    assert state[0] < 1300 and state[1] == long_text and state[2] == "true"
    assert state[3] == f"Show all ({len(long_text):,} characters)"
    # a tool result is closed until opened
    assert devtools.eval("document.querySelector('#messages details.tool').open") is False
    assert (
        devtools.eval("document.querySelector('#messages details.tool pre').textContent")
        == "$ pytest\n3 passed"
    )
    assert devtools.problems() == []


def test_the_probe_reports_a_broken_page(
    chromium: str, demo_page: tuple[Path, Path], tmp_path: Path
) -> None:
    """The clean probe the other tests ask for means something: a page whose script
    fails shows the error in #js-errors and is never marked rendered."""
    _, page = demo_page
    broken = tmp_path / "broken.html"
    text = page.read_text(encoding="utf-8")
    broken.write_text(text.replace('id="report-data">{', 'id="report-data">{oops', 1))
    done = run_chromium(chromium, tmp_path, "--dump-dom", broken.as_uri())
    dom = done.stdout
    assert 'data-rendered="ok"' not in dom
    errors = block(dom, '<pre id="js-errors"', "</pre>")
    assert "hidden" not in errors and "SyntaxError" in errors
    assert any(":CONSOLE" in line for line in done.stderr.splitlines())


def test_sparse_and_compacted_sessions_draw(chromium: str, tmp_path: Path) -> None:
    """A session with only a transcript (no manifest, features or runs), and one whose
    early history was compacted away, draw without an error."""
    with SessionStore(tmp_path / "store") as store:
        store.append_transcript_messages("bare", [Message(role=Role.USER, content="hello")])
        write_session(store, "cut")
        store.compact("cut", archive=False)
        store.update_feature_pass("cut", "feat-004", True)
        for sid in ("bare", "cut"):
            (tmp_path / f"{sid}.html").write_text(build_report(store, sid), encoding="utf-8")
    bare = dump_dom(chromium, tmp_path / "bare.html", tmp_path)
    probe_is_clean(bare)
    assert "(no manifest)" in bare and "No feature list yet" in bare
    assert "No run checkpoints or progress notes." in bare and ">hello</pre>" in bare
    cut = dump_dom(chromium, tmp_path / "cut.html", tmp_path)
    probe_is_clean(cut)
    assert "<code>snapshot</code>" in cut and "events compacted without an archive" in cut
    assert "2 of 5 features pass" in cut


def test_tool_calls_and_other_fields_collapse(
    devtools: DevTools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(tmp_path / "store") as store:
        write_session(store)
        monkeypatch.setattr(store, "load_transcript_messages", lambda sid: wide_messages())
        page = tmp_path / "wide.html"
        page.write_text(build_report(store, "s1"), encoding="utf-8")
    devtools.open(page.as_uri())
    boxes = devtools.eval(
        "[...document.querySelectorAll('#messages details.extra')]"
        ".map(d => [d.querySelector('summary').textContent, d.open])"
    )
    assert boxes == [
        ["tool calls", False],
        ["name", False],
        ["metadata", False],
        ["thinking", False],
        ["tool use: Bash", False],
        ["tool result (error)", False],
        ["image", False],
    ]
    # the filter box searches inside them too
    devtools.eval(
        "const f = document.getElementById('msg-filter');"
        "f.value = 'LS -LA'; f.dispatchEvent(new Event('input'));" + SETTLE
    )
    assert devtools.eval("document.getElementById('msg-count').textContent") == (
        "Messages 1–1 of 1 matching (3 in all)"
    )
    assert devtools.problems() == []


def test_an_unreadable_log_draws_what_verify_found(chromium: str, tmp_path: Path) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_transcript_messages("bad", [Message(role=Role.USER, content="a")] * 3)
        store.append_transcript_messages("bad", [Message(role=Role.USER, content="b")])
    log = log_path(root, "bad")
    lines = log.read_bytes().split(b"\n")
    # a line overwritten with garbage (zeros there would read as a torn last batch)
    lines[0] = b"#" * len(lines[0])
    log.write_bytes(b"\n".join(lines))
    with SessionStore(root) as store:
        (tmp_path / "bad.html").write_text(build_report(store, "bad"), encoding="utf-8")
    dom = dump_dom(chromium, tmp_path / "bad.html", tmp_path)
    probe_is_clean(dom)
    alert = block(dom, '<p class="alert" id="unreadable">', "</p>")
    assert "only what verify found is shown" in alert and "byte" in alert
    assert '<span class="badge b-bad">FAILED</span>' in dom
    assert "Transcript (0 messages)" in dom


def test_verify_errors_show_and_warnings_fold(chromium: str, tmp_path: Path) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        write_session(store, "tampered")
        write_session(store, "torn")
    tampered, torn = log_path(root, "tampered"), log_path(root, "torn")
    tampered.write_bytes(tampered.read_bytes().replace(b"plan written", b"plan WRITTEN"))
    with open(torn, "ab") as f:
        f.write(b'{"type":"progress_appended","seq":99')
    with SessionStore(root) as store:
        for sid in ("tampered", "torn"):
            (tmp_path / f"{sid}.html").write_text(build_report(store, sid), encoding="utf-8")
    dom = dump_dom(chromium, tmp_path / "tampered.html", tmp_path)
    probe_is_clean(dom)
    assert '<span class="badge b-bad">FAILED</span>' in dom
    assert "hash" in block(dom, '<ul id="problems">', "</ul>")
    dom = dump_dom(chromium, tmp_path / "torn.html", tmp_path)
    probe_is_clean(dom)
    assert '<span class="badge b-ok">verified</span> no errors, 1 warning' in dom
    assert 'id="problems"' not in dom
    assert "<details><summary>Verify warnings (1)</summary>" in dom


# -- attacks -------------------------------------------------------------------------------


PAYLOAD = (
    "</script><script>document.title='PWNED-1'</script>"
    "<img src=x onerror=\"document.title='PWNED-2'\">"
    "<svg onload=\"document.title='PWNED-3'\"></svg>"
    "--><!--<script>document.title='PWNED-4'</script>"
    "{{constructor.constructor('document.title=\"PWNED-5\"')()}}"
    " javascript:document.title='PWNED-6' \u2028\u2029 ]]> \\u003c/script>"
)


class HostileEvent(Event, tag="hostile</script><img src=x onerror=alert(1)>", kw_only=True):
    payload: str


def test_hostile_text_in_every_field_never_runs_in_chromium(
    chromium: str,
    tmp_path: Path,
) -> None:
    p = PAYLOAD
    sid = "sid" + p  # a session id may hold any of it (no NUL)
    root = tmp_path / "store"
    with SessionStore(root, event_types=[HostileEvent]) as store:
        store.initialize_session_if_missing(
            sid,
            SessionManifest(
                session_id=sid,
                active_branch=p,
                current_objective=p + "\x00",
                last_known_good_commit=p,
                harness_version=p,
                metadata={p: p, "__proto__": p, "constructor": p},
            ),
            [FeatureRecord(id=p, category=p, description=p, steps=[p], passes=False)],
            initial_progress_entry=ProgressEntry(run_id=p, summary=p, created_at=T0),
            initial_checkpoint=RunCheckpoint(run_id=p, started_at=T0, note=p),
        )
        store.update_feature_pass(sid, p, True)
        store.append_transcript_messages(
            sid,
            [
                Message(Role.USER, p + "\x00", name=p, metadata={p: p, "__proto__": {p: [p]}}),
                Message(
                    Role.ASSISTANT,
                    p,
                    blocks=[
                        TextBlock(text=p + " more"),
                        ThinkingBlock(thinking=p, signature=p),
                        ToolUseBlock(id=p, name=p, input={p: p, "__proto__": {"x": p}}),
                        ImageBlock(source="javascript:document.title='PWNED-7'", media_type=p),
                    ],
                ),
                Message(
                    Role.TOOL,
                    p,
                    name=p,
                    blocks=[ToolResultBlock(tool_use_id=p, content=p, is_error=True)],
                ),
            ],
        )
        store.append(sid, [HostileEvent(payload=p)])
    with SessionStore(root) as reader:  # the custom type is unknown to the report
        page = tmp_path / "evil.html"
        page.write_text(build_report(reader, sid, generated_at=T0), encoding="utf-8")
    dom = dump_dom(chromium, page, tmp_path)
    probe_is_clean(dom)  # no error, nothing blocked by the policy: nothing tried to run
    title = dom[dom.index("<title>") : dom.index("</title>")]
    # a payload that ran would have made the title "PWNED-n"
    assert title.startswith("<title>Session sid&lt;/script&gt;&lt;script&gt;document.title=")
    assert title.endswith("· eventstore report")
    body = dom[dom.index('<main id="app">') :]
    for element in ("<img", "<svg onload", "<script>document", "<iframe", 'href="javascript'):
        assert element not in body, element
    assert body.count("<script") == 2  # the data and the page's own script, nothing else
    assert "PWNED-7" in body and "hostile&lt;/script&gt;" in body  # shown as text

"""Every code block of README.md and docs/**/*.md runs, so the docs stay true.

Blocks are found by their fence and run one per test, each in a fresh empty directory
of its own (holding only a copy of `fixtures/`, which examples name) with a HOME of its
own: no block depends on another, and any block can be run again by itself. Test ids
name the page, the block's index on it and the line of its opening fence.

- `python` blocks run in a subprocess;
- `sh` blocks run each command (each `&&` segment) with the checkout's `eventstore`
  first on PATH;
- `console` blocks: `$ ` lines are commands and the lines after one are its output:
  each shown line's first word must match the real output's (times, hashes, sizes and
  durations are masked), and the exit status must be 0 unless the command ends with a
  comment `# exit N`.
- `json` blocks must parse (a log line shown must be one a fixture log holds), `toml`
  blocks must parse; blocks of other languages (sql, plain text) are not run.

The code run is the checkout's (PYTHONPATH is the repository root), as an editable
install of it has it. Nothing is skipped silently: the only commands not run are in SKIP
below, each with why; a block naming a `postgresql://` URL runs only when
EVENTSTORE_TEST_POSTGRES_URL is set (its URLs are replaced by that server's, in a schema
of the block's own), a block naming a `redis://` or `rediss://` URL only when
EVENTSTORE_TEST_REDIS_URL is set (its URLs are replaced by that server's, with a key
prefix of the block's own, keeping their other parameters), and a python block whose
imports are not installed (an optional extra) is skipped naming the missing module. With
CI=true none is skipped: they fail.

Beside the blocks: every `test_...` name the docs cite exists under tests/, README.md
stays short and opens with its two commands, every relative link points to a file (and
heading) that exists, and every install hint works from a checkout.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
BIN = Path(sys.executable).parent
PG_ENV = "EVENTSTORE_TEST_POSTGRES_URL"
REDIS_ENV = "EVENTSTORE_TEST_REDIS_URL"
IN_CI = os.environ.get("CI") == "true"

DEMO_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/eventstore demo"
    " && .venv/bin/eventstore log .eventstore demo"
)
TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'"
    " && .venv/bin/python -m pytest -q"
)
README_MAX_LINES = 300

# Commands (or `&&` segments of a command) that are not run, and why. A prefix match.
SKIP: dict[str, str] = {
    "python3 -m venv": "creates the virtual environment this test already runs in",
    ".venv/bin/pip install": "installs what this test already runs with",
    "pip install": "installs what this test already runs with",
    ".venv/bin/python -m pytest": "the test suite itself",
    "python -m pytest": "the test suite itself",
    "export EVENTSTORE_TEST_POSTGRES_URL": "points the test suite at a server (set by .ci/run)",
    ". .ci/start-postgres.sh": "starts a PostgreSQL server (as .ci/run does)",
    ". .ci/start-redis.sh": "starts a Redis server (as .ci/run does)",
    "export EVENTSTORE_TEST_REDIS_URL": "points the test suite at a server (set by .ci/run)",
    "EVENTSTORE_LONG=1": "the long test variants (minutes)",
    ".venv/bin/ruff": "development tooling, run by the development workflow",
    ".venv/bin/mypy": "development tooling, run by the development workflow",
    "eventstore follow": "runs until stopped; tested by the CLI's own tests",
    "eventstore serve": "serves until stopped; tested by the report server's own tests",
    "python -m bench": "minutes of benchmarks; the bench's --check mode has its own test",
    "sudo ": "installs system packages on the reader's machine",
    "chromium ": "needs a browser; the report's browser tests run it",
}


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str  # the page's path relative to the repository root
    index: int  # its 0-based index among the page's blocks
    lang: str
    text: str
    line: int  # 1-based line of the opening fence

    @property
    def id(self) -> str:
        return f"{self.page}:{self.index}:L{self.line}:{self.lang or 'plain'}"


def pages() -> list[Path]:
    """README.md and every page under docs/, in a stable order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block of the page, in order."""
    blocks: list[Block] = []
    lang: str | None = None
    start = 0
    body: list[str] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.match(r"^\s*```(\S*)\s*$", line)
        if lang is None and fence:
            lang, start, body = fence[1], n, []
        elif lang is not None and re.match(r"^\s*```\s*$", line):
            blocks.append(Block(_rel(path), len(blocks), lang, "\n".join(body) + "\n", start))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"{_rel(path)}:{start}: an unclosed code block"
    return blocks


BLOCKS = [b for p in pages() for b in blocks_of(p)]
RUN = [b for b in BLOCKS if b.lang in ("python", "sh", "console")]


def skipped(command: str) -> str | None:
    """Why `command` is not run, or None."""
    for prefix, why in SKIP.items():
        if command.startswith(prefix):
            return why
    return None


def _skip(reason: str) -> None:
    """Skip, except in CI, where nothing the docs show may go untested."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: not skipped)")
    pytest.skip(reason)


def _workdir(tmp_path: Path) -> Path:
    """A fresh directory for one block, with a copy of fixtures/ (examples name it)."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(REPO / "fixtures", work / "fixtures")
    return work


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(home),
        COLUMNS="120",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(REPO),  # the checkout's code, as its editable install has it
    )
    return env


def _needs_extras(block: Block) -> None:
    """Skip a python block whose imports are not installed here (an optional extra)."""
    try:
        tree = ast.parse(block.text)
    except SyntaxError:
        return  # the run reports it
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for name in names:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                _skip(f"{block.id} needs an optional dependency: {exc}")


_PG_URL = re.compile(r"postgres(ql)?://[^\s\"')]+")


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A schema name of the block's own on the test server, dropped afterwards."""
    schema = f"docs_{uuid.uuid4().hex[:12]}"
    yield schema
    url = os.environ.get(PG_ENV)
    if not url:
        return
    try:
        import psycopg
    except ImportError:
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _postgres(block: Block, schema: str) -> Block:
    """The block with its PostgreSQL URLs pointing at the test server, in `schema`."""
    if not _PG_URL.search(block.text):
        return block
    url = os.environ.get(PG_ENV)
    if not url:
        _skip(f"{block.id} needs PostgreSQL: set {PG_ENV}")
        return block  # (not reached)
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"] + [("schema", schema)]
    test_url = urlunsplit(parts._replace(query=urlencode(query)))
    text = _PG_URL.sub(lambda _: test_url, block.text)
    return Block(block.page, block.index, block.lang, text, block.line)


_REDIS_URL = re.compile(r"rediss?://[^\s\"')]+")


def _redis(block: Block) -> Block:
    """The block with its Redis URLs pointing at the test server, under a key prefix of
    the block's own (each URL's other parameters kept: `ttl`, `feed`...)."""
    if not _REDIS_URL.search(block.text):
        return block
    url = os.environ.get(REDIS_ENV)
    if not url:
        _skip(f"{block.id} needs Redis: set {REDIS_ENV}")
        return block  # (not reached)
    prefix = f"docs{uuid.uuid4().hex[:12]}"
    server = urlsplit(url)

    def replace(m: re.Match[str]) -> str:
        shown = urlsplit(m.group(0))
        kept = [(k, v) for k, v in parse_qsl(shown.query) if k not in ("prefix", "password")]
        query = [(k, v) for k, v in parse_qsl(server.query) if k != "prefix"]
        return urlunsplit(server._replace(query=urlencode([*query, *kept, ("prefix", prefix)])))

    text = _REDIS_URL.sub(replace, block.text)
    return Block(block.page, block.index, block.lang, text, block.line)


def _shell(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # the docs' `.venv/bin/eventstore` is the one on PATH
    command = re.sub(r"(^|[\s;&|(])\.venv/bin/", r"\1", command)
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


_MASKS = [
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?Z?"), "<time>"),
    (re.compile(r"\d{8}T\d{6}\d*Z"), "<stamp>"),
    (re.compile(r"\b[0-9a-f]{16}\b"), "<hash>"),
    (re.compile(r"\b\d+(\.\d+)? (B|kB|MB|GB)\b"), "<size>"),
    (re.compile(r"\b\d+\.\d+ s\b"), "<secs>"),
]


def _first_word(line: str) -> str:
    for pattern, mask in _MASKS:
        line = pattern.sub(mask, line)
    words = line.split()
    return words[0] if words else ""


def _check_output(block: Block, command: str, shown: list[str], actual: str) -> None:
    shown = [s for s in shown if s.strip() and s.strip() not in ("...", "…")]
    if not shown:
        return
    got = [a for a in actual.splitlines() if a.strip()]
    assert len(got) >= len(shown), (block.id, command, shown, got)
    for want, have in zip(shown, got, strict=False):
        assert _first_word(want) == _first_word(have), (block.id, command, want, have)


def _expected_status(command: str) -> int:
    m = re.search(r"#\s*exit (\d+)", command)
    return int(m[1]) if m else 0


def _run_python(block: Block, cwd: Path, env: dict[str, str]) -> None:
    _needs_extras(block)
    script = cwd.parent / f"block_{block.index}.py"
    script.write_text(block.text, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, (block.id, proc.stdout, proc.stderr)


def _run_sh(block: Block, cwd: Path, env: dict[str, str]) -> int:
    ran = 0
    for line in block.text.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        for segment in (s.strip() for s in line.split("&&")):
            if skipped(segment):
                continue
            proc = _shell(segment, cwd, env)
            assert proc.returncode == 0, (block.id, segment, proc.stdout, proc.stderr)
            assert "Traceback" not in proc.stderr, (block.id, segment, proc.stderr)
            ran += 1
    return ran


def _run_console(block: Block, cwd: Path, env: dict[str, str]) -> int:
    commands: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands:
            commands[-1][1].append(line)
    assert commands, f"{block.id}: a console block without a `$ ` command"
    ran = 0
    for command, shown in commands:
        if skipped(command):
            continue
        proc = _shell(command, cwd, env)
        want = _expected_status(command)
        assert proc.returncode == want, (block.id, command, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, (block.id, command, proc.stderr)
        _check_output(block, command, shown, proc.stdout)
        ran += 1
    return ran


@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_doc_block(block: Block, tmp_path: Path, pg_schema: str) -> None:
    block = _redis(_postgres(block, pg_schema))
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)
    cwd = _workdir(tmp_path)
    if block.lang == "python":
        _run_python(block, cwd, env)
        return
    ran = _run_sh(block, cwd, env) if block.lang == "sh" else _run_console(block, cwd, env)
    if not ran:
        pytest.skip(f"{block.id}: every command is in SKIP")


DATA = [b for b in BLOCKS if b.lang in ("json", "toml")]


@pytest.mark.parametrize("block", DATA, ids=[b.id for b in DATA])
def test_doc_data_block(block: Block) -> None:
    """A `json` block is JSON (one document per line); a log line shown is one that a
    fixture log really holds, byte for byte, so its hash is real. A `toml` block parses."""
    if block.lang == "toml":
        tomllib.loads(block.text)
        return
    lines = [line for line in block.text.splitlines() if line.strip()]
    for line in lines:
        doc = json.loads(line)
        if isinstance(doc, dict) and {"type", "seq", "h"} <= doc.keys():
            held = (p.read_text(encoding="utf-8") for p in (REPO / "fixtures").rglob("*.jsonl"))
            assert any(line + "\n" in text for text in held), (block.id, line)


def test_every_page_has_a_block_that_runs_or_says_why_not() -> None:
    """A docs page of examples with none that runs would go stale unseen."""
    langs = {b.lang for b in RUN}
    assert {"python", "sh", "console"} <= langs
    assert len([b for b in RUN if b.lang == "python"]) >= 15


def test_the_readme_is_short_and_opens_with_its_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    first, second = (b for b in blocks_of(README)[:2])
    assert (first.lang, first.text.strip()) == ("sh", DEMO_COMMAND)
    assert (second.lang, second.text.strip()) == ("sh", TEST_COMMAND)
    # and no other block comes before them
    assert first.index == 0 and second.index == 1
    ci = REPO / ".ci" / "run"
    if ci.exists():  # .ci/run runs the README's test command verbatim
        assert TEST_COMMAND in ci.read_text(encoding="utf-8").splitlines()


def test_the_demo_command_prints_the_state_once(tmp_path: Path) -> None:
    """The README's first command, past its install steps, shows the state one time."""
    segments = [s.strip() for s in DEMO_COMMAND.split("&&")]
    run = [s for s in segments if not skipped(s)]
    assert run and all("eventstore" in s for s in run)
    out = _shell(" && ".join(run), tmp_path, _env(tmp_path)).stdout
    assert out.count("features: 4/20 passing") == 1


_CITED = re.compile(r"`(test_[A-Za-z0-9_]+)`")


def _defined_tests() -> set[str]:
    """The test functions under tests/ and of the conformance suite the package ships
    (`eventstore.engines.conformance`, which tests/ runs on every engine)."""
    names: set[str] = set()
    shipped = [REPO / "eventstore" / "engines" / "conformance.py"]
    for path in [*(REPO / "tests").rglob("*.py"), *shipped]:
        text = path.read_text(encoding="utf-8")
        names.update(re.findall(r"^\s*(?:async\s+)?def (test_\w+)\s*\(", text, re.M))
    return names


def test_every_cited_test_exists() -> None:
    """Each `test_...` name the docs cite (the guarantees name their attacks) is a test
    function somewhere under tests/ or in the shipped conformance suite."""
    defined = _defined_tests()
    cited = {
        (_rel(p), name) for p in pages() for name in _CITED.findall(p.read_text(encoding="utf-8"))
    }
    guarantees = DOCS / "guarantees.md"
    assert any(page == _rel(guarantees) for page, _ in cited), "guarantees.md cites no test"
    missing = sorted((page, name) for page, name in cited if name not in defined)
    assert not missing, f"cited but defined neither under tests/ nor shipped: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped,
    spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    in_block = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\s*```", line):
            in_block = not in_block
        elif not in_block and (m := re.match(r"^#{1,6}\s+(.*)$", line)):
            anchors.add(_slug(m[1]))
    return anchors


_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(path: Path) -> str:
    """The page without its code blocks (a link in a block is code, not a link)."""
    return re.sub(r"^\s*```.*?^\s*```\s*$", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)


def test_every_relative_link_points_to_something_that_exists() -> None:
    broken: list[str] = []
    for page in pages():
        for target in _LINK.findall(_prose(page)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{_rel(page)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{_rel(page)}: {target} (no such heading)")
    assert not broken, broken


def test_every_install_hint_works_from_a_checkout() -> None:
    """The project is not on PyPI: an install line names the checkout (`.`, with its
    extras), never a distribution to download."""
    bad: list[str] = []
    for page in pages():
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"pip install ((?:-[a-zA-Z]+ )*)(['\"]?)([^\s'\"`]+)\2", line):
                if not re.fullmatch(r"\.(\[[a-z0-9,-]+\])?", m[3]):
                    bad.append(f"{_rel(page)}:{n}: {line.strip()}")
            if re.search(r"(?<![\w-])eventstore\[", line):
                bad.append(f"{_rel(page)}:{n}: names the extra of `eventstore`: {line.strip()}")
    assert not bad, bad

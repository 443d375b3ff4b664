"""Every code block of README.md runs, so the README stays true.

Blocks are found by their fence: `python` blocks each run in a subprocess in a fresh
empty directory; `sh` and `console` blocks run their commands with the installed
`eventstore` first on PATH, each block in a fresh directory holding a copy of
`fixtures/`. All blocks share one HOME and run in README order, like a reader following
along (a map written to `~/.murmur/contexts` by one block is listed by the next).

In a `console` block, `$ ` lines are commands and the lines after one are its output:
each shown line's first word must match the real output's (times, hashes, sizes and
durations are masked), and the exit status must be 0 unless the command ends with a
comment `# exit N`. Blocks of other languages (json, toml, plain) are not run.

Nothing is skipped silently: the only things not run are in SKIP below, each with why;
a `python` block whose imports are not installed (an optional extra) is skipped naming
the missing module; a block naming a `postgresql://` URL runs only when
EVENTSTORE_TEST_POSTGRES_URL is set (its URLs are replaced by that one).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
BIN = Path(sys.executable).parent
PG_ENV = "EVENTSTORE_TEST_POSTGRES_URL"

# Commands (or `&&` segments of a command) that are not run, and why. A prefix match.
SKIP: dict[str, str] = {
    "python3 -m venv": "creates the virtual environment this test already runs in",
    ".venv/bin/pip install": "installs what this test already runs with",
    "pip install": "installs what this test already runs with",
    ".venv/bin/python -m pytest": "the test suite itself",
    "export EVENTSTORE_TEST_POSTGRES_URL": "points the test suite at a server (set by .ci/run)",
    "EVENTSTORE_LONG=1": "the long test variants (minutes)",
    ".venv/bin/ruff": "development tooling, run by the development workflow",
    ".venv/bin/mypy": "development tooling, run by the development workflow",
    "eventstore follow": "runs until stopped; tested in tests/test_cli_refusals.py",
    "python -m bench": "minutes of benchmarks; tested in tests/test_bench_check.py",
    "sudo ": "installs system packages on the reader's machine",
}


@dataclass
class Block:
    """One fenced code block of the README."""

    lang: str
    text: str
    line: int  # 1-based line of the opening fence

    @property
    def id(self) -> str:
        return f"README.md:{self.line}:{self.lang or 'plain'}"


def readme_blocks() -> list[Block]:
    """Every fenced block of README.md, in order."""
    blocks: list[Block] = []
    lang: str | None = None
    start = 0
    body: list[str] = []
    for n, line in enumerate(README.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.match(r"^\s*```(\S*)\s*$", line)
        if lang is None and fence:
            lang, start, body = fence[1], n, []
        elif lang is not None and re.match(r"^\s*```\s*$", line):
            blocks.append(Block(lang, "\n".join(body) + "\n", start))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"README.md:{start}: an unclosed code block"
    return blocks


BLOCKS = readme_blocks()
RUN = [b for b in BLOCKS if b.lang in ("python", "sh", "console")]


def skipped(command: str) -> str | None:
    """Why `command` is not run, or None."""
    for prefix, why in SKIP.items():
        if command.startswith(prefix):
            return why
    return None


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reader's HOME, shared by the blocks in README order (`~/.murmur/...`)."""
    return tmp_path_factory.mktemp("home")


def _workdir(tmp_path: Path) -> Path:
    """A fresh directory for one block, with a copy of fixtures/ (examples name it)."""
    shutil.copytree(REPO / "fixtures", tmp_path / "fixtures")
    return tmp_path


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(home),
        COLUMNS="120",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PYTHONPATH", None)  # the installed package, as a reader has it
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
                pytest.skip(f"{block.id} needs an optional dependency: {exc}")


def _postgres(block: Block) -> Block:
    if "postgresql://" not in block.text and "postgres://" not in block.text:
        return block
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{block.id} needs PostgreSQL: set {PG_ENV}")
    text = re.sub(r"postgres(ql)?://[^\s\"')]+", url, block.text)
    return Block(block.lang, text, block.line)


def _shell(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # the README's `.venv/bin/eventstore` is the installed one on PATH
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


def test_the_readme_has_blocks_of_each_kind() -> None:
    langs = {b.lang for b in RUN}
    assert {"python", "sh", "console"} <= langs
    assert len([b for b in RUN if b.lang == "python"]) >= 5


@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_readme_block(block: Block, home: Path, tmp_path: Path) -> None:
    block = _postgres(block)
    env = _env(home)
    if block.lang == "python":
        _needs_extras(block)
        script = tmp_path / "block.py"
        script.write_text(block.text, encoding="utf-8")
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, (block.id, proc.stdout, proc.stderr)
        return
    cwd = _workdir(tmp_path)
    if block.lang == "sh":
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
        if not ran:
            pytest.skip(f"{block.id}: every command is in SKIP")
        return
    # console: `$ command`, then the output it shows
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
    if not ran:
        pytest.skip(f"{block.id}: every command is in SKIP")


def test_the_demo_command_prints_the_state_once(home: Path, tmp_path: Path) -> None:
    """The README's first command, past its install steps, shows the state one time."""
    first = next(b for b in BLOCKS if b.lang == "sh")
    segments = [s.strip() for s in first.text.strip().split("&&")]
    run = [s for s in segments if not skipped(s)]
    assert run and all("eventstore" in s for s in run)
    out = _shell(" && ".join(run), tmp_path, _env(home)).stdout
    assert out.count("features: 4/20 passing") == 1

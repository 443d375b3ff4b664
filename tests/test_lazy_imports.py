"""What `import eventstore` and the session API's hot use must NOT load (issue 14, item
3): the CLI, the audit tools, the harness map, the report, integrations, and portalocker
(whose `__about__` reads package metadata through `importlib.metadata`); nor (issue 34)
`logging` (the library's logger imports it when it first logs), `dataclasses` (the
library's records are msgspec Structs) and `tempfile`, each some milliseconds of a fresh
process's start. Checked in a fresh interpreter through `sys.modules`, never by timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

NEVER_ON_IMPORT = (
    "eventstore.cli.app",
    "eventstore.cli.contexts",
    "eventstore.cli.report",
    "eventstore.ops.audit",
    "eventstore.ops.verify",
    "eventstore.ops.repair",
    "eventstore.ops.follow",
    "eventstore.ops.export",
    "eventstore.ops.compaction",
    "eventstore.harness_sessions",
    "eventstore.report.page",
    "eventstore.report.server",
    "eventstore.ops.legacy",
    "eventstore.integrations",
    "portalocker",
    "importlib.metadata",
    "logging",
    "dataclasses",
    "tempfile",
)


def _loaded_after(code: str, tmp_path: Path) -> set[str]:
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))\n"
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,  # not the repository: nothing imported by accident from a cwd
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    return set(json.loads(run.stdout))


def _prefixed(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in names))


def test_import_eventstore_loads_nothing_heavy(tmp_path: Path) -> None:
    loaded = _loaded_after("import eventstore", tmp_path)
    assert _prefixed(loaded, NEVER_ON_IMPORT) == []
    # eventstore.moved: the finder of 0.1.0's module paths (standard library only)
    assert _prefixed(loaded, ("eventstore", "projections", "msgspec")) == [
        "eventstore",
        "eventstore.moved",
    ]


@pytest.mark.parametrize("engine", ["file", "memory"])
def test_the_session_api_loads_nothing_heavy(tmp_path: Path, engine: str) -> None:
    """Open a store, write, load both projections, close: still none of them."""
    url = repr(str(tmp_path / "store")) if engine == "file" else repr("memory://")
    loaded = _loaded_after(
        "from eventstore import SessionStore, SessionManifest, ProgressEntry, Message, Role\n"
        f"with SessionStore({url}) as s:\n"
        "    s.initialize_session_if_missing('s', SessionManifest(session_id='s',"
        " active_branch='m', current_objective='o'), [])\n"
        "    s.append_progress_entry('s', ProgressEntry(run_id='r', summary='x'))\n"
        "    s.append_transcript_messages('s', [Message(role=Role.USER, content='hi')])\n"
        "    assert s.load_bootstrap_state('s').manifest is not None\n"
        "    assert len(s.load_transcript_messages('s')) == 1\n",
        tmp_path,
    )
    assert _prefixed(loaded, NEVER_ON_IMPORT) == []


def test_the_lazy_names_still_resolve(tmp_path: Path) -> None:
    """The control: the names the module list above keeps off the import path load on use."""
    loaded = _loaded_after(
        "import eventstore\n"
        "eventstore.HarnessSessionMap, eventstore.VerifyReport, eventstore.RepairReport\n"
        "import eventstore.cli\n",
        tmp_path,
    )
    assert {"eventstore.harness_sessions", "eventstore.ops.verify", "eventstore.cli.app"} <= loaded


def test_the_library_logger_is_the_eventstore_logger_whenever_configured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`eventstore.logger.log` hands each call to `logging.getLogger("eventstore")`,
    whose level set after its first use still applies; its level constants are
    `logging`'s."""
    import logging

    from eventstore.logger import DEBUG, INFO, WARNING, log

    with caplog.at_level(logging.WARNING, logger="eventstore"):
        log.warning("first %s", 1)
    with caplog.at_level(logging.ERROR, logger="eventstore"):
        log.warning("second")
        log.log(WARNING, "third")
        assert not log.isEnabledFor(WARNING)
    with caplog.at_level(logging.DEBUG, logger="eventstore"):
        log.debug("fourth")
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("eventstore", "first 1"),
        ("eventstore", "fourth"),
    ]
    assert (DEBUG, INFO, WARNING) == (logging.DEBUG, logging.INFO, logging.WARNING)

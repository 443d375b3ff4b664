"""No import cycles: every public module imports alone, first, in a fresh interpreter
(`projections` before `eventstore`, which is how a user defining a projection starts),
and `import eventstore` loads none of the store until a name is used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _modules() -> list[str]:
    names = ["projections", "eventstore", "eventstore.engines"]
    for package in ("projections", "eventstore", "eventstore/engines"):
        for path in sorted((REPO / package).glob("*.py")):
            if path.stem not in ("__init__", "__main__"):
                names.append(f"{package.replace('/', '.')}.{path.stem}")
    return names


@pytest.mark.parametrize("module", _modules())
def test_module_imports_alone_in_a_fresh_interpreter(module: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr


def test_the_readme_projection_import_works_first() -> None:
    """`from projections import StructProjection` before anything else (it used to fail
    with a circular import when nothing had imported `eventstore` yet)."""
    code = (
        "from projections import StructProjection, Projection\n"
        "from eventstore import SessionStore, Event\n"
        "assert StructProjection and Projection and SessionStore and Event\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_import_eventstore_is_lazy() -> None:
    code = (
        "import sys, eventstore\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('eventstore.', 'projections')))\n"
        "assert loaded == ['eventstore.moved'], loaded\n"
        "eventstore.SessionStore\n"
        "assert 'eventstore.store' in sys.modules\n"
        "assert 'eventstore.cli.app' not in sys.modules\n"
        "assert 'eventstore.ops.audit' not in sys.modules\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_every_exported_name_resolves() -> None:
    import eventstore

    for name in eventstore.__all__:
        assert getattr(eventstore, name) is not None, name
    with pytest.raises(AttributeError):
        eventstore.no_such_name  # noqa: B018

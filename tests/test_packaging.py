"""How eventstore installs: its distribution name and license metadata, an editable install
that mypy can see through, and `python -m bench` from any directory."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution, distributions
from pathlib import Path

import pytest

import eventstore

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
DIST = PYPROJECT["project"]["name"]


def test_the_distribution_name_is_ours_and_the_import_name_is_eventstore() -> None:
    # `eventstore` on PyPI is an unrelated project: `pip install eventstore` installs that
    assert DIST == "harness-eventstore"
    assert {"eventstore*", "projections*"} <= set(
        PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    )
    assert PYPROJECT["project"]["scripts"] == {"eventstore": "eventstore.cli:main"}


def test_extras_refer_to_this_distribution_by_its_name() -> None:
    """An extra that pulls in other extras names this distribution; `eventstore[...]`
    would install the unrelated PyPI project of that name."""
    for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items():
        for req in reqs:
            name = req.split("[")[0].split(">")[0].split("=")[0].strip().lower()
            assert name != "eventstore", (extra, req)


def test_license_is_an_spdx_string_with_its_file() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "MIT"  # PEP 639; a table is deprecated by setuptools
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text


def test_the_version_has_one_source() -> None:
    assert "version" in PYPROJECT["project"]["dynamic"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "eventstore.__version__"
    try:
        assert distribution(DIST).version == eventstore.__version__
    except PackageNotFoundError:
        pytest.skip(f"{DIST} is not installed")


def _editable() -> bool:
    # the checkout's own .egg-info may be found first: look at every copy of the metadata
    for dist in distributions(name=DIST):
        raw = dist.read_text("direct_url.json")
        if raw and json.loads(raw).get("dir_info", {}).get("editable"):
            return True
    return False


@pytest.mark.skipif(not _editable(), reason="needs the editable install of the README")
def test_mypy_sees_an_editable_install(tmp_path: Path) -> None:
    """setuptools' default editable install is an import hook mypy cannot follow; ours is a
    path entry, so a user's code type-checks against eventstore from any directory."""
    pytest.importorskip("mypy")
    (tmp_path / "app.py").write_text(
        "from eventstore import SessionStore\n\n"
        "def last(store: SessionStore) -> str:\n"
        '    return store.last_seq("s")\n'
    )
    cmd = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "c"), "app.py"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert "import-not-found" not in proc.stdout, proc.stdout
    # eventstore's types were read: the wrong return type is found
    assert 'Incompatible return value type (got "int", expected "str")' in proc.stdout


@pytest.mark.skipif(not _editable(), reason="bench is not installed; run it from the checkout")
def test_python_m_bench_runs_from_any_directory(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--help"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m bench")

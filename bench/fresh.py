"""One measurement in a fresh interpreter: the benches that time a process's first call
(`bench.langgraph_cold`, `bench.langgraph_list`, `bench.agents_cold`) run themselves as
children and read back the JSON object a child prints last."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

__all__ = ["run_module"]


def run_module(module: str, *args: str) -> dict[str, Any]:
    """`python -m module *args` in a fresh interpreter; the JSON object of its last line
    of output (CalledProcessError if it failed)."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]

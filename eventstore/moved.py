"""The import paths of release 0.1.0's modules, kept: `import eventstore.events` (and the
others below) still works after the modules moved into packages per layer.

An old path names the module it moved to (the same module object, so patching one
patches the other), or, where one module became several, a thin module re-exporting each
one's public names. Installed on `sys.meta_path` by `import eventstore`; new code imports
the new paths.
"""

from __future__ import annotations

import importlib
import sys
import types
from importlib.machinery import ModuleSpec
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

__all__ = ["MOVED", "install"]

MOVED: dict[str, tuple[str, ...]] = {
    "eventstore.events": (
        "eventstore.format.events",
        "eventstore.format.codec",
        "eventstore.format.chain",
    ),
    "eventstore.log": ("eventstore.format.reader",),
    "eventstore.layout": ("eventstore.engines.file.layout",),
    "eventstore.history": ("eventstore.ops.history",),
    "eventstore.verify": ("eventstore.ops.verify",),
    "eventstore.compaction": ("eventstore.ops.compaction",),
    "eventstore.follow": ("eventstore.ops.follow",),
    "eventstore.transcript_pages": ("eventstore.ops.paging",),
    "eventstore.repair": ("eventstore.ops.repair",),
    "eventstore.export": ("eventstore.ops.export",),
    "eventstore.lifecycle": ("eventstore.ops.lifecycle",),
    "eventstore.migrate": ("eventstore.ops.migrate",),
    "eventstore.legacy": ("eventstore.ops.legacy",),
    "eventstore.audit": ("eventstore.ops.audit",),
    "eventstore.report_server": ("eventstore.report.server",),
    "eventstore.engines.postgres_url": ("eventstore.engines.postgres.url",),
    "eventstore.engines.postgres_schema": ("eventstore.engines.postgres.schema",),
    "eventstore.engines.file_journal": ("eventstore.engines.file.journal",),
}
"""Old module path -> the module(s) that now hold what it held."""


class _MovedModules:
    """A meta path finder and loader for the paths in MOVED (duck-typed: importing
    `importlib.abc` would cost every `import eventstore`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name not in MOVED:
            return None
        return ModuleSpec(name, cast("Loader", self))

    def create_module(self, spec: ModuleSpec) -> types.ModuleType:
        targets = [importlib.import_module(t) for t in MOVED[spec.name]]
        if len(targets) == 1:
            return targets[0]
        combined = types.ModuleType(spec.name, f"Moved: see {', '.join(MOVED[spec.name])}.")
        names: list[str] = []
        for module in targets:
            for name in getattr(module, "__all__", ()):
                setattr(combined, name, getattr(module, name))
                names.append(name)
        combined.__all__ = names  # type: ignore[attr-defined]
        return combined

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module is already made."""


_finder = _MovedModules()


def install() -> None:
    """Put the finder on `sys.meta_path` (once)."""
    if _finder not in sys.meta_path:
        sys.meta_path.append(_finder)

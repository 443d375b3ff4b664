"""The layers of the code, enforced: imports point one way, with no cycle and no reach
into another module's private names (docs/CONTRIBUTING.md, "Layout of the code").

Every import counts: at module level, inside functions, and under `TYPE_CHECKING`. A
module may import one in a lower layer, or one in its own layer that the table below lets
it (and no cycle may form among those).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("eventstore", "projections")

# (layer, prefix): a module is in the layer of the longest prefix naming it
LAYERS: list[tuple[int, str]] = [
    (0, "eventstore.records"),
    (0, "eventstore.errors"),
    (0, "eventstore.process"),
    (0, "eventstore.session_ids"),
    (0, "eventstore.entropy"),
    (0, "eventstore.logger"),
    (0, "eventstore.regular"),
    (0, "eventstore.signing"),
    (1, "eventstore.format"),
    (2, "projections"),
    (2, "eventstore.engines"),
    (3, "eventstore.core"),
    (4, "eventstore.ops"),
    (5, "eventstore"),  # the public API: eventstore/__init__, store, aio, harness_sessions
    (6, "eventstore.report"),
    (6, "eventstore.integrations"),
    (6, "eventstore.engines.conformance"),
    (7, "eventstore.cli"),
    (7, "eventstore.__main__"),
]


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    names: tuple[str, ...]
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            found[module_name(path)] = path
    return found


def layer_of(module: str) -> int:
    best = max(
        (p for p in LAYERS if module == p[1] or module.startswith(p[1] + ".")),
        key=lambda p: len(p[1]),
    )
    return best[0]


def edges(name: str, path: Path, known: dict[str, Path]) -> Iterator[Edge]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] not in PACKAGES:
                continue
            plain = []
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:  # `from package import module`
                    yield Edge(name, sub, (), node.lineno)
                else:
                    plain.append(alias.name)
            if plain or not node.names:
                yield Edge(name, target, tuple(plain), node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield Edge(name, alias.name, (), node.lineno)


def all_edges() -> list[Edge]:
    known = modules()
    return [e for name, path in known.items() for e in edges(name, path, known)]


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{e.source}:{e.line} imports {e.target} (layer {layer_of(e.target)} above"
        f" {layer_of(e.source)})"
        for e in all_edges()
        if layer_of(e.target) > layer_of(e.source)
    ]
    assert upward == []


def test_no_module_imports_another_modules_private_names() -> None:
    private = [
        f"{e.source}:{e.line} imports {n} from {e.target}"
        for e in all_edges()
        for n in e.names
        if n.startswith("_") and not n.startswith("__") and e.target != e.source
    ]
    assert private == []


def test_no_import_cycle_among_modules() -> None:
    graph: dict[str, set[str]] = {}
    known = modules()
    for e in all_edges():
        target = e.target
        while target not in known and "." in target:
            target = target.rsplit(".", 1)[0]
        # a package's __init__ importing its own modules is how a package re-exports
        if target != e.source and not target.startswith(e.source + "."):
            graph.setdefault(e.source, set()).add(target)
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_no_function_is_longer_than_100_lines() -> None:
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 100:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert long == []

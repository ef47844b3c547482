"""The tree is the design: imports only point down the layers of docs/design.md and the README.

Bugs this catches: a backend importing checkpoint code (which imports backends), a
registry importing `diagnose` for its verdicts, checkpoint code importing `train` for a
config: each made the layering a lie before issue 12 and each is one import line away.
Lazy imports inside functions count too: they are still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dalle_dist"
#: top to bottom; a module may import its own layer and the ones below it
LAYERS = ("selftest", "cli", "check", "doctor", "plan", "generate", "train", "checkpoint",
          "backends", "data", "model", "shared")
SHARED = {"config_base", "errors", "fileio"}


def _layer(module: str) -> str | None:
    """dalle_dist.backends.registry -> backends; dalle_dist.errors -> shared."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1].startswith("__"):
        return None  # the package itself (its __version__)
    return "shared" if parts[1] in SHARED else parts[1]


def _imports(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "dalle_dist":
                found += [(f"dalle_dist.{alias.name}", node.lineno) for alias in node.names]
            elif node.module.startswith("dalle_dist."):
                found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names
                      if alias.name.startswith("dalle_dist.")]
    return found


def test_imports_only_point_down() -> None:
    upward = []
    checked = 0
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC)
        if relative.parts[0] in ("__init__.py", "__main__.py"):
            continue  # the entry points sit above everything
        own = _layer("dalle_dist." + ".".join(relative.with_suffix("").parts))
        assert own in LAYERS, f"{relative}: a folder or module no layer names"
        for module, line in _imports(path):
            target = _layer(module)
            checked += 1
            if target is not None and LAYERS.index(target) < LAYERS.index(own):
                upward.append(f"{relative}:{line} ({own}) imports {module} ({target})")
    assert checked > 200
    assert not upward, "imports pointing up:\n" + "\n".join(upward)


# -- import circles -------------------------------------------------------------------


def _module_name(path: Path) -> str:
    """src/dalle_dist/backends/engine.py -> dalle_dist.backends.engine; a package's
    __init__.py is the package."""
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Each dalle_dist module -> the dalle_dist modules it imports, wherever the import
    stands (module level, inside a function, under TYPE_CHECKING). `from a.b import c`
    points at a.b.c when c is a module, else at a.b; relative imports are resolved."""
    paths = {_module_name(path): path for path in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {module: set() for module in paths}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    graph[module].add(target if target in paths else base)
            elif isinstance(node, ast.Import):
                graph[module].update(alias.name for alias in node.names)
        graph[module] &= paths.keys()  # torch, numpy, ...: not ours
        graph[module].discard(module)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module: each is a set of
    modules every one of which imports, through the others, every other."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for target in graph[todo.pop()] - seen:
                seen.add(target)
                todo.append(target)
        reach[start] = seen
    circles = {tuple(sorted({start} | {other for other in reach[start] if start in reach[other]}))
               for start in graph if start in reach[start]}
    return [list(circle) for circle in sorted(circles)]


def test_no_import_circles() -> None:
    """No two dalle_dist modules import each other, directly or through others.

    Every import counts, lazy ones inside functions and those under TYPE_CHECKING too: a
    lazy import still makes a module unreadable without the other, and a circle is what
    lets a layer's module reach back up through a neighbour. A circle that the layers
    allow (both ends in one folder: model/dalle.py building decoding.py's StaticDecoder
    while decoding.py named DALLE in its annotations) is broken with a Protocol for what
    one side needs, not with a lazy import.

    One edge is left out on purpose: importing dalle_dist.a.b runs dalle_dist/a/__init__.py
    first, but that is not counted as b importing its package. Counted, every package whose
    __init__ re-exports its modules (backends/__init__.py) would be a circle with each
    module it re-exports; `from dalle_dist.a import name` inside folder a, which does run
    into the half-built package, is counted.
    """
    graph = _import_graph()
    assert sum(len(targets) for targets in graph.values()) > 200
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(
        " <-> ".join(circle) for circle in circles)


def test_doctor_imports_only_shared_modules() -> None:
    """doctor is text matching that must run where torch or an engine is broken: of
    dalle_dist it imports only itself and the shared modules (errors, fileio, config_base),
    never a layer below it (a backend's verdict, a model constant) that would bring torch.
    Bug this catches: a signature importing a backend's flag name or a PRECISIONS tuple."""
    found = []
    checked = 0
    for path in sorted((SRC / "doctor").rglob("*.py")):
        for module, line in _imports(path):
            checked += 1
            if _layer(module) not in ("doctor", "shared"):
                found.append(f"{path.relative_to(SRC)}:{line} imports {module}")
    assert checked > 10
    assert not found, "doctor imports beyond the shared modules:\n" + "\n".join(found)

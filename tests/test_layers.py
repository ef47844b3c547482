"""The tree is the design: imports only point down the layers of DESIGN.md and the README.

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
LAYERS = ("cli", "diagnose", "generate", "train", "checkpoint", "backends", "data", "model",
          "shared")
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

"""The walls between packages hold: layers point one way, private stays private.

Read from the source with :mod:`ast` (nothing is imported), so a violation anywhere in the tree
fails here with the file and line that makes it.

- no import cycle between the top-level packages (hwmodels, mksim, explorer, validation), nor
  between mksim's subpackages and modules (``mksim.schedule`` never reaches ``mksim.sim``);
- no import of another package's private module or name (``mksim.sim._costs``, ``_map``);
- the command line is thin (``mksim/cli.py`` at most 300 lines) and nothing imports it;
- imports sit at the top of the module, except the optional heavy libraries (and our modules that
  load one), which load where they are used.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hwmodels", "mksim", "explorer", "validation")
HEAVY = ("torch", "cupy", "dash", "optuna", "plotly", "matplotlib", "selenium", "scipy", "pandas",
         "sqlalchemy", "psycopg2", "typer._click", "click", "cupyx", "triton", "transformers")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, list[str], int, bool]]:
    """(module imported, names taken from it, line, at module top) for each import of ``name``."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    for n in tree.body:  # imports under a module-level `if TYPE_CHECKING:` or `try:` count as top
        if isinstance(n, (ast.If, ast.Try)):
            top |= {id(m) for m in ast.walk(n)}
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((a.name, [], node.lineno, id(node) in top))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, [a.name for a in node.names], node.lineno, id(node) in top))
    return out


def _ours(mod: str) -> bool:
    return mod.split(".")[0] in PACKAGES


def _owner(mod: str) -> str:
    """The unit a module belongs to for the layering: a top-level package, or a subpackage/module
    of mksim (``mksim.sim``, ``mksim.schedule``, ``mksim.costs``...)."""
    parts = mod.split(".")
    if parts[0] == "mksim" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _edges(level) -> dict[str, set[str]]:
    g: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        for mod, names, _, _ in _imports(name, path):
            if not _ours(mod):
                continue
            targets = [mod] + [f"{mod}.{n}" for n in names if f"{mod}.{n}" in MODULES]
            for t in targets:
                a, b = level(name), level(t)
                if a != b:
                    g[a].add(b)
    return g


def _cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(g.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(g):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_no_cycle_between_top_level_packages():
    assert _cycle(_edges(lambda m: m.split(".")[0])) is None


def test_no_cycle_inside_mksim():
    g = {a: {b for b in bs if b.startswith("mksim.")} for a, bs in _edges(_owner).items() if a.startswith("mksim.")}
    g.pop("mksim.cli", None)  # the command line sits above everything (and nothing imports it)
    assert _cycle(g) is None


def test_schedule_does_not_reach_the_engine():
    g = _edges(_owner)
    seen, todo = set(), ["mksim.schedule"]
    while todo:
        v = todo.pop()
        for w in g.get(v, ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    assert "mksim.sim" not in seen


def _private_imports() -> list[str]:
    bad = []
    for name, path in MODULES.items():
        home = _owner(name)
        for mod, names, line, _ in _imports(name, path):
            if not _ours(mod) or _owner(mod) == home:
                continue
            private_mod = any(p.startswith("_") and p != "__init__" for p in mod.split("."))
            private_names = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private_mod or private_names:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {mod} {private_names or ''}")
    return bad


def test_no_private_import_across_packages():
    assert _private_imports() == []


def test_cli_is_thin_and_nothing_imports_it():
    assert len((ROOT / "mksim" / "cli.py").read_text().splitlines()) <= 300
    users = [f"{p.relative_to(ROOT)}" for n, p in MODULES.items() if n != "mksim.cli"
             for mod, names, _, _ in _imports(n, p) if mod == "mksim.cli" or (mod == "mksim" and "cli" in names)]
    assert [u for u in users if not u.endswith("__main__.py")] == []


def test_explorer_uses_public_mksim_api():
    bad = [f"{p.relative_to(ROOT)}:{line}: {mod}" for n, p in MODULES.items() if n.startswith("explorer")
           for mod, names, line, _ in _imports(n, p)
           if _ours(mod) and not mod.startswith("explorer") and
           (any(x.startswith("_") for x in mod.split(".")) or any(x.startswith("_") for x in names))]
    assert bad == []


def _heavy_modules() -> set[str]:
    """Our modules that load an optional heavy library when imported (directly or through another
    of ours): importing one of them late is the gate for that library, not a misplaced import."""
    top = {n: [m for m, _, _, at_top in _imports(n, p) if at_top] for n, p in MODULES.items()}
    heavy = {n for n, mods in top.items() if any(m.startswith(HEAVY) for m in mods)}
    grew = True
    while grew:
        grew = False
        for n, mods in top.items():
            if n not in heavy and any(m in heavy for m in mods):
                heavy.add(n)
                grew = True
    return heavy


def test_imports_at_module_top():
    heavy = _heavy_modules()
    bad = []
    for name, path in MODULES.items():
        for mod, names, line, at_top in _imports(name, path):
            targets = [mod] + [f"{mod}.{n}" for n in names]
            if at_top or mod.startswith(HEAVY) or any(t in heavy for t in targets):
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
    assert bad == []


@pytest.mark.parametrize("pkg", PACKAGES)
def test_every_module_parses(pkg):  # the checks above read every file; an unreadable one would hide
    assert any(n.split(".")[0] == pkg for n in MODULES)

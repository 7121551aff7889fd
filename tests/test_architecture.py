"""The walls between packages hold: layers point one way, private stays private.

Read from the source with :mod:`ast` (nothing is imported), so a violation anywhere in the tree
fails here with the file and line that makes it.

- no import cycle between the top-level packages (hwmodels, mksim, explorer, validation), nor
  between mksim's subpackages and modules (``mksim.schedule`` never reaches ``mksim.sim``);
- no import of another package's private module or name (``mksim.sim._costs``, ``_map``);
- the command line is thin (``mksim/cli.py`` at most 300 lines) and nothing imports it;
- imports sit at the top of the module, except the optional heavy libraries (and our modules that
  load one), which load where they are used;
- one copy of each list: a registered name (a mode, design, sync, policy, op kind, block, GPU,
  profile: :meth:`mksim.registry.Registry.every`) appears in no string-literal list, tuple or set of
  two or more of them outside the package that registers it (mksim and the explorer; validation's
  lists name what its CUDA runners implement on silicon, which a registration does not extend); the
  engine and the search name no design and no sync at all (they ask the designs' and syncs' hooks);
- ``hwmodels.load`` is called from one seam, :mod:`mksim.target` (mksim and the explorer).
"""

from __future__ import annotations

import ast
import functools
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
# one worker: every check reads the same parsed trees (_tree), parsed once per process (about 2 s)
pytestmark = pytest.mark.xdist_group("architecture")


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once per test process (the checks below read every file)."""
    return ast.parse(path.read_text(), str(path))


@functools.cache
def _imports(name: str, path: Path) -> list[tuple[str, list[str], int, bool]]:
    """(module imported, names taken from it, line, at module top) for each import of ``name``
    (once per test process: read, not changed)."""
    tree = _tree(path)
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


# -- one copy of each list -----------------------------------------------------------------------------
def _registries() -> dict[str, tuple[frozenset[str], tuple[str, ...]]]:
    """``{kind: (names, home packages)}`` of every registry, read from the registries themselves. A
    registry's home is the package that made it, whose modules define or register its things (where
    the names are declared, not retyped); a registry of files has its files' package."""
    import mksim.schedule  # noqa: F401  (registers the modes, designs, syncs, policies)
    import mksim.sim  # noqa: F401  (the designs' engine pieces)
    import mksim.target  # noqa: F401  (the GPU and profile registries)
    import mksim.workload  # noqa: F401  (op kinds, blocks)
    from mksim.registry import Registry

    files = {"GPU": ("hwmodels",), "implementation profile": ("hwmodels",)}  # registries read from files
    out = {}
    for reg in Registry.every():
        if not reg.home.startswith(("mksim", "hwmodels", "explorer")):  # a registry a test made for itself
            continue
        out[reg.kind] = (frozenset(reg), files.get(reg.kind, (reg.home,)))
    return out


def _docstring_ids(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _literal_lists(path: Path) -> list[tuple[int, list[str]]]:
    """(line, the strings) of each list, tuple or set literal made only of string constants."""
    tree = _tree(path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and node.elts and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            out.append((node.lineno, [e.value for e in node.elts]))  # type: ignore[attr-defined]
    return out


def test_no_registered_names_retyped_as_a_list():
    regs = _registries()
    assert {"mode", "design", "sync", "policy", "op kind", "block", "GPU", "implementation profile"} <= set(regs)
    bad = []
    for name, path in MODULES.items():
        if not name.startswith(("mksim", "explorer")):
            continue
        for line, strings in _literal_lists(path):
            for kind, (names, _) in regs.items():
                hits = [s for s in strings if s in names]
                # the names may belong to several registries (a design and its engine piece): the list is
                # at home in the package of any registry that holds them all
                at_home = any(name.startswith(h) for n, hs in regs.values() if set(hits) <= n for h in hs)
                if len(set(hits)) >= 2 and not at_home:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {kind} names {hits} (read them from the registry)")
    assert bad == []


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, value) of each string constant that is not a docstring (f-string parts included)."""
    tree = _tree(path)
    docs = _docstring_ids(tree)
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_engine_and_search_name_no_design_or_sync():
    regs = _registries()
    names = regs.get("design", (frozenset(),))[0] | regs.get("sync", (frozenset(),))[0]
    assert names, "no design or sync registered"
    bad = [f"{p.relative_to(ROOT)}:{line}: {value!r}" for n, p in MODULES.items()
           if n.startswith(("mksim.sim", "mksim.search")) for line, value in _string_constants(p) if value in names]
    assert bad == []


def test_hwmodels_load_has_one_seam():
    bad = []
    for name, path in MODULES.items():
        if not name.startswith(("mksim", "explorer")) or name == "mksim.target":
            continue
        tree = _tree(path)
        loads = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "hwmodels"
                 for a in n.names if a.name == "load"}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and ((isinstance(n.func, ast.Attribute) and n.func.attr == "load"
                                             and isinstance(n.func.value, ast.Name) and n.func.value.id == "hwmodels")
                                            or (isinstance(n.func, ast.Name) and n.func.id in loads)):
                bad.append(f"{path.relative_to(ROOT)}:{n.lineno}")
    assert bad == []

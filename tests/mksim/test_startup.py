"""Start-up stays lean: what ``import mksim``, ``import hwmodels`` and ``mksim --help`` load (modules, not
times: benchmarks/startup.py times them), and that loading later changes nothing a user sees."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
import typer

import hwmodels
import mksim
from mksim.console import LazyGroup
from tests.clirun import ROOT, mksim_inproc

#: what none of these start-ups may load: the optional heavy libraries, and the libraries and parts of
#: mksim that only a command's work needs
HEAVY = ("torch", "dash", "cupy", "optuna", "plotly", "matplotlib", "explorer", "validation")
WORK = ("numpy", "pydantic", "simpy", "tomllib", "mksim.workload", "mksim.schedule", "mksim.sim", "mksim.costs",
        "mksim.compare", "mksim.tables", "mksim.search", "hwmodels._loader", "hwmodels._schema")


def _loaded_by(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code`` (its stdout is swallowed)."""
    probe = ("import contextlib, io, json, sys\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try:\n" + "".join(f"        {line}\n" for line in code.splitlines()) +
             "    except SystemExit:\n        pass\n"
             "print(json.dumps(sorted(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout))


def _hits(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in loaded or any(m.startswith(n + ".") for m in loaded))


@pytest.mark.parametrize("what,code", [
    ("import mksim", "import mksim"),
    ("import hwmodels", "import hwmodels"),
    ("mksim --help", "from mksim.cli import main\nmain(['--help'])"),
    ("mksim with no command", "from mksim.cli import main\nmain([])"),
    ("mksim --version", "from mksim.cli import main\nmain(['--version'])"),
])
def test_start_up_loads_no_work(what, code):
    loaded = _loaded_by(code)
    assert _hits(loaded, HEAVY + WORK) == [], what


def test_a_command_loads_what_it_needs_and_no_other_package():
    loaded = _loaded_by("from mksim.cli import main\nmain(['workload', '--model', 'llama-3.2-1b'])")
    assert {"numpy", "mksim.workload", "hwmodels._loader"} <= loaded
    assert _hits(loaded, HEAVY) == []


@pytest.mark.parametrize("args", [["hw", "list"], ["hw", "show", "h200", "--json"]])
def test_the_hardware_commands_load_no_numpy_nor_simulator(args):
    loaded = _loaded_by(f"from mksim.cli import main\nmain({args!r})")
    assert "mksim.catalog" in loaded and "hwmodels._loader" in loaded
    assert _hits(loaded, HEAVY + ("numpy", "simpy", "mksim.sim", "mksim.tables", "mksim.search")) == []


def test_lazy_names_are_the_modules_own():
    """Every name the packages export resolves, to the very object its module defines."""
    for name in mksim.__all__:
        assert getattr(mksim, name) is not None, name
    assert mksim.Step is importlib.import_module("mksim.workload").Step
    assert mksim.simulate is importlib.import_module("mksim.sim").simulate
    for name in mksim._SUBMODULES:
        assert getattr(mksim, name) is importlib.import_module(f"mksim.{name}"), name
    for name in hwmodels.__all__:
        assert getattr(hwmodels, name) is not None, name
    for name, module in hwmodels._LAZY.items():
        assert getattr(hwmodels, name) is getattr(importlib.import_module(module, "hwmodels"), name), name
    for pkg in (mksim, hwmodels):
        with pytest.raises(AttributeError):
            pkg.no_such_name  # noqa: B018


@pytest.mark.parametrize("name", sorted(LazyGroup.lazy))
def test_a_mounted_command_is_listed_by_the_first_sentence_of_its_own_help(name):
    """``mksim --help`` lists the commands of other packages without importing them: what it shows must be
    what the command, once imported, would show."""
    target, summary = LazyGroup.lazy[name]
    module, attr = target.split(":")
    obj = getattr(importlib.import_module(module), attr)
    help_text = (typer.main.get_command(obj) if isinstance(obj, typer.Typer) else obj).help or ""
    words = help_text.split("\n\n")[0].split()
    first = next(i for i, w in enumerate(words) if w.endswith("."))  # where click's short help stops
    assert " ".join(words[:first + 1]) == summary


def test_help_lists_the_registered_names_once_a_command_is_asked():
    from mksim.schedule import POLICIES, design_names
    from mksim.target import PROFILES

    text = " ".join(mksim_inproc("compare", "--help").stdout.split())  # the help, unwrapped
    assert "{" not in text
    for names in (PROFILES, POLICIES, design_names()):
        assert ", ".join(names) in text
    assert f"({', '.join(POLICIES)})" in " ".join(mksim_inproc("simulate", "--help").stdout.split())

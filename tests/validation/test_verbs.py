"""``python -m validation``: one entry point for the GPU lab's runners; every verb's help runs, and an
unknown verb or a GPU verb on a machine without one is one line and exit 2."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import validation.suite
from validation import verbs

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "validation", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_help_lists_every_verb_with_one_line():
    r = _run("--help")
    assert r.returncode == 0 and r.stderr == ""
    listed = [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("  ")]
    assert listed == [v.name for v in verbs.VERBS]
    assert len(set(listed)) == len(listed) == 16


def test_the_docs_table_lists_every_verb():
    page = (ROOT / "docs" / "validation.md").read_text().split("## The lab's runners", 1)[1].split("\n## ", 1)[0]
    rows = [ln.split("|")[1].strip().strip("`") for ln in page.splitlines() if ln.startswith("| `")]
    assert rows == [v.name for v in verbs.VERBS]


def test_no_verb_prints_the_list_and_exits_2():
    r = _run()
    assert r.returncode == 2 and "Verbs:" in r.stdout


def test_an_unknown_verb_is_one_line():
    r = _run("suites")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == ["error: unknown verb 'suites'; known: suite, megakernel, megakernel-ab, ... "
                                     "(all of them: python -m validation --help)"]


@pytest.mark.parametrize("v", verbs.VERBS, ids=lambda v: v.name)
def test_every_verb_has_a_runner_and_its_help_names_the_verb(v, capsys):
    """In process (one interpreter for all): the module imports, its function takes argv, ``--help``
    exits 0 and shows ``python -m validation VERB`` as the program."""
    run = getattr(importlib.import_module(v.module), v.func)
    with pytest.raises(SystemExit) as exc:
        run(["--help"])
    assert exc.value.code in (0, None)
    assert f"python -m validation {v.name}" in capsys.readouterr().out


@pytest.mark.slow  # 16 interpreters, each importing its runner (about 1-3 s each)
def test_every_verb_help_runs_as_a_command():
    for v in verbs.VERBS:
        r = _run(v.name, "--help")
        assert r.returncode == 0, (v.name, r.stderr)
        assert r.stdout.lower().startswith("usage: python -m validation " + v.name), (v.name, r.stdout[:200])


GPU_RUNS = (["host-rate", "--out", "x.json"], ["suite", "run", "--only", "llama-3.2-1b/b1/graph", "--out", "x"],
            ["chains", "run", "--quick", "--out", "x"])


@pytest.mark.parametrize("argv", GPU_RUNS, ids=lambda a: a[0])
def test_a_gpu_verb_without_a_gpu_is_one_line(argv, tmp_path):
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    except ImportError:
        pass
    r = _run(*argv[:-1], str(tmp_path / argv[-1]))
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr


def test_the_entry_point_imports_no_runner():
    """``python -m validation --help`` loads no runner, nor mksim: the device's runners keep their own
    import footprint (host-rate and node-grid need nothing of mksim)."""
    code = ("import sys, runpy; sys.argv = ['validation', '--help']\n"
            "try:\n    runpy.run_module('validation', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mksim', 'hwmodels', 'numpy', 'typer')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.stdout.splitlines()[-1] == "[]", r.stdout


def test_docstring_examples():
    for mod in (verbs, validation.suite):
        assert doctest.testmod(mod, optionflags=doctest.ELLIPSIS).failed == 0

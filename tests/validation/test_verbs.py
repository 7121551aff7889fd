"""``python -m validation``: one entry point for the GPU lab's runners; every verb's help runs, and an
unknown verb or a GPU verb on a machine without one is one line and exit 2."""

from __future__ import annotations

import doctest
import importlib
import json
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
    assert len(set(listed)) == len(listed) == 19


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


#: ``python -m validation VERB --help`` for each verb given, as ``-m`` runs it (runpy, ``__main__``), in one
#: interpreter: {verb: [exit status, standard output]} as JSON
HELP_EACH = """
import contextlib, io, json, runpy, sys
got = {}
for verb in json.loads(sys.argv[1]):
    sys.argv, out, code = ["validation", verb, "--help"], io.StringIO(), None
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module("validation", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
    got[verb] = [code, out.getvalue()]
print(json.dumps(got))
"""


@pytest.mark.slow  # one child Python importing every runner in turn (3 s; a child per verb took 8)
def test_every_verb_help_runs_as_a_command():
    names = [v.name for v in verbs.VERBS]
    r = subprocess.run([sys.executable, "-c", HELP_EACH, json.dumps(names)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert list(got) == names
    for name, (code, out) in got.items():
        assert code in (0, None), (name, code, r.stderr)
        assert out.lower().startswith("usage: python -m validation " + name), (name, out[:200])


GPU_RUNS = (pytest.param(["host-rate", "--out", "x.json"], marks=pytest.mark.slow),  # a child importing torch: 2.4 s
            ["suite", "run", "--only", "llama-3.2-1b/b1/graph", "--out", "x"],
            ["chains", "run", "--quick", "--out", "x"])


def _gpu_device_files() -> bool:
    """Whether this machine shows a GPU's device files (NVIDIA's, or AMD's kfd): without them neither torch
    nor CuPy finds a GPU. Checked here instead of importing torch (2.4 s of CPU) into the test process."""
    return any(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/kfd").exists()


@pytest.mark.skipif(_gpu_device_files(), reason="this machine has a GPU")
@pytest.mark.parametrize("argv", GPU_RUNS, ids=["host-rate", "suite", "chains"])
def test_a_gpu_verb_without_a_gpu_is_one_line(argv, tmp_path):
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

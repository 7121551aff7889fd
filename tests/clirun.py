"""``mksim ARGS`` run inside the test process: what a subprocess would return, without starting Python.

A child ``python -m mksim`` costs about a second of CPU before it does any work (the interpreter,
numpy, typer, rich, mksim); a test that reads only the exit status and the two output streams of a
command that finishes does not need one. :func:`mksim_inproc` calls the same entry point
(:func:`mksim.cli.main`, as ``python -m mksim`` does after its imports) with the arguments, in the
repository's root, with standard output and error caught, and returns them as a
:class:`subprocess.CompletedProcess` (``returncode``, ``stdout``, ``stderr``), so a test can use it
where it used ``subprocess.run``.

What stays with real processes: a Ctrl-C or another signal, a server, a memory limit, workers that
must outlive or die with their parent, and at least one test per path that checks a real child's exit
status and that it prints no traceback (tests/mksim/test_cli.py, test_bad_inputs*.py).

>>> r = mksim_inproc("workload", "--model", "gpt-9")
>>> r.returncode, r.stdout, r.stderr.splitlines()[0][:29]
(2, '', "error: unknown model 'gpt-9';")
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def as_from_a_terminal() -> None:
    """A child's ``preexec_fn``: Ctrl-C (SIGINT) at its default, as a terminal starts a command. A test
    run started in the background (``pytest &`` in a script, some CI runners) has SIGINT ignored, which
    every child inherits, and Python leaves an ignored SIGINT ignored: a test that sends its child Ctrl-C
    would wait for nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
#: the width mksim's console takes when its output is not a terminal (mksim.console.out), as in a child
PIPE_WIDTH = 160


def mksim_inproc(*args: str, cwd: Path | str = ROOT) -> subprocess.CompletedProcess[str]:
    """``mksim ARGS`` in this process, from ``cwd``: its exit status, standard output and standard error."""
    from mksim.cli import main
    from mksim.console import out

    stdout, stderr = io.StringIO(), io.StringIO()
    here, width = os.getcwd(), out._width
    code: int | str | None = 0
    try:
        os.chdir(cwd)
        out.width = PIPE_WIDTH  # a child prints to a pipe; this process may have been started on a terminal
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main(list(args))
            except SystemExit as exc:
                code = exc.code
    finally:
        out._width = width
        os.chdir(here)
    if code is None:
        code = 0
    elif isinstance(code, str):  # sys.exit("message"): Python prints it and exits 1
        stderr.write(code + "\n")
        code = 1
    return subprocess.CompletedProcess(["mksim", *args], code, stdout.getvalue(), stderr.getvalue())


def is_child_needed() -> bool:
    """Whether ``MKSIM_TEST_SUBPROCESS=1`` asks every in-process command to run in a real child instead."""
    return os.environ.get("MKSIM_TEST_SUBPROCESS") == "1"


def mksim(*args: str, cwd: Path | str = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``mksim ARGS`` in this process, or in a child ``python -m mksim`` when ``MKSIM_TEST_SUBPROCESS=1``."""
    if is_child_needed():
        return subprocess.run([sys.executable, "-m", "mksim", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)
    return mksim_inproc(*args, cwd=cwd)

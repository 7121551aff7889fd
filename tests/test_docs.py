"""Docs stay true: their examples run and their outputs match.

- ``>>>`` examples in docs/*.md and README.md run as doctests;
- in ```console blocks, each ``$ mksim ...`` line runs and must exit 0; the lines after it
  (up to the next ``$``) are its expected output unless the block is marked ``console-nocheck``;
- in ```console-error blocks (bad inputs), each command must exit 2 with the lines after it as its
  whole standard error (one ``error: ...`` line) and print nothing on standard output;
- generated pages (docs/hardware.md) match their generator.

The commands run in this process (tests/clirun.py: the same entry point, output caught; set
``MKSIM_TEST_SUBPROCESS=1`` to run each in a child ``python -m mksim`` instead), a page's in the order
the page gives them (a later one may read what an earlier one wrote) and, under pytest-xdist, on one
worker. A command line that appears more than once (in two blocks or two pages) runs once per session;
each block is compared with that one run.
"""

from __future__ import annotations

import doctest
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.clirun import mksim

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"```(console|console-nocheck|console-error)\n(.*?)```", re.S)


#: commands of over 2 s (a search, a calibration, a sweep of batches, the validation suite): slow, and so
#: is every command after one in the same block (it may read what the slow one wrote)
SLOW_COMMANDS = ("search", "calibrate", "sweep", "validate")
#: pages whose ``>>>`` examples take over about 1 s of CPU (a search; many simulations; the explorer's imports)
SLOW_PAGES = ("api.md", "explorer.md", "model.md", "search.md", "stacks.md", "workloads.md")


def _console_examples():
    for page in PAGES:
        for m in BLOCK.finditer(page.read_text()):
            kind = m.group(1)
            cmd, expected, slow = None, [], False
            for line in [*m.group(2).splitlines(), "$ "]:
                if line.startswith("$ "):
                    if cmd:
                        check = None if kind == "console-nocheck" else expected
                        slow = slow or shlex.split(cmd)[1:2] in ([c] for c in SLOW_COMMANDS)
                        marks = [pytest.mark.xdist_group("docs-console"), *([pytest.mark.slow] if slow else [])]
                        yield pytest.param(cmd, check, kind == "console-error", id=f"{page.name}:{cmd[:40]}",
                                           marks=marks)
                    cmd, expected = line[2:], []
                else:
                    expected.append(line)


@pytest.mark.parametrize("page", [pytest.param(p, marks=[pytest.mark.slow] if p.name in SLOW_PAGES else [])
                                  for p in PAGES], ids=lambda p: p.name)
def test_doctests_in_page(page):
    parser = doctest.DocTestParser()
    test = parser.get_doctest(page.read_text(), {}, page.name, str(page), 0)
    if not test.examples:
        pytest.skip("no >>> examples")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0, f"{runner.failures} doctest(s) failed in {page.name}"


_RUNS: dict[str, subprocess.CompletedProcess[str]] = {}


def run_once(cmd: str) -> subprocess.CompletedProcess[str]:
    """``cmd`` (``mksim ...``) run from the repository's root, once per session: the same line in
    another block or page is compared with this run."""
    if cmd not in _RUNS:
        argv = shlex.split(cmd)
        assert argv[0] == "mksim", "console examples run mksim commands"
        _RUNS[cmd] = mksim(*argv[1:], cwd=ROOT)
    return _RUNS[cmd]


@pytest.mark.parametrize("cmd,expected,bad", list(_console_examples()))
def test_console_example(cmd, expected, bad):
    r = run_once(cmd)
    if bad:  # a bad input: one line on stderr, exit 2, nothing else
        assert (r.returncode, r.stdout, r.stderr.splitlines()) == (2, "", expected), r.stderr
        return
    assert r.returncode == 0, r.stderr
    if expected is not None:
        got = [line.rstrip() for line in r.stdout.rstrip("\n").splitlines()]
        assert got == [line.rstrip() for line in expected]


def test_hardware_page_is_current():
    from hwmodels.docs import render

    assert (ROOT / "docs" / "hardware.md").read_text() == render(), \
        "regenerate with: python -m hwmodels.docs docs/hardware.md"

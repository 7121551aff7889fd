"""Docs stay true: their examples run and their outputs match.

- ``>>>`` examples in docs/*.md and README.md run as doctests;
- in ```console blocks, each ``$ mksim ...`` line runs and must exit 0; the lines after it
  (up to the next ``$``) are its expected output unless the block is marked ``console-nocheck``;
- in ```console-error blocks (bad inputs), each command must exit 2 with the lines after it as its
  whole standard error (one ``error: ...`` line) and print nothing on standard output;
- generated pages (docs/hardware.md) match their generator.
"""

from __future__ import annotations

import doctest
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"```(console|console-nocheck|console-error)\n(.*?)```", re.S)


def _console_examples():
    for page in PAGES:
        for m in BLOCK.finditer(page.read_text()):
            kind = m.group(1)
            cmd, expected = None, []
            for line in [*m.group(2).splitlines(), "$ "]:
                if line.startswith("$ "):
                    if cmd:
                        check = None if kind == "console-nocheck" else expected
                        yield pytest.param(cmd, check, kind == "console-error", id=f"{page.name}:{cmd[:40]}")
                    cmd, expected = line[2:], []
                else:
                    expected.append(line)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_doctests_in_page(page):
    parser = doctest.DocTestParser()
    test = parser.get_doctest(page.read_text(), {}, page.name, str(page), 0)
    if not test.examples:
        pytest.skip("no >>> examples")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0, f"{runner.failures} doctest(s) failed in {page.name}"


@pytest.mark.parametrize("cmd,expected,bad", list(_console_examples()))
def test_console_example(cmd, expected, bad, tmp_path):
    argv = shlex.split(cmd)
    assert argv[0] == "mksim", "console examples run mksim commands"
    r = subprocess.run([sys.executable, "-m", "mksim", *argv[1:]], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
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

"""Every row of the second table of bad and hostile inputs (2026-12-02) is a test.

The table (kept with the project's notes, not in this repository) has 192 command-line rows (A1-A192),
61 HTTP requests to the explorer (B1-B61) and 20 interrupted or racing searches (C1-C20). Each row is
a test whose id starts with the row's id (``test_cli_row[A12-trace-stream-list]``, ``test_C5_...``);
this reads the ids of the tests in the files that hold them (this session's when it collected them
all, else a collection of its own) and fails on any row that has no test.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DESELECTED

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_bad_inputs_2*.py")) + [
    "tests/explorer/test_hostile_http.py"]
ROWS = {"A": 192, "B": 61, "C": 20}
ROW_ID = re.compile(r"[\[_-]([ABC])(\d+)(?=[-_\]])")


def _collected(request: pytest.FixtureRequest) -> list[str]:
    """The ids of the tests in :data:`FILES`: this session's, when it collected them all and deselected
    none (the whole suite), else those of a ``pytest --collect-only`` of the files."""
    items = request.session.items
    if set(FILES) <= {i.nodeid.split("::")[0] for i in items} and not request.config.stash.get(DESELECTED, 0):
        return [i.nodeid for i in items if i.nodeid.split("::")[0] in FILES]
    r = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "--collect-only",
                        "-p", "no:cacheprovider", *FILES], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [line for line in r.stdout.splitlines() if "::" in line]


@pytest.mark.slow  # 4.9 s of CPU
def test_every_row_of_the_second_table_has_a_test(request: pytest.FixtureRequest) -> None:
    seen = {(m[0], int(m[1])) for nodeid in _collected(request) for m in ROW_ID.findall(nodeid)}
    missing = [f"{k}{i}" for k, n in ROWS.items() for i in range(1, n + 1) if (k, i) not in seen]
    assert not missing, f"{len(missing)} row(s) of the table have no test: {', '.join(missing)}"

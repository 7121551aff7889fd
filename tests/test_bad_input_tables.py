"""Every row of the second table of bad and hostile inputs (2026-12-02) is a test.

The table (kept with the project's notes, not in this repository) has 192 command-line rows (A1-A192),
61 HTTP requests to the explorer (B1-B61) and 20 interrupted or racing searches (C1-C20). Each row is
a test whose id starts with the row's id (``test_cli_row[A12-trace-stream-list]``, ``test_C5_...``);
this collects the test files that hold them and fails on any row that has no test.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_bad_inputs_2*.py")) + [
    "tests/explorer/test_hostile_http.py"]
ROWS = {"A": 192, "B": 61, "C": 20}
ROW_ID = re.compile(r"[\[_-]([ABC])(\d+)(?=[-_\]])")


def test_every_row_of_the_second_table_has_a_test() -> None:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider", *FILES],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    seen = {(m[0], int(m[1])) for line in r.stdout.splitlines() if "::" in line for m in ROW_ID.findall(line)}
    missing = [f"{k}{i}" for k, n in ROWS.items() for i in range(1, n + 1) if (k, i) not in seen]
    assert not missing, f"{len(missing)} row(s) of the table have no test: {', '.join(missing)}"

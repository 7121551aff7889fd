"""docs/reproductions.md is what benchmarks/reproductions.py writes, and every row is sourced."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repro():
    spec = importlib.util.spec_from_file_location("reproductions", ROOT / "benchmarks" / "reproductions.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["reproductions"] = mod  # its dataclasses and worker processes look it up by name
    spec.loader.exec_module(mod)
    return mod


def test_every_row_has_a_source_and_a_setup(repro):
    for r in repro.ROWS:
        assert r.source in repro.SOURCES and r.setup and r.unit in ("µs", "×", "%")


def test_off_counts_from_the_nearer_end_of_a_range(repro):
    assert repro.off(2.0, 1.5) == pytest.approx(-0.25)
    assert repro.off((1.3, 1.5), 1.4) == 0.0
    assert repro.off((1.3, 1.5), (1.0, 1.1)) == pytest.approx(1.1 / 1.3 - 1)


@pytest.mark.slow
def test_the_page_is_current(repro):
    preds = repro.predictions(parallel=False)  # each shared setup simulated once; pytest-xdist fills the cores
    # preds goes on with the side-by-side cells after the rows; a row off by more than 15 % says what mksim lacks
    for r, p in zip(repro.ROWS, preds, strict=False):
        assert abs(repro.off(r.published, p)) <= repro.OFF or r.missing, r
    assert (ROOT / "docs" / "reproductions.md").read_text() == repro.render(preds), \
        "regenerate with: python benchmarks/reproductions.py docs/reproductions.md"

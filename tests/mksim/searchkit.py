"""What the search tests share: a small GPU and a tiny model that keep a study's trials cheap, and a count
of a study's trials read straight from its SQLite file (cheap enough to poll while a child process searches).

The small GPU is an H200 of 16 SMs: the same search space, the same baselines and chain modes, each
trial simulated in a tenth of the time (fewer tiles per op). The tiny model (:data:`TINY_MODEL`) is a Llama
of 2 layers, 512 wide (``mksim search --model tests/data/tiny-llama.json``): the same ops per layer and the
same space, a trial a tenth of llama-3.2-1b's again (:data:`TINY_MOE`: OLMoE's block, for the MoE designs).
A test whose point is the search machinery (storage, resuming, interrupts, races, options) takes both; one
whose point is a model's numbers keeps its model.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

TINY_MODEL = Path(__file__).resolve().parents[1] / "data" / "tiny-llama.json"
TINY_MOE = TINY_MODEL.with_name("tiny-olmoe.json")  # OLMoE's block: 2 layers of 16 experts, top-4
SMALL_GPU = """extends = "h200-datasheet"
name = "h200-16sm"
[chip.sm]
count = { value = 16, source = "tests", note = "an H200 of 16 SMs: the same space, searched in a fraction of the time" }
[sources.tests]
kind = "estimate"
title = "tests/mksim/searchkit.py"
"""


def small_gpu(folder: Path, extends: str = "h200-datasheet") -> Path:
    """The 16-SM variant of GPU ``extends`` as a hardware file in ``folder``; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{extends}-16sm.toml"
    p.write_text(SMALL_GPU.replace('extends = "h200-datasheet"', f'extends = "{extends}"')
                 .replace('name = "h200-16sm"', f'name = "{extends}-16sm"'))
    return p


def count(db: Path, states: tuple[str, ...] = ("COMPLETE",)) -> int:
    """Trials of the SQLite study file ``db`` in these states, read without optuna; 0 before it exists."""
    if not db.exists():
        return 0
    try:
        # closed here, not by the garbage collector: a process forked while it is open (a WarmChild) would
        # inherit SQLite's state of the file without its locks (mksim.search._storage.release)
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as c:
            marks = ",".join("?" * len(states))
            return int(c.execute(f"SELECT COUNT(*) FROM trials WHERE state IN ({marks})", states).fetchone()[0])
    except sqlite3.Error:  # tables not made yet, or locked past the timeout
        return 0

"""What every test shares: no colour codes, and how the tests are spread over pytest-xdist's workers.

pyproject's addopts run the tests on one worker per core (``-n auto --dist loadgroup``). A test with an
``xdist_group`` mark runs on the worker that runs the rest of its group, after the group's earlier
tests. Besides the groups a test file names itself (the docs' commands, which read what an earlier
command wrote), every test of a module that has a module-scoped fixture is kept together: such a
fixture (a server, a browser, a study searched once) is built once per worker that uses it, so
spreading the module would build it on every worker. A fixture that is cheap to build (a folder of bad
files, a small hardware file) is session-scoped instead, so that its module's tests spread over the workers:
a module kept together runs on one core, and the bad-input tables are minutes of it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Bytecode caches on, for this run and the processes it starts: a machine that sets
# PYTHONDONTWRITEBYTECODE (some CI and sandbox images do) otherwise compiles every module of mksim,
# explorer, validation and tests from source in every worker and every child `python -m mksim`
# (collection 18 s a worker instead of 9 on our 2-core machine). The caches go in __pycache__/, which
# git ignores.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Rich prints tables at a fixed width when not on a terminal; keep colour codes out.
os.environ.setdefault("NO_COLOR", "1")


def _module_scoped(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--nvcc", action="store_true", default=False,
                     help="also run the tests marked nvcc, which compile the CUDA sources (CI runs them once)")


#: tests measured over about 1 s of CPU whose code carries no ``slow`` mark (their parameters, say): one
#: node id a line, written by ``python benchmarks/test_times.py --write`` from a run of ``-p tests.cputime``
MEASURED_SLOW = Path(__file__).with_name("slow_ids.txt")


def _measured_slow() -> set[str]:
    if not MEASURED_SLOW.is_file():
        return set()
    return {line.strip() for line in MEASURED_SLOW.read_text().splitlines() if line.strip() and line[0] != "#"}


@pytest.hookimpl(tryfirst=True)  # before -m reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = _measured_slow()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow(listed=True))  # listed: benchmarks/test_times.py may drop it
    # the CUDA compile checks take minutes of CPU where their builds are not cached yet (a fresh
    # machine, a new nvcc): README's test command leaves them to --nvcc, which .ci/run gives
    nvcc = config.getoption("--nvcc") or os.environ.get("MKSIM_TEST_NVCC") == "1"
    skip_nvcc = pytest.mark.skip(reason="compiles CUDA sources: run with --nvcc (CI does)")
    for item in items:
        if not nvcc and item.get_closest_marker("nvcc") is not None:
            item.add_marker(skip_nvcc)
        if item.get_closest_marker("xdist_group") is None and _module_scoped(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


#: how many tests this session deselected (-k, -m, --deselect, ...): 0 means it runs all it collected
DESELECTED = pytest.StashKey[int]()


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        stash = items[0].config.stash
        stash[DESELECTED] = stash.get(DESELECTED, 0) + len(items)


# The garbage collector: a worker holds a million objects once it has imported and collected (numpy,
# torch, optuna, dash, every test module), and each full collection walks them all: 5-7 s of CPU a worker
# in the quick tests, most of it in about a dozen full passes, and pytest ends each session with five more
# (its check for exceptions raised in finalizers). Frozen after collection, those objects are no longer
# walked; what the tests allocate is collected as before.
def pytest_collection_finish(session: pytest.Session) -> None:
    import gc

    gc.collect()
    gc.freeze()

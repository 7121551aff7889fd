"""The examples in mksim's and hwmodels' docstrings run, so that a refit or a change of the workload
cannot leave a documented number stale (four had drifted before this test: a profile's matmul
cost, two interval widths, an op count)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest


def _modules() -> list[str]:
    names = []
    for pkg in ("hwmodels", "mksim"):
        path = importlib.import_module(pkg).__path__
        names += [pkg, *(m.name for m in pkgutil.walk_packages(path, pkg + ".") if not m.name.endswith("__main__"))]
    return names


@pytest.mark.slow  # about 5 s: every module of both packages imported and its examples run
def test_every_docstring_example_runs() -> None:
    failed = {}
    for name in _modules():
        r = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                            report=False)
        if r.failed:
            failed[name] = f"{r.failed} of {r.attempted}"
    assert not failed, f"docstring examples that fail (python -m doctest -v FILE shows them): {failed}"

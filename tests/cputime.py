"""A pytest plugin that records each test's CPU time, its process's and its children's: what the ``slow``
mark means ("over about 1 s of CPU") measured, on a loaded machine too (wall time there is two to four times
a quiet run's; CPU time changes little).

``python -m pytest -p tests.cputime`` writes one JSON line a test (``id``, ``slow``: whether it carries the
mark, ``listed``: whether the mark is ``tests/slow_ids.txt``'s, ``cpu``: the test process's seconds,
``children``: its waited-for children's, ``wall``, ``worker``: the xdist worker, ``end``: when it ended,
in seconds since the epoch) to ``$MKSIM_TEST_CPUTIME`` (default
``/tmp/mksim-test-cputime.jsonl``), appending from every xdist worker; ``python benchmarks/test_times.py``
sums it by file and lists the tests whose mark is wrong. A child a test
kills without waiting for it, or a server, counts nowhere.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

OUT = os.environ.get("MKSIM_TEST_CPUTIME", "/tmp/mksim-test-cputime.jsonl")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    t = os.times()
    yield
    u = os.times()
    nodeid, group = item.nodeid, item.get_closest_marker("xdist_group")
    if group is not None and group.args and nodeid.endswith(f"@{group.args[0]}"):
        nodeid = nodeid[:-len(group.args[0]) - 1]  # the id as collected (--dist loadgroup adds @group)
    slow = item.get_closest_marker("slow")
    row = {"id": nodeid, "slow": slow is not None, "listed": bool(slow is not None and slow.kwargs.get("listed")),
           "cpu": round(u.user + u.system - t.user - t.system, 3),
           "children": round(u.children_user + u.children_system - t.children_user - t.children_system, 3),
           "wall": round(u.elapsed - t.elapsed, 3),
           "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "end": round(time.time(), 3)}
    with open(OUT, "a") as f:  # one short line a write: the workers' lines do not interleave
        f.write(json.dumps(row) + "\n")

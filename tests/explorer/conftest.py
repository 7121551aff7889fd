"""The explorer's tests keep their searches in a registry of their own (``MKSIM_EXPLORER_JOBS``), not the
user's, and stop the ones still running when the session ends."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def jobs_registry(tmp_path_factory):
    """A registry of searches for this test session; servers the tests start inherit it."""
    old = os.environ.get("MKSIM_EXPLORER_JOBS")
    os.environ["MKSIM_EXPLORER_JOBS"] = str(tmp_path_factory.mktemp("jobs"))
    yield os.environ["MKSIM_EXPLORER_JOBS"]
    try:
        from explorer import jobs
    except ImportError:  # no explorer extra: no search was started
        pass
    else:
        for job in jobs.running_jobs():
            jobs.cancel(job)
    if old is None:
        del os.environ["MKSIM_EXPLORER_JOBS"]
    else:
        os.environ["MKSIM_EXPLORER_JOBS"] = old

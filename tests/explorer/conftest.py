"""The explorer's tests keep their files in a folder of their own (``MKSIM_EXPLORER_CACHE``: schedules, the
default study storage) and their searches in a registry of their own (``MKSIM_EXPLORER_JOBS``), not the
user's, and stop the searches still running when the session ends. Dash is imported as the explorer imports
it (:func:`explorer.import_dash`)."""

from __future__ import annotations

import contextlib
import os

import pytest

with contextlib.suppress(ImportError):  # without Dash the explorer's tests skip
    from explorer import import_dash

    import_dash()  # as mksim explore does: without IPython, half a second of each worker's CPU


@pytest.fixture(scope="session", autouse=True)
def explorer_folder(tmp_path_factory):
    """The explorer's own folder for this test session (mode 0700); servers the tests start inherit it."""
    old = os.environ.get("MKSIM_EXPLORER_CACHE")
    folder = tmp_path_factory.mktemp("explorer-home")
    folder.chmod(0o700)
    os.environ["MKSIM_EXPLORER_CACHE"] = str(folder)
    yield folder
    if old is None:
        del os.environ["MKSIM_EXPLORER_CACHE"]
    else:
        os.environ["MKSIM_EXPLORER_CACHE"] = old


@pytest.fixture(scope="session", autouse=True)
def jobs_registry(tmp_path_factory, explorer_folder):
    """A registry of searches for this test session; servers the tests start inherit it."""
    old = os.environ.get("MKSIM_EXPLORER_JOBS")
    registry = tmp_path_factory.mktemp("jobs")
    registry.chmod(0o700)
    os.environ["MKSIM_EXPLORER_JOBS"] = str(registry)
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

"""Schedules handed from one explorer page to another (Search's best schedule to Timeline).

A schedule file is tens of kilobytes: too much for a link, so the link carries a token and the
schedule waits on this machine's disk, in a :mod:`diskcache` cache shared by the server's processes
and kept across restarts (``MKSIM_EXPLORER_CACHE`` names its folder; default: under the temporary
folder). The token is a digest of the schedule, so the same schedule always gets the same link.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from mksim.extras import require

#: The cache keeps at most this many bytes; the least recently used schedules go first.
SIZE_LIMIT_BYTES = 256 * 2**20


def cache_dir() -> Path:
    """Where the schedules are kept."""
    return Path(os.environ.get("MKSIM_EXPLORER_CACHE") or Path(tempfile.gettempdir()) / "mksim-explorer" / "cache")


def _cache() -> Any:
    diskcache = require("diskcache", "explorer", "the explorer's schedule store")
    return diskcache.Cache(str(cache_dir()), size_limit=SIZE_LIMIT_BYTES, eviction_policy="least-recently-used")


def put_schedule(schedule_json: str) -> str:
    """Keep a schedule file's JSON; returns its token (for ``/timeline?schedule=<token>``)."""
    token = hashlib.sha256(schedule_json.encode()).hexdigest()[:16]
    with _cache() as c:
        c.set(f"schedule:{token}", schedule_json)
    return token


def get_schedule(token: str) -> str | None:
    """The schedule JSON kept under ``token``, or ``None`` if there is none (unknown or evicted)."""
    with _cache() as c:
        return c.get(f"schedule:{token}")

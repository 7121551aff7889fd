"""The process of one search started from the explorer: ``python -m explorer.worker FOLDER KWARGS_JSON``.

:func:`explorer.jobs.start_search` starts it in a session of its own, holding the search folder's lock
(inherited, held until this process ends); it runs :func:`mksim.search.search` with the keyword
arguments given as JSON and writes ``outcome.json`` in the folder: ``{"state": "done"}`` or
``{"state": "failed", "error": one line}``. Exceptions come back as one line, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from explorer.jobs import write_json
from mksim.errors import MksimError
from mksim.search import search


def run(kwargs: dict[str, Any]) -> dict[str, str]:
    """Run the search; its outcome as the page shows it (an error as one line)."""
    try:
        search(**kwargs)
    except MksimError as exc:
        return {"state": "failed", "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - shown in the page rather than lost in a worker
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"state": "failed", "error": f"{type(exc).__name__}: {first}"}
    return {"state": "done"}


def main(argv: list[str]) -> int:
    folder, kwargs = Path(argv[0]), json.loads(argv[1])
    write_json(folder / "outcome.json", run(kwargs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

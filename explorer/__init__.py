"""mksim's web explorer: a multi-page Dash app (``mksim explore``).

``explorer.data`` extracts plain data from mksim and the committed validation results,
``explorer.figures`` draws it (pure functions), ``explorer.pages`` holds one module per page and
``explorer.app.create_app`` assembles them. Dash is imported only by the app and the pages, through
:func:`import_dash`.
"""

from __future__ import annotations

import sys


def import_dash() -> None:
    """Import Dash without its notebook support where no notebook runs. Dash imports IPython for its Jupyter
    mode whenever IPython is installed: half a second of CPU, a third of the server's start. A process that has
    not imported IPython (``mksim explore``, a script) runs in no notebook, so Dash is imported as if IPython
    were not installed; in a notebook (IPython imported already), or once Dash is imported, nothing changes.
    Raises ImportError without Dash."""
    if "dash" in sys.modules or "IPython" in sys.modules:
        return
    sys.modules["IPython"] = None  # type: ignore[assignment]  # "not installed", for this import only
    try:
        import dash  # noqa: F401
    finally:
        del sys.modules["IPython"]

"""``mksim explore``: start the web explorer (``mksim`` mounts :data:`app` by name, on first use)."""

from __future__ import annotations

import errno
import socket

import typer

from mksim.console import out, say
from mksim.errors import MksimError
from mksim.extras import require

__all__ = ["app"]

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


@app.command("explore")
def explore_cmd(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8050, "--port", help="Port to listen on."),
    debug: bool = typer.Option(False, "--debug", help="Dash debug mode (reloads on code changes)."),
) -> None:
    """Start the web explorer (Compare, Timeline, Search, Validation, Hardware) at http://HOST:PORT/."""
    if not 0 <= port <= 65535:
        raise MksimError(f"--port must be between 0 and 65535, got {port}")
    try:  # a bad host or a busy port: one line now, not a server that prints its URL and then dies
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        why = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise MksimError(f"cannot listen on {host}:{port} ({why}); give another --host or --port") from None
    for module in ("dash", "plotly"):
        require(module, "explorer", "mksim explore")
    app_module = require("explorer.app", "explorer", "mksim explore")
    out.print(f"mksim explorer at http://{host}:{port}/ (Ctrl-C stops it)")
    app_module.create_app().run(host=host, port=port, debug=debug)
    running = require("explorer.jobs", "explorer", "mksim explore").running_jobs()
    if running:  # searches run in processes of their own: they go on, and the next explorer lists them
        say(f"{len(running)} search(es) still run ({', '.join(running)}); the Search page of the next mksim explore "
            "lists them, to follow or cancel")

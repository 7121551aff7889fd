"""``mksim explore``: start the web explorer (``mksim`` mounts :data:`app` by name, on first use)."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket

import typer

from explorer import import_dash
from mksim.console import out, say
from mksim.errors import MksimError
from mksim.extras import require

__all__ = ["app", "is_loopback"]

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address of this machine only (``127.0.0.1``, ``::1``, ``localhost``): nobody
    else can reach a server listening there."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@app.command("explore")
def explore_cmd(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (the server has no "
                             "authentication: anyone who reaches it can use it)."),
    port: int = typer.Option(8050, "--port", help="Port to listen on."),
    debug: bool = typer.Option(False, "--debug", help="Dash debug mode (reloads on code changes; loopback "
                               "--host only)."),
    storage: str = typer.Option(None, "--storage", help="Where the Search page keeps its studies (an SQLite "
                                "file or an RDB URL); default: studies.db in the explorer's folder."),
) -> None:
    """Start the web explorer (Compare, Timeline, Search, Validation, Hardware) at http://HOST:PORT/."""
    if not 0 <= port <= 65535:
        raise MksimError(f"--port must be between 0 and 65535, got {port}")
    loopback = is_loopback(host)
    if debug and not loopback:
        raise MksimError(f"--debug serves Werkzeug's debugger, which runs code: only on a loopback --host "
                         f"(127.0.0.1), not {host}")
    # Werkzeug's reloader (--debug) runs this command again in a child while the parent holds the port:
    # the child must not check the port again (it would find it in use), nor print the URL twice
    reloader_child = os.environ.get("WERKZEUG_RUN_MAIN") == "true"
    if not reloader_child:
        try:  # a bad host or a busy port: one line now, not a server that prints its URL and then dies
            with socket.create_server((host, port)):
                pass
        except OSError as exc:
            why = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
            raise MksimError(f"cannot listen on {host}:{port} ({why}); give another --host or --port") from None
    with contextlib.suppress(ImportError):  # a missing Dash is reported by require, in one line
        import_dash()  # without IPython: a third of the server's start
    for module in ("dash", "plotly"):
        require(module, "explorer", "mksim explore")
    app_module = require("explorer.app", "explorer", "mksim explore")
    if storage is not None:  # the server's and its searches'
        data = require("explorer.data", "explorer", "mksim explore")
        os.environ["MKSIM_EXPLORER_STORAGE"] = data.storage_url(storage)
    store = require("explorer.store", "explorer", "mksim explore")
    store.home()  # the explorer's own folder: refused now, in one line, if another user could plant files in it
    if not reloader_child:
        if not loopback:
            typer.echo(f"warning: the explorer has no authentication: anyone who can reach {host}:{port} can use "
                       "it, start searches and upload files; listen on 127.0.0.1 (the default) unless the network "
                       "is yours", err=True)
        out.print(f"mksim explorer at http://{host}:{port}/ (Ctrl-C stops it)")
    app_module.create_app().run(host=host, port=port, debug=debug)
    running = require("explorer.jobs", "explorer", "mksim explore").running_jobs()
    if running:  # searches run in processes of their own: they go on, and the next explorer lists them
        say(f"{len(running)} search(es) still run ({', '.join(running)}); the Search page of the next mksim explore "
            "lists them, to follow or cancel")

"""Every callback answers, whatever the browser sends: a request the page would not send gets the page's
one-line error, never HTTP 500, and the server's log gets one line, never the request.

A callback's arguments are whatever JSON the POST to ``/_dash-update-component`` holds: a number where
the page sends text, a list where it sends a dict, a file's contents nested 50,000 deep. The pages check
what they use and raise :class:`mksim.errors.MksimError` with mksim's one line; :func:`guarded` turns that,
and any other exception a value of the wrong type raises, into the callback's error answer. :func:`install`
guards Dash's own routes: a request body that is not a callback of this app answers 400, one that is too
large 413, an unknown script package 404, each with one short line.
"""

from __future__ import annotations

import functools
import json
import logging
import traceback
from collections.abc import Callable
from typing import Any

from flask import Response, request
from werkzeug.exceptions import HTTPException

from mksim.errors import MksimError

log = logging.getLogger("explorer")

#: An error line shown on a page is cut to this many characters (a value the browser sent may be in it).
MAX_LINE = 500


def one_line(text: object, limit: int = MAX_LINE) -> str:
    """The first line of ``text``, at most ``limit`` characters."""
    s = str(text).strip()
    first = s.splitlines()[0] if s else ""
    return first if len(first) <= limit else first[:limit - 1] + "…"


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return f"{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else "?"


def guarded(on_error: Callable[[str], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A callback that never raises: MksimError answers ``on_error("error: <its line>")``; any other
    exception (a value of a type the page never sends) answers ``on_error`` with a line saying so and logs
    one line (the exception's type, where, and its message cut short; never the values)."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except MksimError as exc:
                return on_error(f"error: {one_line(exc)}")
            except Exception as exc:  # noqa: BLE001 - the page's one line instead of an HTTP 500
                if type(exc).__name__ == "PreventUpdate":
                    raise
                log.warning("callback %s refused a request: %s at %s: %s", fn.__name__, type(exc).__name__,
                            _where(exc), one_line(exc, 200))
                return on_error(f"error: the page sent a value of a kind it never sends ({type(exc).__name__}); "
                                "reload the page")
        return wrapper
    return deco


# -- Dash's own routes ---------------------------------------------------------------------------
def _n_outputs(output: str) -> int:
    return len(output[2:-2].split("...")) if output.startswith("..") and output.endswith("..") else 1


def _is_prop(item: Any, pattern: bool) -> bool:
    return (isinstance(item, dict) and isinstance(item.get("property"), str)
            and isinstance(item.get("id"), dict if pattern else str))


def bad_callback_request(body: Any, callback_map: dict[str, Any]) -> str | None:
    """Why ``body`` is not a request the app's pages send to ``/_dash-update-component`` (one short line),
    or ``None`` if it has the form of one: a known ``output``, and ``inputs`` and ``state`` that match that
    callback's, id by id."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    output = body.get("output")
    if not isinstance(output, str) or output not in callback_map:
        return "no callback of this app has that output"
    cb = callback_map[output]
    for key in ("inputs", "state"):
        got, want = body.get(key, []), cb.get(key) or []
        if not isinstance(got, list) or len(got) != len(want):
            return f"its {key} are not the callback's"
        for g, w in zip(got, want, strict=True):
            wid = w.get("id") if isinstance(w, dict) else None
            if isinstance(wid, str) and wid.startswith("{"):  # a pattern: one entry per matching component
                if not (isinstance(g, list) and all(_is_prop(i, True) for i in g)) and not _is_prop(g, True):
                    return f"its {key} are not the callback's"
            elif not (_is_prop(g, False) and g["id"] == wid and g["property"] == w.get("property")):
                return f"its {key} are not the callback's"
    outputs = body.get("outputs")
    n = _n_outputs(output)
    if outputs is not None:
        if isinstance(outputs, dict):
            ok = (n == 1 and _is_prop(outputs, False)) or _is_prop(outputs, True)
        else:
            ok = isinstance(outputs, list) and len(outputs) == n and all(
                _is_prop(o, False) or _is_prop(o, True) or isinstance(o, list) for o in outputs)
        if not ok:
            return "its outputs are not the callback's"
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        return "its changedPropIds are not a list of names"
    return None


def install(app: Any, max_request_bytes: int) -> None:
    """Guard the Dash app's routes (``app.server``, Flask): requests larger than ``max_request_bytes`` answer
    413, a body that is not one of the app's callbacks 400 (:func:`bad_callback_request`), an unknown
    script package or file under ``/_dash-component-suites/`` 404, and any other exception of a callback
    request 400, each with one short line in the answer and one in the log, never the request's body."""
    server = app.server
    server.config["MAX_CONTENT_LENGTH"] = max_request_bytes

    def answer(status: int, line: str) -> Response:
        return Response(f"error: {line}\n", status=status, mimetype="text/plain")

    @server.before_request
    def _check_request() -> Response | None:
        size = request.content_length
        if size is not None and size > max_request_bytes:
            log.warning("refused a request of %d bytes to %s (limit %d)", size, request.path[:100], max_request_bytes)
            return answer(413, f"the request is {size >> 20} MiB, more than the explorer takes "
                               f"({max_request_bytes >> 20} MiB)")
        if request.method == "POST" and request.path.endswith("/_dash-update-component"):
            try:
                body = json.loads(request.get_data(cache=True) or b"null")
            except (ValueError, RecursionError):
                body = None
            except HTTPException:  # too large without a Content-Length
                return answer(413, f"the request is more than the explorer takes ({max_request_bytes >> 20} MiB)")
            why = bad_callback_request(body, app.callback_map)
            if why:
                log.warning("refused a callback request: %s", why)
                return answer(400, f"not a request of the explorer's pages ({why}); reload the page")
        return None

    def _not_found(exc: Exception) -> Response:
        return answer(404, "not found")

    def _unexpected(exc: Exception) -> Any:
        if isinstance(exc, HTTPException):
            return exc
        log.warning("refused %s %s: %s at %s: %s", request.method, request.path[:100], type(exc).__name__,
                    _where(exc), one_line(exc, 200))
        if request.path.endswith("/_dash-update-component"):
            return answer(400, f"the explorer could not answer this request ({type(exc).__name__}); reload the "
                               "page")
        return answer(500, "the explorer could not answer this request")

    try:
        from dash.exceptions import DependencyException
    except ImportError:  # pragma: no cover - every Dash the explorer supports has it
        pass
    else:
        server.register_error_handler(DependencyException, _not_found)
    server.register_error_handler(Exception, _unexpected)

"""The explorer's Dash app: ``create_app()`` registers the pages and a navigation bar.

Dash serves its page for any path; an unknown path still shows a "page not found" page, but with
HTTP status 404 (so links checkers and scripts see it), decided in :func:`is_page_path`. Requests the
pages would never send answer one short line (:func:`explorer.guard.install`): a body larger than
:data:`MAX_REQUEST_BYTES` 413, a body that is not one of the app's callbacks 400, an unknown script
package 404; the callbacks themselves answer bad values with the page's one-line error
(:func:`explorer.guard.guarded`).
"""

from __future__ import annotations

import dash
from dash import Dash, dcc, html
from flask import Response, request

from explorer import guard, stacks
from explorer.pages import compare, hardware, search, timeline, validation

PAGES = (compare, timeline, search, validation, hardware)

#: A request body larger than this is refused (413) before it is read: the largest trace upload, base64-encoded,
#: and room for the callback's other values.
MAX_REQUEST_BYTES = stacks.MAX_UPLOAD_BYTES * 4 // 3 + (4 << 20)

#: Dash's catch-all view, which serves the page for every path that is not one of Dash's own routes.
_CATCH_ALL = "/<path:path>"


def is_page_path(path: str) -> bool:
    """Whether ``path`` (as requested, query string left off) is one of the explorer's pages."""
    return (path.rstrip("/") or "/") in {p.PATH for p in PAGES}


def not_found_layout(**_query: object) -> html.Div:
    """What an unknown path shows (served with HTTP status 404)."""
    return html.Div([html.H2("Page not found"),
                     html.P(["The explorer has no page here. Its pages: "]
                            + [dcc.Link(p.NAME, href=p.PATH, style={"marginRight": "1em"}) for p in PAGES])])


def _status_404(response: Response) -> Response:
    if request.endpoint == _CATCH_ALL and not is_page_path(request.path):
        response.status_code = 404
    return response


def create_app() -> Dash:
    """A multi-page Dash app with the pages of ``PAGES`` and a navigation bar."""
    app = Dash(__name__, use_pages=True, pages_folder="", title="mksim explorer",
               suppress_callback_exceptions=True)
    for page in PAGES:
        dash.register_page(page.__name__, path=page.PATH, name=page.NAME, layout=page.layout)
    dash.register_page("not_found_404", path="/404", name="Page not found", title="Page not found",
                       layout=not_found_layout)
    app.server.after_request(_status_404)
    guard.install(app, MAX_REQUEST_BYTES)
    app.layout = html.Div([
        html.Nav([dcc.Link(p.NAME, href=p.PATH, style={"marginRight": "1em"}) for p in PAGES]
                 + [html.Span("mksim explorer", style={"float": "right", "color": "grey"})],
                 style={"padding": "0.5em", "borderBottom": "1px solid #ddd"}),
        dash.page_container,
    ], style={"fontFamily": "sans-serif"})
    return app

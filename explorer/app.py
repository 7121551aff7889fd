"""The explorer's Dash app: ``create_app()`` registers the pages and a navigation bar."""

from __future__ import annotations

import dash
from dash import Dash, dcc, html

from explorer.pages import compare, hardware, search, timeline, validation

PAGES = (compare, timeline, search, validation, hardware)


def create_app() -> Dash:
    """A multi-page Dash app with the pages of ``PAGES`` and a navigation bar."""
    app = Dash(__name__, use_pages=True, pages_folder="", title="mksim explorer",
               suppress_callback_exceptions=True)
    for page in PAGES:
        dash.register_page(page.__name__, path=page.PATH, name=page.NAME, layout=page.layout)
    app.layout = html.Div([
        html.Nav([dcc.Link(p.NAME, href=p.PATH, style={"marginRight": "1em"}) for p in PAGES]
                 + [html.Span("mksim explorer", style={"float": "right", "color": "grey"})],
                 style={"padding": "0.5em", "borderBottom": "1px solid #ddd"}),
        dash.page_container,
    ], style={"fontFamily": "sans-serif"})
    return app

"""Validation: predicted vs measured from the committed results, with the ±10 % band and per-mode errors."""

from __future__ import annotations

import plotly.graph_objects as go
from dash import Input, Output, callback, dcc, html

from explorer import data, figures
from explorer.guard import guarded
from mksim.errors import MksimError

PATH, NAME = "/validation", "Validation"


def layout() -> html.Div:
    """The page (built on request: no data loaded at import)."""
    sets = data.validation_sets()
    return html.Div([
        html.H2("Validation: predicted vs measured"),
        html.Label(["result set ", dcc.Dropdown(sets, sets[0] if sets else None, id="validation-set",
                                                clearable=False, style={"width": "14em"})]),
        html.P(id="validation-metrics"),
        html.Div([dcc.Graph(id="validation-scatter", style={"display": "inline-block", "width": "49%"}),
                  dcc.Graph(id="validation-errors", style={"display": "inline-block", "width": "49%"})]),
    ])


def show_set(name: str | None) -> tuple:
    """``(metrics line, scatter, per-mode errors)`` of one committed result set; an error line if unknown."""
    try:
        d = data.validation_data(name if isinstance(name, str) else "")
    except MksimError as exc:
        return f"error: {exc}", go.Figure(), go.Figure()
    head = f"{d['gpu']}, {d['date']}, predicted with {d['predicted_with']}: "
    return head + d["metrics_line"], figures.scatter_figure(d), figures.error_figure(d)


@callback(Output("validation-metrics", "children"), Output("validation-scatter", "figure"),
          Output("validation-errors", "figure"), Input("validation-set", "value"))
@guarded(lambda line: (line, go.Figure(), go.Figure()))
def _on_set(name):
    return show_set(name)

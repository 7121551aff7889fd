"""Compare: every execution mode side by side for one model, GPU, batch, KV length and phase."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import Input, Output, State, callback, dcc, html

from explorer import data, figures
from mksim.errors import MksimError

PATH, NAME = "/", "Compare"
GRAPHS = ("compare-latency", "compare-tokens", "compare-hbm", "compare-breakdown")


def layout() -> html.Div:
    """The page (built on request: no data loaded at import)."""
    def field(label: str, comp: Any) -> html.Label:
        return html.Label([label, comp], style={"display": "inline-block", "marginRight": "1em"})

    return html.Div([
        html.H2("Compare execution modes"),
        html.Div([
            field("model ", dcc.Dropdown(data.models(), "llama-3.2-1b", id="compare-model", clearable=False,
                                         style={"width": "14em"})),
            field("GPU ", dcc.Dropdown(data.gpus(), "h200", id="compare-gpu", clearable=False,
                                       style={"width": "14em"})),
            field("batch ", dcc.Input(id="compare-batch", type="number", value=1, step=1)),
            field("KV length ", dcc.Input(id="compare-kv-len", type="number", value=1024, step=1)),
            field("phase ", dcc.Dropdown(["decode", "prefill"], "decode", id="compare-phase", clearable=False,
                                         style={"width": "8em"})),
            html.Button("Run", id="compare-run", n_clicks=0),
        ]),
        html.Div(id="compare-message", role="alert", style={"color": "#b00020", "margin": "0.5em 0"}),
        dcc.Loading(html.Div([dcc.Graph(id=g, style={"display": "inline-block", "width": "49%"})
                              for g in GRAPHS])),
    ])


def _empty() -> go.Figure:
    return go.Figure()


def run_compare(n_clicks: int | None, model: str | None, gpu: str | None, batch: Any, kv_len: Any,
                phase: str | None) -> tuple:
    """Parse the inputs, compare the modes; ``(message, latency, tokens/s, HBM, breakdown)``.

    Bad input answers with mksim's one-line message and empty figures; it never raises.
    """
    try:
        if not model or not gpu or not phase:
            raise MksimError("choose a model, a GPU and a phase")
        try:
            b, kv = int(batch), int(kv_len)
        except (TypeError, ValueError):
            raise MksimError("batch and KV length must be whole numbers") from None
        d = data.compare_data(model, gpu, b, kv, phase)
    except MksimError as exc:
        return (f"error: {exc}", *(_empty() for _ in GRAPHS))
    return ("", figures.latency_figure(d), figures.tokens_figure(d), figures.hbm_figure(d),
            figures.breakdown_figure(d))


@callback(Output("compare-message", "children"), *(Output(g, "figure") for g in GRAPHS),
          Input("compare-run", "n_clicks"), State("compare-model", "value"), State("compare-gpu", "value"),
          State("compare-batch", "value"), State("compare-kv-len", "value"), State("compare-phase", "value"))
def _on_run(n_clicks, model, gpu, batch, kv_len, phase):
    return run_compare(n_clicks, model, gpu, batch, kv_len, phase)

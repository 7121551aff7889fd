"""Compare: every execution mode side by side for one model (built in or an uploaded HF ``config.json``),
GPU, batch, KV length and phase; a results table and the ops on the GPU's roofline."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import Input, Output, State, callback, dcc, html, no_update

import mksim.schedule  # noqa: F401  (the simulator, imported once with the page, not on the first Run)
import mksim.sim  # noqa: F401
from explorer import data, figures
from mksim.errors import MksimError

PATH, NAME = "/", "Compare"
GRAPHS = ("compare-latency", "compare-tokens", "compare-hbm", "compare-breakdown")
#: The model dropdown's value for an uploaded config: this prefix and the config's name.
UPLOADED = "uploaded: "
ROOFLINE_MODES = ("graph", "stream", "graph_pdl", "persistent_barrier", "megakernel")


def layout() -> html.Div:
    """The page (built on request: no data loaded at import)."""
    def field(label: str, comp: Any) -> html.Label:
        return html.Label([label, comp], style={"display": "inline-block", "marginRight": "1em"})

    return html.Div([
        html.H2("Compare execution modes"),
        html.Div([
            field("model ", dcc.Dropdown(data.models(), "llama-3.2-1b", id="compare-model", clearable=False,
                                         style={"width": "16em"})),
            field("GPU ", dcc.Dropdown(data.gpus(), "h200", id="compare-gpu", clearable=False,
                                       style={"width": "14em"})),
            field("batch ", dcc.Input(id="compare-batch", type="number", value=1, step=1)),
            field("KV length ", dcc.Input(id="compare-kv-len", type="number", value=1024, step=1)),
            field("phase ", dcc.Dropdown(["decode", "prefill"], "decode", id="compare-phase", clearable=False,
                                         style={"width": "8em"})),
            html.Button("Run", id="compare-run", n_clicks=0),
        ]),
        html.Div([
            dcc.Upload(["or drop a Hugging Face ", html.Code("config.json"), " here, or ", html.A("choose one")],
                       id="compare-upload", accept=".json,application/json", multiple=False,
                       style={"display": "inline-block", "marginRight": "1em", "padding": "0.4em 1em",
                              "border": "1px dashed #999", "borderRadius": "4px", "cursor": "pointer"}),
            html.Span(id="compare-upload-message", role="status"),
        ], style={"margin": "0.5em 0"}),
        dcc.Store(id="compare-config"),
        dcc.Store(id="compare-result"),
        html.Div(id="compare-message", role="alert", style={"color": "#b00020", "margin": "0.5em 0"}),
        dcc.Loading([
            html.Div(id="compare-table"),
            html.Div([dcc.Graph(id=g, style={"display": "inline-block", "width": "49%"}) for g in GRAPHS]),
        ]),
        html.Div([
            html.Label(["roofline of the ops as simulated in ",
                        dcc.Dropdown(list(ROOFLINE_MODES), "graph", id="compare-roofline-mode", clearable=False,
                                     style={"width": "14em", "display": "inline-block", "verticalAlign": "middle"})]),
            dcc.Graph(id="compare-roofline", style={"height": "520px"}),
        ]),
    ])


def _empty() -> go.Figure:
    return go.Figure()


def absent_note(d: dict[str, Any]) -> html.Ul | None:
    """The modes the GPU cannot run and why (``d["absent"]``), as a list under the table; ``None`` if none."""
    absent = d.get("absent") or {}
    if not absent:
        return None
    return html.Ul([html.Li([html.Code(mode), f" left out: {why}"], **{"data-mode": mode})
                    for mode, why in absent.items()], id="compare-absent", style={"margin": "0.2em 0"})


def results_table(d: dict[str, Any]) -> html.Div:
    """The comparison as an accessible table: one row per mode (latency, tokens/s, HBM utilisation, speed-up),
    then the modes the GPU cannot run, with the reason (:func:`absent_note`)."""
    head = ("mode", "latency (µs)", "tokens/s", "HBM utilisation", "vs stream")
    cell = {"padding": "0.2em 0.8em", "textAlign": "right"}
    rows = [html.Tr([html.Th(mode, scope="row", style={"textAlign": "left"}),
                     *(html.Td(v, style=cell) for v in (f"{r['latency_us']:.1f}", f"{r['tokens_per_s']:.0f}",
                                                        f"{r['hbm_util']:.1%}", f"{r['speedup_vs_stream']:.2f}×"))],
                    **{"data-mode": mode})
            for mode, r in d["modes"].items()]
    table = html.Table([
        html.Caption(f"{d['workload']} on {d['gpu']}: bandwidth floor {d['bandwidth_floor_us']:.1f} µs",
                     style={"textAlign": "left", "fontWeight": "bold"}),
        html.Thead(html.Tr([html.Th(h, scope="col", style=cell) for h in head])),
        html.Tbody(rows),
    ], id="compare-results", style={"borderCollapse": "collapse", "margin": "0.5em 0"})
    note = absent_note(d)
    return html.Div([table] if note is None else [table, note])


def run_compare(n_clicks: int | None, model: str | None, gpu: str | None, batch: Any, kv_len: Any,
                phase: str | None, config: dict[str, Any] | None = None) -> tuple:
    """Parse the inputs, compare the modes; ``(message, latency, tokens/s, HBM, breakdown, table, result)``.

    ``model`` is a built-in name, or :data:`UPLOADED` + a name with ``config`` the uploaded config
    (what :func:`upload_config` stored). ``result`` is the comparison's data (for the roofline).
    Bad input answers with mksim's one-line message, empty figures and no table; it never raises.
    """
    try:
        if not model or not gpu or not phase:
            raise MksimError("choose a model, a GPU and a phase")
        try:
            b, kv = int(batch), int(kv_len)
        except (TypeError, ValueError):
            raise MksimError("batch and KV length must be whole numbers") from None
        cfg = None
        if model.startswith(UPLOADED):
            if not config or config.get("name") != model.removeprefix(UPLOADED):
                raise MksimError("the uploaded config is gone; upload it again")
            model, cfg = config["name"], config["config"]
        d = data.compare_run(model, gpu, b, kv, phase, config=cfg)
    except MksimError as exc:
        return (f"error: {exc}", *(_empty() for _ in GRAPHS), None, None)
    return ("", figures.latency_figure(d), figures.tokens_figure(d), figures.hbm_figure(d),
            figures.breakdown_figure(d), results_table(d), d)


def upload_config(contents: str | None, filename: str | None) -> tuple:
    """Read an uploaded config: ``(message, stored config, model options, model value)``.

    A good config becomes a model option (:data:`UPLOADED` + its name) and is selected; a bad one
    answers with mksim's one-line message and leaves the model as it was.
    """
    if not contents:
        return "", no_update, no_update, no_update
    try:
        up = data.parse_config_upload(contents, filename)
    except MksimError as exc:
        return html.Span(f"error: {exc}", style={"color": "#b00020"}), None, data.models(), no_update
    label = UPLOADED + up["name"]
    return f"loaded {up['summary']}", up, [*data.models(), label], label


def roofline(result: dict[str, Any] | None, mode: str | None) -> go.Figure:
    """The roofline figure of a stored comparison in ``mode`` (empty before the first good Run)."""
    if not result or mode is None or mode not in result.get("modes", {}):
        return _empty()
    return figures.roofline_figure(data.roofline_data(result, mode))


def roofline_modes(result: dict[str, Any] | None, mode: str | None) -> tuple[list[str], str]:
    """The roofline's mode choices (those the comparison ran, in :data:`ROOFLINE_MODES`' order) and its
    value (``mode``, or the first choice where the GPU lacks ``mode``)."""
    ran = (result or {}).get("modes")
    choices = [m for m in ROOFLINE_MODES if ran is None or m in ran]
    return choices, mode if mode in choices else choices[0]


@callback(Output("compare-roofline-mode", "options"), Output("compare-roofline-mode", "value"),
          Input("compare-result", "data"), State("compare-roofline-mode", "value"))
def _on_result(result, mode):
    return roofline_modes(result, mode)


@callback(Output("compare-message", "children"), *(Output(g, "figure") for g in GRAPHS),
          Output("compare-table", "children"), Output("compare-result", "data"),
          Input("compare-run", "n_clicks"), State("compare-model", "value"), State("compare-gpu", "value"),
          State("compare-batch", "value"), State("compare-kv-len", "value"), State("compare-phase", "value"),
          State("compare-config", "data"))
def _on_run(n_clicks, model, gpu, batch, kv_len, phase, config):
    return run_compare(n_clicks, model, gpu, batch, kv_len, phase, config)


@callback(Output("compare-upload-message", "children"), Output("compare-config", "data"),
          Output("compare-model", "options"), Output("compare-model", "value"),
          Input("compare-upload", "contents"), State("compare-upload", "filename"), prevent_initial_call=True)
def _on_upload(contents, filename):
    return upload_config(contents, filename)


@callback(Output("compare-roofline", "figure"), Input("compare-result", "data"),
          Input("compare-roofline-mode", "value"))
def _on_roofline(result, mode):
    return roofline(result, mode)

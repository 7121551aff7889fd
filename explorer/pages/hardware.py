"""Hardware: every GPU's numbers side by side (unit and source each), and what-if sliders that re-run the
comparison with overridden hardware ("what if launches were free?")."""

from __future__ import annotations

from html import escape
from typing import Any

import plotly.graph_objects as go
from dash import Input, Output, callback, dcc, html

from explorer import data, figures
from explorer.guard import guarded
from explorer.hwdata import WhatIf, hardware_table
from mksim.errors import MksimError
from mksim.target import gpu_spec

PATH, NAME = "/hardware", "Hardware"
#: What-if sliders: id -> (label, min, max, step, marks); each value multiplies the GPU's numbers.
SLIDERS = {
    "hardware-launch": ("launch costs ×", 0.0, 2.0, 0.05, {0: "0", 0.5: "½", 1: "1", 1.5: "1½", 2: "2"}),
    "hardware-hbm": ("HBM bandwidth ×", 0.25, 4.0, 0.25, {0.25: "¼", 1: "1", 2: "2", 3: "3", 4: "4"}),
    "hardware-sync": ("grid barrier and flag costs ×", 0.0, 2.0, 0.05,
                      {0: "0", 0.5: "½", 1: "1", 1.5: "1½", 2: "2"}),
    "hardware-sms": ("SM count ×", 0.25, 2.0, 0.05, {0.25: "¼", 0.5: "½", 1: "1", 1.5: "1½", 2: "2"}),
}
DEFAULTS = {s: 1.0 for s in SLIDERS}
_CELL = "padding:0.15em 0.6em;text-align:right;border-bottom:1px solid #eee"  # CSS of a number's cell


def _field(label: str, comp: Any) -> html.Label:
    return html.Label([label, comp], style={"display": "inline-block", "marginRight": "1em"})


def _slider(sid: str) -> html.Div:
    label, lo, hi, step, marks = SLIDERS[sid]
    return html.Div([html.Label(label, htmlFor=sid),
                     dcc.Slider(lo, hi, step, value=DEFAULTS[sid], marks=marks, id=sid)],
                    style={"display": "inline-block", "width": "45%", "margin": "0 2% 1em 1%", "verticalAlign": "top"})


def layout() -> html.Div:
    """The page (built on request: no data loaded at import)."""
    gpus = data.gpus()
    numbers = [
        html.H2("Hardware models"),
        html.P(["Every number of every hardware file (", html.Code("hwmodels/data/"), ", calibrated overlays in ",
                html.Code("hwmodels/calibrated/"), ") with its unit and source: hover a number for its source, "
                "the references are listed below the table. * an estimate, not yet measured; bold: changed by a "
                "calibrated overlay from the file it extends; – not on that GPU."]),
        _field("GPUs ", dcc.Dropdown(gpus, gpus, id="hardware-gpus", multi=True, style={"minWidth": "40em"})),
        html.Div(id="hardware-table", style={"overflowX": "auto", "margin": "0.5em 0"}),
        html.Details([html.Summary("sources"), html.Div(id="hardware-sources")]),
    ]
    whatif = html.Div(id="hardware-whatif-section", children=[
        html.H3("What if?"),
        html.P("Move a slider to re-run every mode with that GPU's numbers scaled: launch costs (stream, graph and "
               "PDL launches, launch latency, block set-up), HBM bandwidth (the datasheet figure; the reachable "
               "fraction stays), the persistent kernels' grid barrier and flag latency, and the SM count (each SM "
               "keeps its compute and L2 share; HBM bandwidth does not grow with it)."),
        html.Div([
            _field("model ", dcc.Dropdown(data.models(), "llama-3.2-1b", id="hardware-model", clearable=False,
                                          style={"width": "14em"})),
            _field("GPU ", dcc.Dropdown(gpus, "h200", id="hardware-gpu", clearable=False, style={"width": "14em"})),
            _field("batch ", dcc.Input(id="hardware-batch", type="number", value=1, step=1, debounce=True)),
            _field("KV length ", dcc.Input(id="hardware-kv-len", type="number", value=1024, step=1, debounce=True)),
            html.Button("Reset", id="hardware-reset", n_clicks=0),
        ]),
        html.Div([_slider(s) for s in SLIDERS], style={"margin": "1em 0"}),
        html.Div(id="hardware-message", role="alert", style={"color": "#b00020", "margin": "0.5em 0"}),
        dcc.Loading([html.Div(id="hardware-changes"), html.Div(id="hardware-whatif-table"),
                     dcc.Graph(id="hardware-whatif", style={"height": "400px"})]),
    ])
    return html.Div([*numbers, whatif])


def _fmt(v: float | int) -> str:
    return f"{v:g}"


def _tag(name: str, content: str, **attrs: str) -> str:
    """An HTML element: ``content`` is HTML already (escaped by the caller), the attributes are escaped here."""
    shown = "".join(f' {key}="{escape(value)}"' for key, value in attrs.items())
    return f"<{name}{shown}>{content}</{name}>"


def gpu_table_html(names: list[str] | None) -> tuple[str, str]:
    """``(table, sources)`` as HTML text: the chosen GPUs' numbers side by side (all GPUs when none chosen),
    and the numbered list of their sources. Every text from the hardware files is escaped; a source's link
    is kept only when it is an http(s) URL."""
    d = hardware_table(list(names) if names else None)
    refs = {s["ref"]: s for s in d["sources"]}
    head = _tag("th", "key", scope="col") + _tag("th", "unit", scope="col") + "".join(
        _tag("th", escape(g["name"]) + (f"<br/><small>extends {escape(g['extends'])}</small>" if g["extends"] else ""),
             scope="col", title=g["full_name"], style=_CELL) for g in d["gpus"])
    rows = []
    for r in d["rows"]:
        cells = []
        for g in d["gpus"]:
            c = r["cells"][g["name"]]
            if c is None:
                cells.append(_tag("td", "–", style=_CELL))
                continue
            s = refs[c["ref"]]
            tip = f"[{c['ref']}] {s['kind']}{', ' + s['date'] if s['date'] else ''}: {s['title']}"
            text = escape(_fmt(c["value"]) + ("*" if c["estimate"] else ""))
            cells.append(_tag("td", text + _tag("sup", f"[{c['ref']}]", style="color:grey"), title=tip,
                              style=_CELL + (";font-weight:bold" if c["overlay"] else "")))
        rows.append(_tag("tr", _tag("th", _tag("code", escape(r["key"])), scope="row", style="text-align:left")
                         + _tag("td", escape(r["unit"]), style="color:grey;padding:0 0.6em") + "".join(cells)))
    table = _tag("table", _tag("thead", _tag("tr", head)) + _tag("tbody", "".join(rows)), id="hardware-numbers",
                 style="border-collapse:collapse;font-size:90%")
    items = []
    for s in d["sources"]:
        link = f" {_tag('a', escape(s['url']), href=s['url'], target='_blank')}" if _is_web(s["url"]) else ""
        items.append(_tag("li", _tag("b", escape(s["gpu"]))
                          + escape(f" · {s['kind']}{', ' + s['date'] if s['date'] else ''}: {s['title']}")
                          + link + (escape(f" — {s['note']}") if s["note"] else ""),
                          value=str(s["ref"]), id=f"hardware-source-{s['ref']}"))
    return table, _tag("ol", "".join(items), id="hardware-sources-list")


def _is_web(url: str | None) -> bool:
    return bool(url) and str(url).lower().startswith(("https://", "http://"))


def gpu_table(names: list[str] | None) -> tuple[dcc.Markdown, dcc.Markdown]:
    """``(table, sources)`` of the chosen GPUs (:func:`gpu_table_html`), each one component.

    Why HTML text in one ``dcc.Markdown``, not Dash's ``html.Table`` of cells: the nine GPUs' table and its
    sources were about 1,550 Dash components, which Dash's renderer took 13 s to draw in headless Chromium
    on the 2-core development machine (over 20 s with the rest of the page, 2026-12-03); as one component
    whose HTML the browser builds itself it is drawn in about a second. The text is this module's own, every
    value escaped."""
    table, sources = gpu_table_html(names)
    return (dcc.Markdown(table, dangerously_allow_html=True), dcc.Markdown(sources, dangerously_allow_html=True))


def whatif_table(d: dict[str, Any]) -> html.Table:
    """Latency per mode as specified and with the what-if, and the change, as an accessible table."""
    cell = {"padding": "0.2em 0.8em", "textAlign": "right"}
    rows = []
    for mode in d["base"]["modes"]:
        a, b = d["base"]["modes"][mode]["latency_us"], d["whatif"]["modes"][mode]["latency_us"]
        rows.append(html.Tr([html.Th(mode, scope="row", style={"textAlign": "left"}), html.Td(f"{a:.1f}", style=cell),
                             html.Td(f"{b:.1f}", style=cell), html.Td(f"{(b / a - 1):+.1%}", style=cell)],
                            **{"data-mode": mode}))
    head = html.Tr([html.Th(h, scope="col", style=cell)
                    for h in ("mode", "as specified (µs)", "what-if (µs)", "change")])
    return html.Table([html.Thead(head), html.Tbody(rows)], id="hardware-whatif-results",
                      style={"borderCollapse": "collapse", "margin": "0.5em 0"})


def run_whatif(model: str | None, gpu: str | None, batch: Any, kv_len: Any, launch: float | None = 1.0,
               hbm: float | None = 1.0, sync: float | None = 1.0, sms: float | None = 1.0) -> tuple:
    """``(message, changes, what-if table, figure)`` for the sliders' values (multipliers of the GPU's launch
    costs, HBM bandwidth, barrier and flag costs, SM count); bad input answers with mksim's one-line
    message and an empty figure, never raises."""
    try:
        if not model or not gpu:
            raise MksimError("choose a model and a GPU")
        b, kv = data.whole_number(batch, "batch"), data.whole_number(kv_len, "KV length")
        data.check_model(model)
        base_sms = gpu_spec(data.check_gpu(gpu)).sm.count

        def num(v: Any) -> float:
            if v is None:  # a slider's box left empty: as specified
                return 1.0
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1e6:
                raise MksimError("a what-if slider's value must be a number between its ends")
            return float(v)

        w = WhatIf(launch_scale=num(launch), hbm_scale=num(hbm), sync_scale=num(sync),
                   sm_count=max(1, round(base_sms * num(sms))))
        d = data.whatif_data(model, gpu, w, b, kv)
    except MksimError as exc:
        return f"error: {exc}", None, None, go.Figure()
    changes: html.Ul | html.P
    if d["changes"]:
        changes = html.Ul([html.Li([html.Code(c["key"]), f": {_fmt(c['base'])} → {c['new']:.4g} {c['unit']}"])
                           for c in d["changes"]], id="hardware-changed")
    else:
        changes = html.P("No overrides: the GPU as its data file gives it. Move a slider to ask a what-if.",
                         id="hardware-changed")
    return "", changes, whatif_table(d), figures.whatif_figure(d)


@callback(Output("hardware-table", "children"), Output("hardware-sources", "children"),
          Input("hardware-gpus", "value"))
@guarded(lambda line: (html.P(line, role="alert", style={"color": "#b00020"}), []))
def _on_gpus(names):
    return gpu_table(names)


@callback(*(Output(s, "value") for s in SLIDERS), Input("hardware-reset", "n_clicks"), prevent_initial_call=True)
@guarded(lambda line: tuple(DEFAULTS[s] for s in SLIDERS))
def _on_reset(_):
    return tuple(DEFAULTS[s] for s in SLIDERS)


@callback(Output("hardware-message", "children"), Output("hardware-changes", "children"),
          Output("hardware-whatif-table", "children"), Output("hardware-whatif", "figure"),
          Input("hardware-model", "value"), Input("hardware-gpu", "value"), Input("hardware-batch", "value"),
          Input("hardware-kv-len", "value"), *(Input(s, "value") for s in SLIDERS))
@guarded(lambda line: (line, None, None, go.Figure()))
def _on_whatif(model, gpu, batch, kv_len, launch, hbm, sync, sms):
    return run_whatif(model, gpu, batch, kv_len, launch, hbm, sync, sms)

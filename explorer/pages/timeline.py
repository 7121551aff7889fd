"""Timeline: the per-SM Gantt chart of one simulated step (a mode's default schedule, or a schedule file)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import plotly.graph_objects as go
from dash import Input, Output, State, callback, ctx, dcc, html, no_update

from explorer import data, figures, store
from explorer.guard import guarded
from mksim.errors import MksimError
from mksim.schedule import MODES, POLICIES, modes_on
from mksim.target import gpu_spec
from mksim.workload.step import PHASES

PATH, NAME = "/timeline", "Timeline"


def layout(schedule: str | None = None, **_query: Any) -> html.Div:
    """The page (built on request). ``/timeline?schedule=<token>`` shows a schedule the Search page kept."""
    def field(label: str, comp: Any) -> html.Label:
        return html.Label([label, comp], style={"display": "inline-block", "marginRight": "1em"})

    def dropdown(options: Any, value: Any, id_: str, width: str = "14em", **kw: Any) -> dcc.Dropdown:
        return dcc.Dropdown(options, value, id=id_, style={"width": width}, **kw)

    return html.Div([
        html.H2("Timeline: one step, SM by SM"),
        html.Div([
            field("model ", dropdown(data.models(), "llama-3.2-1b", "timeline-model", clearable=False)),
            field("GPU ", dropdown(data.gpus(), "h200", "timeline-gpu", clearable=False)),
            field("batch ", dcc.Input(id="timeline-batch", type="number", value=1, step=1)),
            field("KV length ", dcc.Input(id="timeline-kv-len", type="number", value=1024, step=1)),
            field("phase ", dropdown(list(PHASES), "decode", "timeline-phase", "8em", clearable=False)),
            field("prefill tokens ", dcc.Input(id="timeline-prefill-tokens", type="number", value=128, step=1,
                                               style={"width": "5em"})),
            field("mode ", dropdown(mode_options("h200")[0], "megakernel", "timeline-mode", "12em",
                                    clearable=False)),
            field("policy ", dropdown(sorted(POLICIES), None, "timeline-policy", "8em", placeholder="default")),
            html.Button("Run", id="timeline-run", n_clicks=0),
        ]),
        html.P(id="timeline-mode-note", style={"color": "grey", "margin": "0.3em 0"}),
        html.Div([
            dcc.Upload(html.Button("Simulate a schedule file…"), id="timeline-upload", accept=".json",
                       style={"display": "inline-block", "marginRight": "1em"}),
            html.Button("Download schedule JSON", id="timeline-save", n_clicks=0, style={"marginRight": "0.5em"}),
            html.Button("Download Perfetto trace", id="timeline-trace", n_clicks=0),
            dcc.Download(id="timeline-save-file"), dcc.Download(id="timeline-trace-file"),
        ], style={"margin": "0.5em 0"}),
        dcc.Store(id="timeline-token", data=schedule),
        dcc.Store(id="timeline-schedule"),
        html.Div(id="timeline-message", role="alert", style={"color": "#b00020", "margin": "0.5em 0"}),
        html.P(id="timeline-summary", style={"color": "#444"}),
        dcc.Loading(dcc.Graph(id="timeline-graph", config={"scrollZoom": True, "displaylogo": False},
                              style=graph_style(figures.timeline_height(_expected_sms(schedule))))),
    ])


def _expected_sms(token: str | None) -> int:
    """The SM count of the chart the page will draw first: the GPU of the schedule kept under ``token``, else
    the default h200's."""
    sms = gpu_spec("h200").sm.count
    text = store.get_schedule(token) if isinstance(token, str) else None
    if text:
        with contextlib.suppress(ValueError, TypeError, KeyError, MksimError):
            sms = gpu_spec(data.check_gpu(json.loads(text)["gpu"])).sm.count
    return sms


def graph_style(height_px: int | None) -> dict[str, str]:
    """The chart's box: ``height_px`` tall (the chart's own height, :func:`explorer.figures.timeline_height`), or
    the default size for a chart without a height (none drawn).

    Why the page sets it: a chart taller than its box grows the box as it is drawn, and dcc.Graph then draws
    it again at the new size; in a browser without a GPU (WebGL in software) that second drawing of the
    26,000 bars cost 2-4 s of CPU (headless Chromium, 2026-12-03). A box already the chart's height is drawn
    into once: the page starts with the height of the chart it draws first, and each chart sets it anew."""
    return {"height": f"{int(height_px)}px"} if height_px else {}


def _int(value: Any, what: str) -> int:
    return data.whole_number(value, what)


def mode_options(gpu: str | None, current: str | None = None) -> tuple[list[dict[str, Any]], str, str]:
    """``(options, value, note)`` of the mode menu for ``gpu`` (:func:`mksim.schedule.modes_on`): the modes
    it cannot run are shown disabled with the reason (hover, and ``note``); ``value`` keeps ``current``
    where the GPU runs it, else the megakernel. An unknown GPU offers every mode (running says why)."""
    try:
        _avail, why = modes_on(gpu_spec(data.check_gpu(gpu)))
    except MksimError:
        why = {}
    options = [{"label": m, "value": m} if m not in why
               else {"label": f"{m} (not on {gpu})", "value": m, "disabled": True, "title": why[m]} for m in MODES]
    value = current if current is not None and current in MODES and current not in why else "megakernel"
    return options, value, "; ".join(f"{m}: {r}" for m, r in why.items() if m in MODES)


def _uploaded(contents: str, filename: str | None) -> str:
    """The text of a dcc.Upload's ``data:...;base64,...`` contents."""
    name = data.upload_name(filename, "the upload")
    try:
        return data.upload_bytes(contents, name).decode("utf-8")
    except UnicodeDecodeError:
        raise MksimError(f"cannot read {name}: not a text file (not UTF-8)") from None


def show_timeline(trigger: str | None, model: str | None, gpu: str | None, batch: Any, kv_len: Any,
                  phase: str | None, mode: str | None, policy: str | None, upload: str | None = None,
                  filename: str | None = None, token: str | None = None, prefill_tokens: Any = 128) -> tuple:
    """``(message, summary, figure, schedule JSON)`` for what ``trigger`` (the component id that fired)
    asks for: an uploaded schedule file, a schedule kept under ``token`` (from Search), else the form
    (``prefill_tokens`` counts in the prefill phase only).

    Bad input answers with a one-line error, an empty figure and no schedule; it never raises.
    """
    try:
        if trigger == "timeline-upload" and upload:
            source = f"schedule file {data.upload_name(filename, '')}".strip()
            d = data.timeline_data(schedule=_uploaded(upload, filename))
        elif token and trigger in (None, "timeline-token"):
            text = store.get_schedule(token)
            if text is None:
                shown = repr(token)[:60] if isinstance(token, str) else f"a {type(token).__name__}"
                raise MksimError(f"no schedule kept under {shown} on this server; open it again from Search")
            source = "schedule from Search"
            d = data.timeline_data(schedule=text)
        else:
            if not model or not gpu or not phase or not mode:
                raise MksimError("choose a model, a GPU, a phase and a mode")
            if phase not in PHASES or mode not in MODES or not (policy is None or policy in POLICIES):
                raise MksimError(f"choose a phase ({', '.join(PHASES)}), a mode ({', '.join(MODES)}) and a policy "
                                 f"({', '.join(sorted(POLICIES))}) of the lists")
            source = "default schedule"
            new = _int(prefill_tokens, "prefill tokens") if phase == "prefill" else 0
            d = data.timeline_data(model, gpu, _int(batch, "batch"), _int(kv_len, "KV length"), phase, mode,
                                   policy or None, prefill_tokens=new)
    except MksimError as exc:
        return f"error: {exc}", "", go.Figure(), None
    waits = {k: sum(1 for w in d["waits"]["kind"] if w == k) for k in d["wait_kinds"]}
    summary = (f"{source}: {d['workload']} on {d['gpu']}, {d['mode']}"
               + (f" ({d['policy']})" if d["policy"] else "") + f", {d['latency_us']:.1f} µs, {d['n_tasks']} tasks"
               f" on {len(d['tracks'])} SMs; " + ", ".join(f"{n} {k}s" for k, n in waits.items() if n)
               + ". Drag to zoom, double-click to reset, hover a bar for its task.")
    return "", summary, figures.timeline_figure(d), d["schedule_json"]


def schedule_download(n_clicks: int | None, schedule_json: str | None) -> Any:
    """The schedule file for dcc.Download (what ``mksim simulate --schedule`` reads); nothing before a run."""
    if not n_clicks or not isinstance(schedule_json, str):
        return no_update
    return {"content": schedule_json, "filename": "schedule.json", "type": "application/json"}


def trace_download(n_clicks: int | None, schedule_json: str | None) -> Any:
    """The schedule's Chrome trace for dcc.Download (opens in https://ui.perfetto.dev); nothing before a run."""
    if not n_clicks or not isinstance(schedule_json, str):
        return no_update
    try:
        trace = data.perfetto_trace(schedule_json)
    except MksimError:
        return no_update
    return {"content": trace, "filename": "mksim-trace.json", "type": "application/json"}


@callback(Output("timeline-message", "children"), Output("timeline-summary", "children"),
          Output("timeline-graph", "figure"), Output("timeline-schedule", "data"), Output("timeline-graph", "style"),
          Input("timeline-run", "n_clicks"), Input("timeline-upload", "contents"), Input("timeline-token", "data"),
          State("timeline-model", "value"), State("timeline-gpu", "value"), State("timeline-batch", "value"),
          State("timeline-kv-len", "value"), State("timeline-phase", "value"), State("timeline-mode", "value"),
          State("timeline-policy", "value"), State("timeline-upload", "filename"),
          State("timeline-prefill-tokens", "value"))
@guarded(lambda line: (line, "", go.Figure(), None, graph_style(None)))
def _on_run(n_clicks, upload, token, model, gpu, batch, kv_len, phase, mode, policy, filename, prefill_tokens):
    msg, summary, fig, schedule = show_timeline(ctx.triggered_id, model, gpu, batch, kv_len, phase, mode, policy,
                                                upload, filename, token, prefill_tokens)
    return msg, summary, fig, schedule, graph_style(fig.layout.height)


@callback(Output("timeline-mode", "options"), Output("timeline-mode", "value"),
          Output("timeline-mode-note", "children"), Input("timeline-gpu", "value"), State("timeline-mode", "value"))
@guarded(lambda line: (no_update, no_update, line))
def _on_gpu(gpu, mode):
    return mode_options(gpu, mode)


@callback(Output("timeline-save-file", "data"), Input("timeline-save", "n_clicks"),
          State("timeline-schedule", "data"), prevent_initial_call=True)
@guarded(lambda line: no_update)
def _on_save(n_clicks, schedule_json):
    return schedule_download(n_clicks, schedule_json)


@callback(Output("timeline-trace-file", "data"), Input("timeline-trace", "n_clicks"),
          State("timeline-schedule", "data"), prevent_initial_call=True)
@guarded(lambda line: no_update)
def _on_trace(n_clicks, schedule_json):
    return trace_download(n_clicks, schedule_json)

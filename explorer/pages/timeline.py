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
MOE_NOTE = ("Mixture-of-experts models only (qwen3-30b-a3b, olmoe-1b-7b, mixtral-8x7b): the routing model "
            "(uniform, or zipf:S, S > 0: the larger, the more skewed) says which experts the tokens pick, and an MoE "
            "design which SM runs which expert tile (megakernel only); a dense model ignores the routing. Expert tasks "
            "are named by their expert (L3.experts_down e17 t2); colour by expert, then click an expert in the legend "
            "to hide it, double-click to show it alone. The colour applies at the next Run.")


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
        html.Div([
            field("routing ", dcc.Input(id="timeline-routing", type="text", value="uniform", debounce=True,
                                        maxLength=data.MAX_ROUTING_CHARS, placeholder="uniform or zipf:1.2",
                                        style={"width": "9em"})),
            field("MoE design ", dropdown(list(data.moe_design_rows()), None, "timeline-design", "18em",
                                          placeholder="none")),
            field("tp ", dcc.Input(id="timeline-tp", type="number", value=1, min=1, step=1, style={"width": "4em"})),
            field("ep ", dcc.Input(id="timeline-ep", type="number", value=1, min=1, step=1, style={"width": "4em"})),
            field("colour by ", dcc.RadioItems([{"label": " op kind ", "value": "kind"},
                                                {"label": " expert", "value": "expert"}], "kind",
                                               id="timeline-colour", inline=True)),
        ], style={"marginTop": "0.4em"}),
        html.P(MOE_NOTE, id="timeline-moe-note", style={"color": "grey", "margin": "0.3em 0"}),
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
        html.Div(id="timeline-moe"),
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
                  filename: str | None = None, token: str | None = None, prefill_tokens: Any = 128,
                  routing: Any = None, design: Any = None, colour_by: Any = "kind", tp: Any = 1, ep: Any = 1) -> tuple:
    """``(message, summary, figure, schedule JSON)`` for what ``trigger`` (the component id that fired)
    asks for: an uploaded schedule file, a schedule kept under ``token`` (from Search), else the form
    (``prefill_tokens`` counts in the prefill phase only; ``routing``, ``design``, ``colour_by``, ``tp`` and
    ``ep`` as :func:`timeline_view` takes them).

    Bad input answers with a one-line error, an empty figure and no schedule; it never raises.
    """
    return timeline_view(trigger, model, gpu, batch, kv_len, phase, mode, policy, upload, filename, token,
                         prefill_tokens, routing, design, colour_by, tp, ep)[:4]


def timeline_view(trigger: str | None, model: str | None, gpu: str | None, batch: Any, kv_len: Any,
                  phase: str | None, mode: str | None, policy: str | None, upload: str | None = None,
                  filename: str | None = None, token: str | None = None, prefill_tokens: Any = 128,
                  routing: Any = None, design: Any = None, colour_by: Any = "kind", tp: Any = 1, ep: Any = 1) -> tuple:
    """:func:`show_timeline`'s four and the MoE view (:func:`moe_view`; ``None`` for a dense step).
    ``routing`` is a mixture of experts' routing model (``uniform``, ``zipf:S``: :func:`explorer.data.check_routing`;
    a dense model ignores it), ``design`` a row of :func:`explorer.data.moe_design_rows` (``None``: none),
    ``colour_by`` ``kind`` or ``expert`` (:func:`explorer.figures.timeline_figure`), ``tp`` and ``ep`` the GPUs
    the step is split over (:func:`explorer.data.check_split`: the summary then says the communication's share)."""
    try:
        if colour_by not in (None, "kind", "expert"):
            raise MksimError("colour by: choose op kind or expert")
        if design is not None and not isinstance(design, str):
            raise MksimError("MoE design: choose none or a design of the list")
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
                                   policy or None, prefill_tokens=new, routing=data.check_routing(routing),
                                   design=design or None, tp=tp, ep=ep)
    except MksimError as exc:
        return f"error: {exc}", "", go.Figure(), None, None
    waits = {k: sum(1 for w in d["waits"]["kind"] if w == k) for k in d["wait_kinds"]}
    summary = (f"{source}: {d['workload']} on {d['gpu']}, {d['mode']}"
               + (f" ({d['policy']})" if d["policy"] else "") + f", {d['latency_us']:.1f} µs, {d['n_tasks']} tasks"
               f" on {len(d['tracks'])} SMs; " + ", ".join(f"{n} {k}s" for k, n in waits.items() if n)
               + (f"; communication {comm:.1f} µs ({comm / d['latency_us']:.1%} of the step: the collective ops' span)"
                  if (comm := d.get("communication_us")) is not None else "")
               + ". Drag to zoom, double-click to reset, hover a bar for its task.")
    return "", summary, figures.timeline_figure(d, colour_by or "kind"), d["schedule_json"], moe_view(d)


def moe_view(d: dict[str, Any]) -> html.Div | None:
    """A mixture of experts' step (:func:`explorer.data.timeline_data`): its routing (the distinct experts a
    layer's tokens picked: expected, and drawn in this step), and what each MoE design on reported, per MoE
    layer: the expert tiles, the most on one SM and the mean over the SMs (their ratio, the imbalance) and the
    top-k's serial time (the router's end to the top-k's end). ``None`` for a dense step."""
    moe = d.get("moe")
    if not moe:
        return None
    parts: list[Any] = [html.P(
        f"routing {moe['routing']}: {moe['expected_active_experts']:.1f} distinct experts a layer expected "
        f"(± {moe['active_experts_std']:.1f}), {moe['active_experts']:.1f} drawn in this step "
        f"({moe['active_experts_min']}–{moe['active_experts_max']}) over {moe['moe_layers']} MoE layers",
        id="timeline-moe-routing", style={"margin": "0.2em 0"})]
    cell = {"padding": "0.1em 0.6em", "textAlign": "right"}
    head = ("layer", "active experts", "expert tiles", "most on one SM", "mean per SM", "imbalance", "top-k µs")
    for name, st in (d.get("design_stats") or {}).items():
        layers = st.get("layers") if isinstance(st, dict) else None
        if not layers or "imbalance" not in layers[0]:
            continue
        rows = [html.Tr([html.Td(v, style=cell) for v in (
            str(x["layer"]), str(x["active"]), str(x["tiles"]), str(x["max_tiles_per_sm"]),
            f"{x['mean_tiles_per_sm']:.2f}", f"{x['imbalance']:.2f}",
            "–" if x["topk_us"] is None else f"{x['topk_us']:.2f}")])
            for x in layers]
        caption = (f"{name}: expert tiles per SM, mean imbalance {st['mean_imbalance']:.2f}; the top-k's serial time "
                   f"{st['topk_us']:.1f} µs over the step")
        parts.append(html.Details([
            html.Summary(caption),
            html.Table([html.Thead(html.Tr([html.Th(h, scope="col", style=cell) for h in head])),
                        html.Tbody(rows)], style={"borderCollapse": "collapse"})],
            id=f"timeline-moe-{name}", **{"data-design": name}))
    if len(parts) == 1:
        parts.append(html.P("Choose an MoE design (megakernel) for its expert tiles per SM and the top-k's serial "
                            "time.", style={"color": "grey", "margin": "0.2em 0"}))
    return html.Div(parts, style={"margin": "0.3em 0", "padding": "0.2em 0.8em", "borderLeft": "3px solid #999"})


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
          Output("timeline-moe", "children"),
          Input("timeline-run", "n_clicks"), Input("timeline-upload", "contents"), Input("timeline-token", "data"),
          State("timeline-model", "value"), State("timeline-gpu", "value"), State("timeline-batch", "value"),
          State("timeline-kv-len", "value"), State("timeline-phase", "value"), State("timeline-mode", "value"),
          State("timeline-policy", "value"), State("timeline-upload", "filename"),
          State("timeline-prefill-tokens", "value"), State("timeline-routing", "value"),
          State("timeline-design", "value"), State("timeline-colour", "value"), State("timeline-tp", "value"),
          State("timeline-ep", "value"))
@guarded(lambda line: (line, "", go.Figure(), None, graph_style(None), None))
def _on_run(n_clicks, upload, token, model, gpu, batch, kv_len, phase, mode, policy, filename, prefill_tokens,
            routing, design, colour, tp, ep):
    msg, summary, fig, schedule, moe = timeline_view(ctx.triggered_id, model, gpu, batch, kv_len, phase, mode, policy,
                                                     upload, filename, token, prefill_tokens, routing, design, colour,
                                                     tp, ep)
    return msg, summary, fig, schedule, graph_style(fig.layout.height), moe


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

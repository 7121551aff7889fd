"""Compare: every execution mode side by side for one model (built in or an uploaded HF ``config.json``),
GPU (with or without an implementation profile), batch, KV length and phase; a results table, your stack
(a kernel library's kernels in one CUDA graph) beside the modes, an imported ``torch.profiler`` trace against
the megakernel, and the ops on the GPU's roofline."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import Input, Output, State, callback, dcc, html, no_update

import mksim.schedule  # noqa: F401  (the simulator, imported once with the page, not on the first Run)
import mksim.sim  # noqa: F401
from explorer import data, figures, stacks
from explorer.guard import guarded
from mksim.errors import MksimError
from mksim.schedule import MODES
from mksim.workload.step import PHASES

PATH, NAME = "/", "Compare"
GRAPHS = ("compare-latency", "compare-tokens", "compare-hbm", "compare-breakdown")
#: The model dropdown's value for an uploaded config: this prefix and the config's name.
UPLOADED = "uploaded: "
ROUTING_NOTE = ("mixture-of-experts models only (uniform, or zipf:S with S > 0: the larger, the more skewed); "
                "a dense model has no router and ignores it")
SPLIT_NOTE = ("GPUs of a node the step is split over (docs/parallel.md): tp tensor-parallel (Megatron's split), ep "
              "expert-parallel (mixture-of-experts models: experts over GPUs, attention data-parallel); both: ep "
              "groups of tp GPUs. One GPU is simulated, with the communication the split implies.")
ROOFLINE_DEFAULT = "graph"  # the roofline first shows the ops as one CUDA graph runs them
DROP_STYLE = {"display": "inline-block", "marginRight": "1em", "padding": "0.4em 1em", "border": "1px dashed #999",
              "borderRadius": "4px", "cursor": "pointer"}


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
            field("phase ", dcc.Dropdown(list(PHASES), "decode", id="compare-phase", clearable=False,
                                         style={"width": "8em"})),
            html.Button("Run", id="compare-run", n_clicks=0),
        ]),
        html.Div([
            field("the modes' kernels ", dcc.Dropdown(stacks.profile_options(), stacks.NONE, id="compare-profile",
                                                     clearable=False, style={"width": "30em"})),
            field("your stack ", dcc.Dropdown(stacks.stack_options(), stacks.NONE, id="compare-stack",
                                              clearable=False, style={"width": "10em"})),
            field("routing ", dcc.Input(id="compare-routing", type="text", value="uniform", debounce=True,
                                        maxLength=data.MAX_ROUTING_CHARS, placeholder="uniform or zipf:1.2",
                                        disabled=True, style={"width": "9em"})),
            html.Span(ROUTING_NOTE, id="compare-routing-note", style={"color": "grey"}),
        ], style={"marginTop": "0.4em"}),
        html.Div([
            field("tp ", dcc.Input(id="compare-tp", type="number", value=1, min=1, step=1, style={"width": "4em"})),
            field("ep ", dcc.Input(id="compare-ep", type="number", value=1, min=1, step=1, disabled=True,
                                   style={"width": "4em"})),
            html.Span(SPLIT_NOTE, id="compare-split-note", style={"color": "grey"}),
        ], style={"marginTop": "0.4em"}),
        html.Div([
            dcc.Upload(["or drop a Hugging Face ", html.Code("config.json"), " here, or ", html.A("choose one")],
                       id="compare-upload", accept=".json,application/json", multiple=False,
                       style=DROP_STYLE),
            html.Span(id="compare-upload-message", role="status"),
        ], style={"margin": "0.5em 0"}),
        html.Div([
            dcc.Upload(["import a ", html.Code("torch.profiler"), " trace of a step (", html.Code(".json"), " or ",
                        html.Code(".json.gz"), f", up to {stacks.MAX_UPLOAD_BYTES >> 20} MiB): drop it here, or ",
                        html.A("choose one")],
                       id="compare-trace-upload", accept=".json,.gz,application/json,application/gzip",
                       multiple=False, style=DROP_STYLE),
            html.Span(id="compare-trace-message", role="status"),
        ], style={"margin": "0.5em 0"}),
        dcc.Store(id="compare-config"),
        dcc.Store(id="compare-result"),
        html.Div(id="compare-message", role="alert", style={"color": "#b00020", "margin": "0.5em 0"}),
        dcc.Loading(html.Div(id="compare-table")),
        dcc.Loading(html.Div(id="compare-trace")),
        dcc.Loading([
            html.Div([dcc.Graph(id=g, style={"display": "inline-block", "width": "49%"}) for g in GRAPHS]),
        ]),
        html.Div([
            html.Label(["roofline of the ops as simulated in ",
                        dcc.Dropdown(list(MODES), ROOFLINE_DEFAULT, id="compare-roofline-mode", clearable=False,
                                     style={"width": "14em", "display": "inline-block", "verticalAlign": "middle"})]),
            dcc.Graph(id="compare-roofline", style={"height": "520px"}),
        ]),
    ])


def _data(key: str, value: Any) -> dict[str, Any]:
    """A ``data-KEY`` attribute (for the tests and scripts that read the page)."""
    return {f"data-{key}": value}


def _empty() -> go.Figure:
    return go.Figure()


def absent_note(d: dict[str, Any]) -> html.Ul | None:
    """The modes the GPU cannot run and why (``d["absent"]``), as a list under the table; ``None`` if none."""
    absent = d.get("absent") or {}
    if not absent:
        return None
    return html.Ul([html.Li([html.Code(mode), f" left out: {why}"], **{"data-mode": mode})
                    for mode, why in absent.items()], id="compare-absent", style={"margin": "0.2em 0"})


def _assumed(text: str) -> str:
    """What :func:`mksim.compare.assumptions`' sentence says is assumed, without its ``assumes:``."""
    return text.removeprefix("assumes: ")


def _how_sure(basis: dict[str, Any]) -> str:
    """How sure a prediction is (:func:`mksim.compare.interval_basis`): ± its half-width, and why."""
    h = basis.get("half_width_pct")
    return f"± {h:.1f} %: {basis['text']}" if h is not None else f"interval unknown: {basis['text']}"


def assumes_note(d: dict[str, Any]) -> html.Ul:
    """What each prediction shown assumes (hardware file, implementation profile): the modes', and your
    stack's where there is one; a profile-less prediction says it is the best kernels the chip allows."""
    basis = d["interval"]
    items = [html.Li(["the modes assume ", _assumed(d["assumes"]["text"]), "; ", _how_sure(basis)],
                     **_data("of", "modes"))]
    st = d.get("stack")
    if st:
        items.append(html.Li([f"your stack ({st['impl']}) assumes ", _assumed(st["assumes"]["text"]), "; ",
                              _how_sure(st["interval"])], **_data("of", "stack")))
    return html.Ul(items, id="compare-assumes", style={"margin": "0.2em 0", "color": "#444"})


def stack_note(d: dict[str, Any]) -> html.P | None:
    """One sentence: the megakernel's predicted speed-up over your stack (``None`` without a stack)."""
    st = d.get("stack")
    if not st:
        return None
    mk = d["modes"].get("megakernel")
    stack = f"your stack, {st['impl']}'s kernels in one CUDA graph ({st['latency_us']:.1f} µs)"
    siv = st.get("speedup_interval")
    verdict = st.get("verdict") or "no verdict"
    sure = f" (interval {siv[0]:.2f}–{siv[1]:.2f}×: {verdict})" if siv and None not in siv else f" ({verdict})"
    text = (f"The megakernel ({mk['latency_us']:.1f} µs on {d['gpu']}) is predicted {st['megakernel_speedup']:.2f}× "
            f"faster than {stack}{sure}." if mk and st["megakernel_speedup"] else f"{d['gpu']} has no megakernel to "
            f"compare with {stack}.")
    return html.P(text, id="compare-stack-speedup", style={"fontWeight": "bold", "margin": "0.3em 0"})


def results_table(d: dict[str, Any]) -> html.Div:
    """The comparison as an accessible table: one row per mode (latency, tokens/s, HBM utilisation, speed-up;
    a step split over GPUs adds the communication: its collective ops' span and share of the step, as ``mksim
    compare --tp`` gives it) and your stack's where ``d`` has one (``d["stack"]``:
    :func:`explorer.stacks.stack_data`), the megakernel's speed-up over your stack (:func:`stack_note`), what the
    predictions assume (:func:`assumes_note`), then the modes the GPU cannot run, with the reason
    (:func:`absent_note`)."""
    split = any("communication_share" in r for r in d["modes"].values())
    head = ("mode", "latency (µs)", "tokens/s", "HBM utilisation", "vs stream",
            *(("communication µs (share)",) if split else ()))

    def comm(r: dict[str, Any]) -> tuple[str, ...]:
        if not split:
            return ()
        share = r.get("communication_share")
        return (f"{r['breakdown_us']['communication']:.1f} ({share:.1%})" if share is not None else "–",)

    cell = {"padding": "0.2em 0.8em", "textAlign": "right"}
    rows = [html.Tr([html.Th(mode, scope="row", style={"textAlign": "left"}),
                     *(html.Td(v, style=cell) for v in (f"{r['latency_us']:.1f}", f"{r['tokens_per_s']:.0f}",
                                                        f"{r['hbm_util']:.1%}", f"{r['speedup_vs_stream']:.2f}×",
                                                        *comm(r)))],
                    **{"data-mode": mode})
            for mode, r in d["modes"].items()]
    st = d.get("stack")
    if st:
        vs = f"{st['speedup_vs_stream']:.2f}×" if st.get("speedup_vs_stream") else "–"
        rows.append(html.Tr([html.Th(f"your stack: {st['impl']} (graph)", scope="row",
                                     style={"textAlign": "left", "fontStyle": "italic"}),
                             *(html.Td(v, style=cell) for v in (f"{st['latency_us']:.1f}",
                                                                f"{st['tokens_per_s']:.0f}", "–", vs,
                                                                *(("–",) if split else ())))],
                            **_data("mode", "stack")))
    table = html.Table([
        html.Caption(f"{d['workload']} on {d['gpu']}: bandwidth floor {d['bandwidth_floor_us']:.1f} µs",
                     style={"textAlign": "left", "fontWeight": "bold"}),
        html.Thead(html.Tr([html.Th(h, scope="col", style=cell) for h in head])),
        html.Tbody(rows),
    ], id="compare-results", style={"borderCollapse": "collapse", "margin": "0.5em 0"})
    parts = [table, stack_note(d), assumes_note(d), absent_note(d)]
    return html.Div([p for p in parts if p is not None])


def page_inputs(model: str | None, gpu: str | None, batch: Any, kv_len: Any, phase: str | None,
                config: dict[str, Any] | None, profile: str | None = None) -> tuple:
    """The page's inputs parsed: ``(model, GPU name with the profile, batch, KV length, config)``, ``config``
    the uploaded config when ``model`` is :data:`UPLOADED` + its name. Raises MksimError on bad input."""
    if not model or not gpu or not phase:
        raise MksimError("choose a model, a GPU and a phase")
    if phase not in PHASES:
        raise MksimError(f"phase: choose {' or '.join(PHASES)}")
    b, kv = data.whole_number(batch, "batch"), data.whole_number(kv_len, "KV length")
    cfg = None
    if isinstance(model, str) and model.startswith(UPLOADED):
        if (not isinstance(config, dict) or config.get("name") != model.removeprefix(UPLOADED)
                or not isinstance(config.get("config"), dict)):
            raise MksimError("the uploaded config is gone; upload it again")
        model, cfg = config["name"], config["config"]
    else:
        data.check_model(model)
    if profile is not None and not isinstance(profile, str):
        raise MksimError("the modes' kernels: choose none or a profile of the list")
    return model, data.check_gpu(stacks.megakernel_gpu(data.check_gpu(gpu), profile)), b, kv, cfg


def run_compare(n_clicks: int | None, model: str | None, gpu: str | None, batch: Any, kv_len: Any,
                phase: str | None, config: dict[str, Any] | None = None, profile: str | None = None,
                stack: str | None = None, routing: Any = None, tp: Any = 1, ep: Any = 1) -> tuple:
    """Parse the inputs, compare the modes; ``(message, latency, tokens/s, HBM, breakdown, table, result)``.

    ``model`` is a built-in name, or :data:`UPLOADED` + a name with ``config`` the uploaded config
    (what :func:`upload_config` stored). ``profile`` is the implementation profile of the modes' kernels
    (:data:`explorer.stacks.NONE` or ``None``: the best kernels the chip allows), ``stack`` a library whose
    stack is predicted beside them (``d["stack"]``), ``routing`` a mixture of experts' routing model
    (:func:`explorer.data.check_routing`: ``uniform``, ``zipf:S``; a dense model ignores it), ``tp`` and ``ep``
    the GPUs the step is split over (:func:`explorer.data.check_split`; a split mksim refuses, as ``mksim
    compare --tp`` does, is its one line). ``result`` is the comparison's data (for the roofline).
    Bad input answers with mksim's one-line message, empty figures and no table; it never raises.
    """
    try:
        model, gpu_name, b, kv, cfg = page_inputs(model, gpu, batch, kv_len, phase, config, profile)
        tp, ep = data.check_split(tp, ep)
        d = data.compare_run(model, gpu_name, b, kv, str(phase), config=cfg, routing=data.check_routing(routing),
                             tp=tp, ep=ep)
        impl = stacks.chosen(stack)
        if impl:
            d["stack"] = stacks.stack_data(d, impl, cfg)
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
        return _error_span(f"error: {exc}"), None, data.models(), no_update
    label = UPLOADED + up["name"]
    return f"loaded {up['summary']}", up, [*data.models(), label], label


def trace_view(t: dict[str, Any]) -> html.Div:
    """An imported trace (:func:`explorer.stacks.trace_data`): its step, replay and mapping, the step by op
    kind (with mksim's own one-kernel-per-op graph beside it), and the predicted megakernel and speed-up."""
    cell = {"padding": "0.2em 0.8em", "textAlign": "right"}
    pred = t["prediction"] or {}
    graph = pred.get("graph_by_kind_us", {})
    head = ("kind", "kernels", "kernel µs", "gap µs", "% of step", f"mksim graph µs ({pred.get('gpu', '–')})")
    rows = [html.Tr([html.Th(r["kind"], scope="row", style={"textAlign": "left"}),
                     *(html.Td(v, style=cell) for v in (
                         str(r["kernels"]), f"{r['busy_us']:.1f}", f"{r['gaps_us']:.1f}", f"{r['share']:.1%}",
                         f"{graph[r['kind']]:.1f}" if r["kind"] in graph else ""))],
                    **{"data-kind": r["kind"]}) for r in t["by_kind"]]
    kinds = html.Table([html.Caption("the traced step by op kind", style={"textAlign": "left"}),
                        html.Thead(html.Tr([html.Th(h, scope="col", style=cell) for h in head])),
                        html.Tbody(rows)], id="compare-trace-kinds", style={"borderCollapse": "collapse"})
    step = (f"{t['path']}: {t['gpu_name'] or 'an unnamed GPU'}; step {t['step_number']} of "
            f"{len(t['step_spans_us'])} (by {t['steps_by']}) {t['step_us']:.1f} µs = kernels {t['busy_us']:.1f} µs "
            f"+ gaps {t['gaps_us']:.1f} µs over {t['n_kernels']} GPU activities; replay {t['replay_us']:.1f} µs "
            f"({t['replay_error']:+.2%})")
    mapped = (f"mapped {t['mapped_fraction']:.1%} of the kernel time to {t['model']}'s ops (batch {t['batch']}, "
              f"KV {t['kv_len']})" + (f"; ops without a kernel: {', '.join(t['ops_without_kernels'])}"
                                      if t["ops_without_kernels"] else "; every op got a kernel"))
    parts: list[Any] = [html.H3("Imported trace", style={"marginBottom": "0.2em"}),
                        html.P(step, id="compare-trace-step", style={"margin": "0.2em 0"}),
                        html.P(mapped, id="compare-trace-mapped", style={"margin": "0.2em 0"}), kinds]
    if pred:
        hw = pred["hardware_file"]
        parts.append(html.P(
            f"The megakernel of the same ops is predicted {pred['megakernel_us']:.1f} µs on {pred['gpu']}: "
            f"{pred['speedup']:.2f}× faster than the traced step ({t['step_us']:.1f} µs); mksim's own "
            f"one-kernel-per-op CUDA graph {pred['graph_us']:.1f} µs.", id="compare-trace-prediction",
            style={"fontWeight": "bold", "margin": "0.3em 0"}))
        assumed = "the prediction assumes " + _assumed(t["assumes"])
        parts.append(html.P(f"{assumed} ({hw})" if hw else assumed, id="compare-trace-assumes",
                            style={"color": "#444", "margin": "0.2em 0"}))
    notes = [*([pred["note"]] if pred.get("note") else []), *t["warnings"]]
    if notes:
        parts.append(html.Ul([html.Li(n) for n in notes], id="compare-trace-notes"))
    return html.Div(parts, style={"margin": "0.5em 0", "padding": "0.3em 0.8em", "borderLeft": "3px solid #999"})


def import_trace_upload(contents: str | None, filename: str | None, model: str | None, gpu: str | None,
                        batch: Any, kv_len: Any, phase: str | None, config: dict[str, Any] | None = None,
                        profile: str | None = None) -> tuple:
    """Import an uploaded trace with the page's model, GPU (and profile), batch and KV length:
    ``(message, view)``; nothing uploaded: ``("", None)``. A bad file, or inputs the trace cannot be
    predicted with, answer with one line ``error: ...`` and no view; it never raises."""
    if not contents:
        return "", None
    try:
        if phase != "decode":
            raise MksimError("a trace is imported as a decode step: choose the decode phase")
        model, gpu_name, b, kv, cfg = page_inputs(model, gpu, batch, kv_len, phase, config, profile)
        t = stacks.trace_data(contents, filename, model, gpu_name, b, kv, config=cfg)
    except MksimError as exc:
        return _error_span(f"error: {exc}"), None
    return f"imported {t['path']}", trace_view(t)


def roofline(result: dict[str, Any] | None, mode: str | None) -> go.Figure:
    """The roofline figure of a stored comparison in ``mode`` (empty before the first good Run)."""
    if not isinstance(result, dict) or not isinstance(mode, str) or mode not in (result.get("modes") or {}):
        return _empty()
    return figures.roofline_figure(data.roofline_data(result, mode))


def roofline_modes(result: dict[str, Any] | None, mode: str | None) -> tuple[list[str], str]:
    """The roofline's mode choices (those the comparison ran, in :data:`mksim.schedule.MODES`' order) and
    its value (``mode``, or :data:`ROOFLINE_DEFAULT` (else the first choice) where the GPU lacks ``mode``)."""
    ran = result.get("modes") if isinstance(result, dict) else None
    ran = ran if isinstance(ran, dict) else None
    choices = [m for m in MODES if ran is None or m in ran]
    if mode in choices:
        return choices, str(mode)
    return choices, ROOFLINE_DEFAULT if ROOFLINE_DEFAULT in choices else choices[0]


def _error_span(line: str) -> html.Span:
    return html.Span(line, style={"color": "#b00020"})


@callback(Output("compare-roofline-mode", "options"), Output("compare-roofline-mode", "value"),
          Input("compare-result", "data"), State("compare-roofline-mode", "value"))
@guarded(lambda line: (list(MODES), ROOFLINE_DEFAULT))
def _on_result(result, mode):
    return roofline_modes(result, mode)


@callback(Output("compare-message", "children"), *(Output(g, "figure") for g in GRAPHS),
          Output("compare-table", "children"), Output("compare-result", "data"),
          Input("compare-run", "n_clicks"), State("compare-model", "value"), State("compare-gpu", "value"),
          State("compare-batch", "value"), State("compare-kv-len", "value"), State("compare-phase", "value"),
          State("compare-config", "data"), State("compare-profile", "value"), State("compare-stack", "value"),
          State("compare-routing", "value"), State("compare-tp", "value"), State("compare-ep", "value"))
@guarded(lambda line: (line, *(_empty() for _ in GRAPHS), None, None))
def _on_run(n_clicks, model, gpu, batch, kv_len, phase, config, profile, stack, routing, tp, ep):
    return run_compare(n_clicks, model, gpu, batch, kv_len, phase, config, profile, stack, routing, tp, ep)


def routing_disabled(model: Any, config: Any = None) -> bool:
    """Whether the routing input is off: ``model`` (a built-in name, or an uploaded config's option with
    ``config``) has no experts, or is not one the page knows (running says why)."""
    try:
        if isinstance(model, str) and model.startswith(UPLOADED):
            if not isinstance(config, dict) or not isinstance(config.get("config"), dict):
                return True
            return not data.has_experts(str(config.get("name")), config["config"])
        return not data.has_experts(data.check_model(model))
    except MksimError:
        return True


def moe_inputs(model: Any, config: Any = None) -> tuple[bool, bool, Any]:
    """``(routing disabled, ep disabled, ep value)`` for ``model``: a dense model's routing and ep are off, its
    ep back to 1 (a mixture of experts keeps the ep it has)."""
    off = routing_disabled(model, config)
    return off, off, 1 if off else no_update


@callback(Output("compare-routing", "disabled"), Output("compare-ep", "disabled"), Output("compare-ep", "value"),
          Input("compare-model", "value"), State("compare-config", "data"))
@guarded(lambda line: (True, True, 1))
def _on_model(model, config):
    return moe_inputs(model, config)


@callback(Output("compare-trace-message", "children"), Output("compare-trace", "children"),
          Input("compare-trace-upload", "contents"), Input("compare-run", "n_clicks"),
          State("compare-trace-upload", "filename"), State("compare-model", "value"), State("compare-gpu", "value"),
          State("compare-batch", "value"), State("compare-kv-len", "value"), State("compare-phase", "value"),
          State("compare-config", "data"), State("compare-profile", "value"))
@guarded(lambda line: (_error_span(line), None))
def _on_trace(contents, n_clicks, filename, model, gpu, batch, kv_len, phase, config, profile):
    # on Run too: the trace is imported again with the page's inputs as they are now
    return import_trace_upload(contents, filename, model, gpu, batch, kv_len, phase, config, profile)


@callback(Output("compare-upload-message", "children"), Output("compare-config", "data"),
          Output("compare-model", "options"), Output("compare-model", "value"),
          Input("compare-upload", "contents"), State("compare-upload", "filename"), prevent_initial_call=True)
@guarded(lambda line: (_error_span(line), None, data.models(), no_update))
def _on_upload(contents, filename):
    return upload_config(contents, filename)


@callback(Output("compare-roofline", "figure"), Input("compare-result", "data"),
          Input("compare-roofline-mode", "value"))
@guarded(lambda line: _empty())
def _on_roofline(result, mode):
    return roofline(result, mode)

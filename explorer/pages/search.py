"""Search: start an Optuna study of megakernel schedules, or open one, and follow it live."""

from __future__ import annotations

import time
from typing import Any

import plotly.graph_objects as go
from dash import ALL, Input, Output, State, callback, ctx, dcc, html, no_update

from explorer import data, figures, jobs, store
from explorer.guard import guarded, one_line
from explorer.pages.timeline import PATH as TIMELINE_PATH
from mksim.errors import MksimError

PATH, NAME = "/search", "Search"
GRAPHS = ("search-history", "search-parallel", "search-pareto")
POLL_MS = 1000
#: While a study runs, its figures are redrawn at most this often (seconds): each redraw costs the browser
#: a second or two of CPU without a GPU (the parallel coordinates are WebGL) and resets a zoom.
REDRAW_S = 5.0
JOBS_POLL_MS = 2000
NO_STUDY = "Start a search or open a study: its trials are drawn here."
HIDDEN: dict[str, str] = {"display": "none"}


def layout(**_query: Any) -> html.Div:
    """The page (built on request: no data loaded at import)."""
    def field(label: str, comp: Any) -> html.Label:
        return html.Label([label, comp], style={"display": "inline-block", "marginRight": "1em"})

    def dropdown(options: Any, value: Any, id_: str, width: str = "14em") -> dcc.Dropdown:
        return dcc.Dropdown(options, value, id=id_, clearable=False, style={"width": width})

    return html.Div([
        html.H2("Search megakernel schedules"),
        html.Div([
            field("model ", dropdown(data.models(), "llama-3.2-1b", "search-model")),
            field("GPU ", dropdown(data.gpus(), "h200", "search-gpu")),
            field("batch ", dcc.Input(id="search-batch", type="number", value=1, step=1)),
            field("KV length ", dcc.Input(id="search-kv-len", type="number", value=1024, step=1)),
            field("trials ", dcc.Input(id="search-trials", type="number", value=60, step=1)),
            field("objectives ", dropdown(list(jobs.OBJECTIVE_CHOICES), "latency", "search-objectives", "10em")),
            field("routing ", dcc.Input(id="search-routing", type="text", value="uniform", debounce=True,
                                        disabled=True, style={"width": "7em"})),
            field("tp ", dcc.Input(id="search-tp", type="number", value=1, min=1, step=1, style={"width": "4em"})),
            field("ep ", dcc.Input(id="search-ep", type="number", value=1, min=1, step=1, disabled=True,
                                   style={"width": "4em"})),
            html.Button("Start search", id="search-start", n_clicks=0),
            html.Button("Cancel search", id="search-cancel", n_clicks=0, style={"marginLeft": "0.5em"}),
            html.Span(id="search-cancel-message", style={"marginLeft": "1em", "color": "grey"}),
        ]),
        html.Div([
            field("study ", dcc.Input(id="search-study", placeholder="default: model-GPU-batch-KV-objectives",
                                      style={"width": "20em"})),
            field("or existing ", dcc.Dropdown(id="search-studies", placeholder="studies in the storage",
                                               style={"width": "18em"})),
            html.Button("Open study", id="search-open", n_clicks=0),
        ], style={"margin": "0.5em 0"}),
        html.P(storage_note(), id="search-storage", style={"color": "grey", "margin": "0.3em 0"}),
        html.Div(id="search-jobs", style={"margin": "0.5em 0"}),
        dcc.Store(id="search-job"), dcc.Store(id="search-seen"), dcc.Store(id="search-jobs-seen"),
        dcc.Interval(id="search-poll", interval=POLL_MS, disabled=True),
        dcc.Interval(id="search-jobs-poll", interval=JOBS_POLL_MS),
        dcc.Location(id="search-location", refresh="callback-nav"),
        html.Div(id="search-message", role="alert", style={"color": "#b00020", "margin": "0.5em 0"}),
        html.P(id="search-progress"),
        html.P(NO_STUDY, id="search-hint", style={"color": "grey"}),
        html.Div([
            html.Button("Open the best schedule in Timeline", id="search-best", n_clicks=0),
            html.Span(id="search-best-message", style={"marginLeft": "1em", "color": "#b00020"}),
            html.Div([dcc.Graph(id="search-history", style={"display": "inline-block", "width": "49%"}),
                      dcc.Graph(id="search-pareto", style={"display": "inline-block", "width": "49%"})]),
            dcc.Graph(id="search-parallel"),
        ], id="search-figures", style=HIDDEN),
    ])


def _int(value: Any, what: str) -> int:
    return data.whole_number(value, what)


def storage_note() -> str:
    """Where the studies are kept (the explorer's own storage: the browser does not choose it)."""
    try:
        return (f"studies are kept in {jobs.default_storage()} (mksim explore --storage chooses another; "
                "open it with mksim search --storage too)")
    except MksimError as exc:
        return f"error: {exc}"


def study_choices() -> tuple[list[str], str | None]:
    """``(options, value)`` of the list of existing studies: the studies in the explorer's storage, the only
    one chosen when there is one. Empty when the storage cannot be read (opening it says why). Never raises."""
    try:
        names = data.study_names(jobs.default_storage())
    except MksimError:
        return [], None
    return names, names[0] if len(names) == 1 else None


def _study_to_open(storage: str, typed: str | None, chosen: str | None) -> str:
    """The study "Open study" opens: the typed name, else the one chosen in the list, else the storage's
    only study."""
    for name in (typed, chosen):
        if isinstance(name, str) and name.strip():
            return jobs.check_study_name(name, new=False)
        if name is not None and not isinstance(name, str):
            jobs.check_study_name(name, new=False)  # says what is wrong with it
    names = data.study_names(storage)
    if len(names) == 1:
        return names[0]
    if not names:
        raise MksimError(f"no study in {storage} yet: start a search first")
    raise MksimError(f"choose the study to open in the list ({len(names)} studies in {storage})")


def start_or_open(trigger: str | None, model: str | None, gpu: str | None, batch: Any, kv_len: Any, trials: Any,
                  objectives: str | None, study: str | None, chosen: str | None = None,
                  routing: Any = None, tp: Any = 1, ep: Any = 1) -> dict[str, Any] | None:
    """What the page follows: ``{"job", "storage", "study", "trials"}`` (``job`` ``None`` for an opened
    study), or ``{"error": one line}``; ``None`` before a button is pressed. "Open study" opens the
    typed ``study``, else the ``chosen`` one of the list, else the storage's only study; a *Follow* button
    of the list of searches (``{"type": "search-follow", "job": ...}``) follows that search. The storage is
    the explorer's own (:func:`explorer.jobs.default_storage`). ``routing`` is a mixture of experts' routing
    model (``uniform``, ``zipf:S``: :func:`explorer.data.check_routing`), searched with and recorded in the
    study (its default name says it); a dense model ignores it. ``tp`` and ``ep`` split the step over GPUs
    (:func:`explorer.data.check_split`, as ``mksim search --tp/--ep``: a tensor-parallel study samples how its
    all-reduces run; its default name ends ``-tp2``). Never raises."""
    try:
        if trigger == "search-start":
            if not model or not gpu:
                raise MksimError("choose a model and a GPU")
            if objectives is not None and not isinstance(objectives, str):
                raise MksimError(f"objectives: give {' or '.join(repr(o) for o in jobs.OBJECTIVE_CHOICES)}")
            tp, ep = data.check_split(tp, ep)
            return jobs.start_search(model, gpu, _int(batch, "batch"), _int(kv_len, "KV length"),
                                     _int(trials, "trials"), objectives or "latency", study,
                                     routing=data.routing_for(model, routing), tp=tp, ep=ep)
        if trigger == "search-open":
            storage = jobs.default_storage()
            name = _study_to_open(storage, study, chosen)
            return {"job": None, "storage": storage, "study": name, "trials": None}
        if isinstance(trigger, dict) and trigger.get("type") == "search-follow":
            return jobs.follow(str(trigger.get("job"))[:60])
    except MksimError as exc:
        return {"error": str(exc)}
    return None


def followed(job: Any) -> tuple[str | None, str, str, int | None]:
    """``(job, storage, study, trials)`` of what the page follows (``start_or_open``'s dict, as the browser
    sends it back), checked: the job a search of the registry (its storage then the registry's record, not
    the browser's), or none and the study one of the explorer's storage. Raises MksimError in one line."""
    if not isinstance(job, dict):
        raise MksimError("the page's followed study is not one it made; start a search or open a study again")
    name = jobs.check_job_name(job.get("job"))
    if job.get("job") is not None and name is None:
        raise MksimError("the page's followed search is not one of the registry; follow it from the list again")
    study = jobs.check_study_name(job.get("study"), new=False)
    trials = job.get("trials")
    if trials is not None and (type(trials) is not int or trials < 0):
        raise MksimError("the page's followed study is not one it made; start a search or open a study again")
    storage = jobs.follow(name)["storage"] if name else jobs.default_storage()
    return name, storage, study, trials


def _empty() -> tuple[go.Figure, ...]:
    return tuple(go.Figure() for _ in GRAPHS)


def _progress(d: dict[str, Any], trials: int | None, state: str) -> str:
    c = d["counts"]
    head = f"{d['finished']} / {trials} trials finished" if trials else f"{d['finished']} trials finished"
    parts = [head + f" ({c['COMPLETE']} complete, {c['PRUNED']} pruned"
             + (f", {c['FAIL']} failed" if c["FAIL"] else "") + (f", {c['RUNNING']} running" if c["RUNNING"] else "")
             + ")"]
    failed = [r for r in d["trials"] if r["state"] == "FAIL" and r["reason"]]
    if failed:
        parts.append(f"trial {failed[-1]['number']} failed: {failed[-1]['reason']}")
    b = d["best"]
    if b:
        what = b["mode"] + (f" {b['params']['policy']}" if "policy" in b["params"] else "")
        comm = b.get("communication_us")
        parts.append(f"best {'so far' if state == 'running' else 'found'}: {b['latency_us']:.1f} µs "
                     f"(trial {b['number']}, {what}{', ' + b['baseline'] if b['baseline'] else ''}"
                     + (f"; communication {comm:.1f} µs, {comm / b['latency_us']:.1%} of the step"
                        if comm is not None else "") + ")")
    if state == "running":
        parts.append("running…")
    elif state == "cancelled":
        parts.append("cancelled")
    elif state == "stopped":
        parts.append(f"stopped: {jobs.STOPPED}")
    return "; ".join(parts) + f" — study {d['study']}"


def poll(job: dict[str, Any] | None, seen: Any = None) -> tuple:
    """``(message, progress, history, parallel, Pareto, poll disabled, seen)`` of the followed study.

    The figures are redrawn only when the study's finished trials changed since ``seen`` (so a zoom or a
    brushed axis survives the polling), and while the study runs at most every :data:`REDRAW_S` seconds
    (the progress line follows every poll; the last trials are drawn as the search ends); the polling goes
    on while a search of this server runs the study or it has running trials (a ``mksim search`` elsewhere
    filling it).
    Errors (bad input, a study that cannot be opened, a failed search) come back as one line; never raises.
    """
    if not job:
        return ("", "", *_empty(), True, None)
    if isinstance(job, dict) and "error" in job:
        return (f"error: {one_line(job['error'])}", "", *_empty(), True, None)
    try:
        name, storage, study, trials = followed(job)
    except MksimError as exc:
        return (f"error: {exc}", "", *_empty(), True, None)
    job = {"job": name, "storage": storage, "study": study, "trials": trials}
    state, err = jobs.job_state(name)
    try:
        d = data.study_data(storage, study)
    except MksimError as exc:
        if state == "running":  # the worker has not made the study yet
            return ("", f"starting the search of {job['study']}…", *(no_update for _ in GRAPHS), False, seen)
        if state == "cancelled":
            return ("", f"the search of {job['study']} was cancelled before its first trial", *_empty(), True, None)
        if state == "stopped":
            return ("", f"the search of {job['study']} stopped before its first trial: {jobs.STOPPED}", *_empty(),
                    True, None)
        return (f"error: {err or exc}", "", *_empty(), True, None)
    live = state == "running" or (state == "none" and d["counts"]["RUNNING"] > 0)
    now = [job["study"], job["storage"], d["finished"], d["counts"]["FAIL"], state]
    drawn = seen if isinstance(seen, list) and len(seen) == len(now) + 1 else [None] * (len(now) + 1)
    at = drawn[-1] if isinstance(drawn[-1], int | float) and not isinstance(drawn[-1], bool) else None
    t = time.time()
    if now == drawn[:-1] or (live and drawn[:2] == now[:2] and at is not None and 0 <= t - at < REDRAW_S):
        figs, seen = tuple(no_update for _ in GRAPHS), drawn  # nothing new, or drawn less than REDRAW_S ago
    else:
        figs = (figures.study_history_figure(d), figures.study_parallel_figure(d), figures.study_pareto_figure(d))
        seen = [*now, t]
    message = f"error: {err}" if state == "failed" else ""
    return (message, _progress(d, job.get("trials"), "running" if live else state), *figs, not live, seen)


def jobs_rows(listed: list[dict[str, Any]] | None = None) -> list[list[str]]:
    """The list of searches as shown: ``[job, study, trials, started, state]`` per search, newest first
    (``listed``: :func:`explorer.jobs.list_jobs`'s, read now when not given)."""
    rows = []
    for j in jobs.list_jobs() if listed is None else listed:
        state = j["state"] + (f": {j['message']}" if j["state"] == "failed" else "")
        rows.append([j["job"], j["study"], str(j["trials"]),
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j["started"])), state])
    return rows


def jobs_table(rows: list[list[str]]) -> html.Div | str:
    """The list of searches: one row each, with a *Follow* button (a search listed by a server restarted
    since it started is followed and cancelled as well)."""
    if not rows:
        return ""
    head = html.Tr([html.Th(h, style={"textAlign": "left", "paddingRight": "1em"})
                    for h in ("search", "study", "trials", "started", "state", "")])
    body = [html.Tr([*(html.Td(c, style={"paddingRight": "1em"}) for c in row[:4]),
                     html.Td(row[4], className="search-job-state", style={"paddingRight": "1em"}),
                     html.Td(html.Button("Follow", id={"type": "search-follow", "job": row[0]}, n_clicks=0))],
                    id=f"search-jobs-{row[0]}")
            for row in rows]
    return html.Div([html.Span(f"Searches (at most {jobs.MAX_RUNNING} run at once; they go on when the "
                               "explorer stops, and the next one lists them):", style={"color": "grey"}),
                     html.Table([html.Thead(head), html.Tbody(body)], id="search-jobs-table")])


def cancel_search(n_clicks: int | None, job: dict[str, Any] | None) -> str:
    """The line the Cancel button answers with: the followed search of this server is stopped."""
    if not n_clicks:
        return ""
    name = jobs.check_job_name(job.get("job")) if isinstance(job, dict) else None
    if name is None:
        return "no running search to cancel"
    return jobs.cancel(name)


def figures_shown(seen: Any) -> tuple[dict[str, str], str]:
    """``(style of the figures, hint)``: the figures only once a study's trials are drawn (``seen``, from
    :func:`poll`), before that a line saying how to get some."""
    return ({}, "") if seen else (HIDDEN, NO_STUDY)


def open_best(n_clicks: int | None, job: dict[str, Any] | None) -> tuple[Any, str]:
    """``(Timeline link, message)``: keep the followed study's best schedule, link to it on Timeline."""
    if not n_clicks:
        return no_update, ""
    if not job or not isinstance(job, dict) or "error" in job:
        return no_update, "start a search or open a study first"
    try:
        _name, storage, study, _trials = followed(job)
        token = store.put_schedule(data.best_schedule_json(storage, study))
    except MksimError as exc:
        return no_update, f"error: {exc}"
    return f"{TIMELINE_PATH}?schedule={token}", ""


@callback(Output("search-job", "data"), Input("search-start", "n_clicks"), Input("search-open", "n_clicks"),
          Input({"type": "search-follow", "job": ALL}, "n_clicks"), State("search-model", "value"),
          State("search-gpu", "value"), State("search-batch", "value"), State("search-kv-len", "value"),
          State("search-trials", "value"), State("search-objectives", "value"),
          State("search-study", "value"), State("search-studies", "value"), State("search-routing", "value"),
          State("search-tp", "value"), State("search-ep", "value"), prevent_initial_call=True)
@guarded(lambda line: {"error": line.removeprefix("error: ")})
def _on_start(n_start, n_open, n_follow, model, gpu, batch, kv_len, trials, objectives, study, chosen, routing, tp,
              ep):
    if isinstance(ctx.triggered_id, dict) and not ctx.triggered[0]["value"]:
        return no_update  # a Follow button drawn anew, not pressed
    return start_or_open(ctx.triggered_id, model, gpu, batch, kv_len, trials, objectives, study, chosen, routing,
                         tp, ep)


def routing_off(model: Any) -> bool:
    """Whether the routing input is off: ``model`` has no experts, or is not a model the page lists."""
    try:
        return not data.has_experts(data.check_model(model))
    except MksimError:
        return True


@callback(Output("search-routing", "disabled"), Output("search-ep", "disabled"), Output("search-ep", "value"),
          Input("search-model", "value"))
@guarded(lambda line: (True, True, 1))
def _on_model(model):
    off = routing_off(model)  # a dense model: no routing, no experts to split
    return off, off, 1 if off else no_update


@callback(Output("search-studies", "options"), Output("search-studies", "value"), Input("search-job", "data"))
@guarded(lambda line: ([], None))
def _on_studies(_job):
    return study_choices()


@callback(Output("search-cancel-message", "children"), Input("search-cancel", "n_clicks"),
          State("search-job", "data"), prevent_initial_call=True)
@guarded(lambda line: line)
def _on_cancel(n_clicks, job):
    return cancel_search(n_clicks, job)


@callback(Output("search-figures", "style"), Output("search-hint", "children"), Input("search-seen", "data"))
@guarded(lambda line: (HIDDEN, NO_STUDY))
def _on_seen(seen):
    return figures_shown(seen)


@callback(Output("search-message", "children"), Output("search-progress", "children"),
          *(Output(g, "figure") for g in GRAPHS), Output("search-poll", "disabled"), Output("search-seen", "data"),
          Input("search-poll", "n_intervals"), Input("search-job", "data"), State("search-seen", "data"))
@guarded(lambda line: (line, "", *_empty(), True, None))
def _on_poll(n_intervals, job, seen):
    if ctx.triggered_id == "search-job":
        seen = None  # a new study: draw it
    return poll(job, seen)


@callback(Output("search-location", "href"), Output("search-best-message", "children"),
          Input("search-best", "n_clicks"), State("search-job", "data"), prevent_initial_call=True)
@guarded(lambda line: (no_update, line))
def _on_best(n_clicks, job):
    return open_best(n_clicks, job)


@callback(Output("search-jobs", "children"), Output("search-jobs-seen", "data"),
          Input("search-jobs-poll", "n_intervals"), Input("search-job", "data"),
          Input("search-cancel-message", "children"), State("search-jobs-seen", "data"))
@guarded(lambda line: (html.P(line, style={"color": "#b00020"}), None))
def _on_jobs(_n, _job, _cancelled, seen):
    rows = jobs_rows()
    if rows == seen:
        return no_update, no_update  # unchanged: the buttons are not drawn anew under the pointer
    return jobs_table(rows), rows

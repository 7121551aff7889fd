"""Figures for the explorer: pure functions from :mod:`explorer.data`'s plain data to plotly figures."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

#: ± band around y = x on the predicted-vs-measured chart.
BAND = 0.10

_MODE_COLOURS = {"stream": "#636efa", "graph": "#ef553b", "graph_pdl": "#00cc96",
                 "persistent_barrier": "#ab63fa", "megakernel": "#ffa15a"}


def _colour(mode: str) -> str | None:
    return _MODE_COLOURS.get(mode)


def mode_bars(data: dict[str, Any], key: str, title: str, fmt: str = ".1f") -> go.Figure:
    """One bar per mode of ``data["modes"][mode][key]`` (one trace per mode, so the legend names modes)."""
    fig = go.Figure()
    for mode, row in data["modes"].items():
        v = row[key]
        fig.add_bar(x=[mode], y=[v], name=mode, marker_color=_colour(mode), text=[format(v, fmt)],
                    textposition="outside")
    fig.update_layout(title=title, showlegend=False, margin=dict(t=50, b=40, l=50, r=20))
    return fig


def latency_figure(data: dict[str, Any]) -> go.Figure:
    """Step latency per mode, with the bandwidth floor as a dashed line (and ``data["stack"]``, your stack's
    predicted latency, as a last bar where there is one)."""
    fig = mode_bars(data, "latency_us", f"latency (µs) — {data['workload']} on {data['gpu']}")
    st = data.get("stack")
    if st:  # your stack, beside the modes: hatched, since it is another library's kernels, not a mode
        label = f"your stack: {st['impl']}"
        fig.add_bar(x=[label], y=[st["latency_us"]], name=label, marker_color="#7f7f7f",
                    marker_pattern_shape="/", text=[f"{st['latency_us']:.1f}"], textposition="outside")
    floor = data.get("bandwidth_floor_us")
    if floor:
        fig.add_hline(y=floor, line_dash="dash", annotation_text=f"bandwidth floor {floor:.1f} µs")
    return fig


def tokens_figure(data: dict[str, Any]) -> go.Figure:
    """Tokens per second per mode."""
    return mode_bars(data, "tokens_per_s", "tokens/s", fmt=".0f")


def hbm_figure(data: dict[str, Any]) -> go.Figure:
    """HBM utilisation per mode (share of the spec bandwidth)."""
    fig = mode_bars(data, "hbm_util", "HBM utilisation", fmt=".0%")
    fig.update_yaxes(tickformat=".0%")
    return fig


def breakdown_figure(data: dict[str, Any]) -> go.Figure:
    """Where each mode's step time went: one stacked trace per category, one bar per mode."""
    modes = list(data["modes"])
    cats = data.get("categories") or list(next(iter(data["modes"].values()))["breakdown_us"])
    fig = go.Figure()
    for cat in cats:
        fig.add_bar(x=modes, y=[data["modes"][m]["breakdown_us"].get(cat, 0.0) for m in modes], name=cat)
    fig.update_layout(barmode="stack", title="breakdown (µs, averaged over SMs)", yaxis_title="µs",
                      margin=dict(t=50, b=40, l=50, r=20))
    return fig


def scatter_figure(data: dict[str, Any], band: float = BAND) -> go.Figure:
    """Predicted vs measured (log-log): one marker trace per mode, y = x and a ±band shaded around it."""
    cases = data["cases"]
    fig = go.Figure()
    if cases:
        vals = [c["predicted_us"] for c in cases] + [c["measured_us"] for c in cases]
        lo, hi = min(vals) / 1.3, max(vals) * 1.3
        fig.add_scatter(x=[lo, hi], y=[lo * (1 - band), hi * (1 - band)], mode="lines", line=dict(width=0),
                        showlegend=False, hoverinfo="skip", name=f"-{band:.0%}")
        fig.add_scatter(x=[lo, hi], y=[lo * (1 + band), hi * (1 + band)], mode="lines", line=dict(width=0),
                        fill="tonexty", fillcolor="rgba(128,128,128,0.2)", name=f"±{band:.0%}", hoverinfo="skip")
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(dash="dash", color="grey"), name="y = x")
    for mode in dict.fromkeys(c["mode"] for c in cases):
        mine = [c for c in cases if c["mode"] == mode]
        fig.add_scatter(x=[c["measured_us"] for c in mine], y=[c["predicted_us"] for c in mine], mode="markers",
                        name=mode, marker=dict(size=9, color=_colour(mode)),
                        text=[f"{c['name']} ({c['schedule']}): {c['error_pct']:+.1f} %" for c in mine],
                        hovertemplate="%{text}<br>measured %{x:.1f} µs<br>predicted %{y:.1f} µs<extra></extra>")
    fig.update_xaxes(type="log", title="measured (µs)")
    fig.update_yaxes(type="log", title="predicted (µs)")
    fig.update_layout(title=f"predicted vs measured — {data['name']} ({data['predicted_with']})",
                      margin=dict(t=50, b=40, l=60, r=20))
    return fig


def error_figure(data: dict[str, Any]) -> go.Figure:
    """Per-mode errors: mean absolute error (MAPE) and mean signed error, in %."""
    modes = list(data["by_mode"])
    fig = go.Figure()
    fig.add_bar(x=modes, y=[data["by_mode"][m]["mape_pct"] for m in modes], name="MAPE %")
    fig.add_bar(x=modes, y=[data["by_mode"][m]["mean_error_pct"] for m in modes], name="mean error %")
    fig.add_hline(y=10, line_dash="dot", annotation_text="10 %")
    fig.update_layout(barmode="group", title="error by mode (%)", yaxis_title="%",
                      margin=dict(t=50, b=40, l=50, r=20))
    return fig


# -- Timeline: per-SM Gantt chart ----------------------------------------------------------
#: Op kinds take these colours in sorted order; red and grey are kept for the waits.
KIND_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
WAIT_COLOURS = {"dependency wait": "#d62728", "barrier wait": "#555555"}
PX_PER_TRACK = 7


def expert_colour(expert: int) -> str:
    """A colour of its own for each expert (hues a golden angle apart), the same in every layer and step.

    >>> expert_colour(0), expert_colour(1)
    ('hsl(0,65%,45%)', 'hsl(137,65%,45%)')
    """
    return f"hsl({int(expert * 137.508) % 360},65%,45%)"


def timeline_height(n_tracks: int) -> int:
    """The Gantt chart's height in pixels for ``n_tracks`` SM tracks (:data:`PX_PER_TRACK` each, 350 to 2000)."""
    return min(2000, max(350, 90 + PX_PER_TRACK * n_tracks))


def _segments(a: Any, b: Any, y: Any) -> tuple[Any, Any]:
    """x and y of horizontal segments [a, b] at heights y, as one line broken by gaps (NaN)."""
    gap = np.full(len(a), np.nan)
    f4 = np.float32  # µs to 1 ns over a step of milliseconds, half the bytes sent to the browser
    return np.column_stack([a, b, gap]).ravel().astype(f4), np.column_stack([y, y, gap]).ravel().astype(f4)


def timeline_figure(data: dict[str, Any], colour_by: str = "kind") -> go.Figure:
    """The per-SM Gantt chart of :func:`explorer.data.timeline_data`: one track per SM (slots side by side
    within it in chain modes), task bars coloured by op kind (``colour_by="expert"``: a mixture of experts'
    expert tasks by the expert they serve, one legend entry each, which a click hides or a double-click
    shows alone, and every other task grey), dependency and barrier waits as their own bars.

    Few traces whatever the task count (WebGL segments: a line and a trace of hover points per kind), so
    132 SMs and tens of thousands of bars stay fast to draw and zoom.
    """
    fig = go.Figure()
    lps = max(1, int(data["lanes_per_sm"]))
    n = max(data["tracks"], default=0) + 1
    height = timeline_height(n)
    width_px = max(1.0, 0.8 * (height - 90) / max(n, 1) / lps)

    def add(cols: dict[str, list], mask: Any, name: str, colour: str, text: list[str], template: str) -> None:
        a, b = np.asarray(cols["start_us"])[mask], np.asarray(cols["end_us"])[mask]
        sm, slot = np.asarray(cols["sm"])[mask], np.asarray(cols["slot"])[mask]
        y = sm + ((slot + 0.5) / lps - 0.5) * 0.8
        xs, ys = _segments(a, b, y)
        fig.add_scattergl(x=xs, y=ys, mode="lines", line=dict(width=width_px, color=colour), name=name,
                          legendgroup=name, hoverinfo="skip")
        extra = [np.asarray(cols["task"])[mask], sm, a, b, b - a]
        if "bytes" in cols:
            extra.append(np.asarray(cols["bytes"])[mask] / 1024)
        fig.add_scattergl(x=((a + b) / 2).astype(np.float32), y=y.astype(np.float32), mode="markers", name=name,
                          legendgroup=name, showlegend=False,
                          marker=dict(size=max(2.0, width_px - 1), color=colour, symbol="square"),
                          text=text, customdata=np.column_stack(extra).astype(np.float32), hovertemplate=template)

    tasks, waits = data["tasks"], data["waits"]
    kinds = np.asarray(tasks["kind"])
    names = np.asarray(tasks["name"], dtype=object)
    experts = np.asarray(tasks.get("expert") or [-1] * len(kinds))
    groups: list[tuple[str, Any, str]] = []  # (legend name, mask, colour)
    if colour_by == "expert" and (experts >= 0).any():
        groups.append(("other tasks", experts < 0, "#bbbbbb"))
        groups += [(f"expert {e}", experts == e, expert_colour(e)) for e in sorted(set(experts[experts >= 0].tolist()))]
    else:
        groups += [(kind, kinds == kind, KIND_PALETTE[i % len(KIND_PALETTE)])
                   for i, kind in enumerate(sorted(set(tasks["kind"])))]
    for name, m, colour in groups:
        add(tasks, m, name, colour, list(names[m]),
            "<b>%{text}</b> (task %{customdata[0]})<br>SM %{customdata[1]}, " + name
            + "<br>%{customdata[2]:.2f} – %{customdata[3]:.2f} µs (%{customdata[4]:.2f} µs)"
            "<br>%{customdata[5]:,.1f} KiB moved<extra></extra>")
    wkinds = np.asarray(waits["kind"])
    wnames = np.asarray(waits["name"], dtype=object)
    for kind in data.get("wait_kinds", list(WAIT_COLOURS)):
        m = wkinds == kind
        if m.any():
            add(waits, m, kind, WAIT_COLOURS.get(kind, "#888888"), list(wnames[m]),
                f"<b>{kind}</b> before %{{text}} (task %{{customdata[0]}})<br>SM %{{customdata[1]}}"
                "<br>%{customdata[2]:.2f} – %{customdata[3]:.2f} µs (%{customdata[4]:.2f} µs)<extra></extra>")
    step = max(1, n // 33)
    ticks = list(range(0, n, step))
    policy = f" ({data['policy']})" if data.get("policy") else ""
    fig.update_layout(title=f"{data['workload']} on {data['gpu']}, {data['mode']}{policy}: "
                            f"{data['latency_us']:.1f} µs, {data['n_tasks']} tasks on {len(data['tracks'])} SMs",
                      height=height, hovermode="closest", dragmode="zoom", margin=dict(t=100, b=20, l=60, r=20))
    fig.update_xaxes(title="µs from the step's start", range=[0, data["latency_us"]], side="top")  # a tall chart
    fig.update_yaxes(range=[n - 0.5, -0.5], tickvals=ticks, ticktext=[f"SM {i}" for i in ticks], zeroline=False,
                     showgrid=False)
    return fig


# -- Search: an Optuna study --------------------------------------------------------------
_SEARCH_MODE_COLOURS = {"megakernel": _MODE_COLOURS["megakernel"], "graph_pdl": _MODE_COLOURS["graph_pdl"],
                        "graph": _MODE_COLOURS["graph"]}


def study_history_figure(data: dict[str, Any]) -> go.Figure:
    """Latency of every complete trial (one trace per mode) and the best so far, from
    :func:`explorer.data.study_data`."""
    done = [r for r in data["trials"] if r["state"] == "COMPLETE" and r["latency_us"] is not None]
    fig = go.Figure()
    for mode in dict.fromkeys(r["mode"] for r in done):
        mine = [r for r in done if r["mode"] == mode]
        fig.add_scatter(x=[r["number"] for r in mine], y=[r["latency_us"] for r in mine], mode="markers",
                        name=mode, marker=dict(color=_SEARCH_MODE_COLOURS.get(mode)),
                        text=[r["baseline"] or "sampled" for r in mine],
                        hovertemplate="trial %{x}: %{y:.1f} µs (%{text})<extra></extra>")
    xs, ys, best = [], [], float("inf")
    for r in sorted(done, key=lambda r: r["number"]):
        best = min(best, r["latency_us"])
        xs.append(r["number"])
        ys.append(best)
    fig.add_scatter(x=xs, y=ys, mode="lines", line=dict(shape="hv", color="black"), name="best so far")
    fig.update_layout(title="latency per trial", xaxis_title="trial", yaxis_title="latency (µs)",
                      margin=dict(t=50, b=40, l=60, r=20), uirevision=data["study"])
    return fig


def study_parallel_figure(data: dict[str, Any]) -> go.Figure:
    """Parallel coordinates of the complete megakernel trials: each parameter every one chose, then the
    latency (the line colour; lighter is faster)."""
    done = [r for r in data["trials"] if r["state"] == "COMPLETE" and r["latency_us"] is not None
            and r["mode"] == "megakernel"]
    fig = go.Figure()
    if not done or not data["params"]:
        fig.update_layout(title="parallel coordinates: no complete megakernel trial yet")
        return fig
    dims = []
    for p in data["params"]:
        vals = [r["params"][p] for r in done]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            dims.append(dict(label=p, values=vals))
        else:
            cats = sorted({str(v) for v in vals})
            dims.append(dict(label=p, values=[cats.index(str(v)) for v in vals], tickvals=list(range(len(cats))),
                             ticktext=cats, range=[-0.25, len(cats) - 0.75] if len(cats) > 1 else [-1, 1]))
    lat = [r["latency_us"] for r in done]
    dims.append(dict(label="latency µs", values=lat))
    fig.add_trace(go.Parcoords(dimensions=dims, line=dict(color=lat, colorscale="Viridis", reversescale=True,
                                                          showscale=True)))
    fig.update_layout(title="megakernel trials: parameters and latency", margin=dict(t=80, b=30, l=60, r=60),
                      uirevision=data["study"])
    return fig


def study_pareto_figure(data: dict[str, Any]) -> go.Figure:
    """With two objectives, latency against shared memory per SM, the Pareto front drawn as a line."""
    fig = go.Figure()
    if len(data["objectives"]) < 2:
        fig.update_layout(title="Pareto front: a study of one objective has none (start one with latency,smem)")
        return fig
    done = {r["number"]: r for r in data["trials"] if r["state"] == "COMPLETE" and r["latency_us"] is not None}
    fig.add_scatter(x=[r["smem_KiB"] for r in done.values()], y=[r["latency_us"] for r in done.values()],
                    mode="markers", name="trials", marker=dict(color="lightgrey"), text=list(done),
                    hovertemplate="trial %{text}: %{y:.1f} µs, %{x:g} KiB<extra></extra>")
    front = [done[n] for n in data["pareto"] if n in done]
    fig.add_scatter(x=[r["smem_KiB"] for r in front], y=[r["latency_us"] for r in front], mode="lines+markers",
                    line=dict(shape="vh"), name="Pareto front", text=[r["number"] for r in front],
                    hovertemplate="trial %{text}: %{y:.1f} µs, %{x:g} KiB<extra></extra>")
    fig.update_layout(title="Pareto front: latency vs shared memory", xaxis_title="shared memory per SM (KiB)",
                      yaxis_title="latency (µs)", margin=dict(t=50, b=40, l=60, r=20), uirevision=data["study"])
    return fig


def roofline_figure(data: dict[str, Any]) -> go.Figure:
    """Ops on the roofline (log-log): FLOP/byte against attained TFLOP/s, one marker trace per op kind,
    under the memory roof (spec HBM bandwidth, solid; reachable, dashed) and the compute roofs (bf16
    tensor cores, fp32 CUDA cores)."""
    roofs, pts = data["roofs"], data["points"]
    spec, reach = roofs["hbm_spec_GBps"] * 1e9, roofs["hbm_reachable_GBps"] * 1e9
    tensor, vector = roofs["tensor_TFLOPs"]["bf16"], roofs["vector_TFLOPs"]
    xs = [p["intensity_flop_per_B"] for p in pts]
    lo = min([*xs, 1.0]) / 4
    hi = max([*xs, roofs["ridge_flop_per_B"]]) * 4
    fig = go.Figure()

    def roof(name: str, bw: float, peak: float, dash: str | None) -> None:
        ridge = peak * 1e12 / bw
        x = [lo, ridge, hi] if lo < ridge < hi else [lo, hi]
        fig.add_scatter(x=x, y=[min(bw * v / 1e12, peak) for v in x], mode="lines", name=name,
                        line=dict(color="black", dash=dash, width=1.5), hoverinfo="skip")

    roof(f"roof: HBM {spec / 1e9:.0f} GB/s, bf16 {tensor:g} TFLOP/s", spec, tensor, None)
    roof(f"reachable HBM {reach / 1e9:.0f} GB/s", reach, tensor, "dash")
    roof(f"CUDA cores fp32 {vector:g} TFLOP/s", spec, vector, "dot")
    for kind in dict.fromkeys(p["kind"] for p in pts):
        mine = [p for p in pts if p["kind"] == kind]
        fig.add_scatter(x=[p["intensity_flop_per_B"] for p in mine], y=[p["attained_TFLOPs"] for p in mine],
                        mode="markers", name=kind, marker=dict(size=8, opacity=0.7),
                        text=[f"{p['op']}: {p['time_us']:.2f} µs" for p in mine],
                        hovertemplate="%{text}<br>%{x:.3g} FLOP/B<br>%{y:.3g} TFLOP/s<extra></extra>")
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP per byte moved)")
    fig.update_yaxes(type="log", title="attained TFLOP/s")
    skipped = f"; {data['skipped']} ops without FLOPs left out" if data.get("skipped") else ""
    fig.update_layout(title=f"roofline — ops of {data['workload']} in {data['mode']} on {data['gpu']}{skipped}",
                      margin=dict(t=50, b=40, l=60, r=20))
    return fig


def whatif_figure(data: dict[str, Any]) -> go.Figure:
    """Latency per mode on the GPU as specified and with the what-if overrides (grouped bars)."""
    base, new = data["base"], data["whatif"]
    modes = list(base["modes"])
    fig = go.Figure()
    for label, d, colour in (("as specified", base, "#9e9e9e"), ("what-if", new, "#1f77b4")):
        ys = [d["modes"][m]["latency_us"] for m in modes]
        fig.add_bar(x=modes, y=ys, name=label, marker_color=colour, text=[f"{y:.1f}" for y in ys],
                    textposition="outside")
    fig.update_layout(barmode="group", title=f"latency (µs) — {base['workload']} on {base['gpu']}: as specified "
                      "and what-if", yaxis_title="µs", margin=dict(t=50, b=40, l=50, r=20))
    return fig

"""Figures for the explorer: pure functions from :mod:`explorer.data`'s plain data to plotly figures."""

from __future__ import annotations

from typing import Any

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
    """Step latency per mode, with the bandwidth floor as a dashed line."""
    fig = mode_bars(data, "latency_us", f"latency (µs) — {data['workload']} on {data['gpu']}")
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

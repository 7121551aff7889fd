"""The sweep (``mksim sweep``): its rows, the data behind its chart, and the chart as HTML (plotly
loads only when the chart is drawn)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mksim.compare import compare
from mksim.extras import require
from mksim.schedule import MODES
from mksim.target import Target
from mksim.workload import Step

__all__ = ["sweep_figure_html", "sweep_rows", "sweep_series"]


def sweep_rows(model: str, gpu: str | Target, batches: list[int], kv_lens: list[int],
               routing: str = "uniform", *, tp: int = 1, ep: int = 1) -> list[dict[str, Any]]:
    """One row per batch and KV length: each mode's latency (``<mode>_us``) and the megakernel's
    speed-up over graph_pdl (``megakernel_speedup_vs_graph_pdl``; ``None`` on a GPU without graph_pdl, whose
    ``graph_pdl_us`` is left out as the comparison leaves it out). ``routing``: a mixture of experts'
    routing model (``Step.routing``); ``tp``, ``ep``: the step split over GPUs (``Step.tp``, ``Step.ep``)."""
    target, rows = Target.of(gpu), []  # loaded once for every row
    for b in batches:
        for kv in kv_lens:
            m = compare(Step(model, b, kv, tp=tp, routing=routing, ep=ep), target).to_dict()["modes"]
            speedup = m["graph_pdl"]["latency_us"] / m["megakernel"]["latency_us"] if "graph_pdl" in m else None
            rows.append({"batch": b, "kv_len": kv, **{f"{k}_us": v["latency_us"] for k, v in m.items()},
                         "megakernel_speedup_vs_graph_pdl": speedup})
    return rows


def sweep_series(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The data behind the sweep chart: x labels and one latency series per mode."""
    x = [f"b{r['batch']} kv{r['kv_len']}" for r in rows]
    return {"x": x, "latency_us": {m: [r[f"{m}_us"] for r in rows] for m in MODES if rows and f"{m}_us" in rows[0]},
            "speedup": [r["megakernel_speedup_vs_graph_pdl"] for r in rows]}


def sweep_figure_html(rows: list[dict[str, Any]], model: str, gpu: str, path: str | Path) -> Path:
    """Write the sweep chart (latency per mode, the megakernel's speed-up) as an HTML page at ``path``."""
    go = require("plotly.graph_objects", "search", "mksim sweep --html")
    subplots = require("plotly.subplots", "search", "mksim sweep --html")
    data = sweep_series(rows)
    fig = subplots.make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=(
        "latency per step (µs)", "megakernel speed-up over graph_pdl"))
    for m, ys in data["latency_us"].items():
        fig.add_trace(go.Scatter(x=data["x"], y=ys, mode="lines+markers", name=m), row=1, col=1)
    fig.add_trace(go.Bar(x=data["x"], y=data["speedup"], name="speed-up", showlegend=False), row=2, col=1)
    fig.add_hline(y=1.0, line_dash="dot", row=2, col=1)
    fig.update_layout(title=f"{model} on {gpu}", height=700)
    p = Path(path)
    fig.write_html(p, include_plotlyjs="cdn")
    return p

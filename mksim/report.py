"""HTML reports (plotly loads only here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mksim.errors import MksimError

MODES = ("stream", "graph", "graph_pdl", "persistent_barrier", "megakernel")


def sweep_series(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The data behind the sweep chart: x labels and one latency series per mode."""
    x = [f"b{r['batch']} kv{r['kv_len']}" for r in rows]
    return {"x": x, "latency_us": {m: [r[f"{m}_us"] for r in rows] for m in MODES},
            "speedup": [r["megakernel_speedup_vs_graph_pdl"] for r in rows]}


def sweep_figure_html(rows: list[dict[str, Any]], model: str, gpu: str, path: str | Path) -> Path:
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        raise MksimError("--html needs plotly: pip install 'mksim[search]'") from None
    data = sweep_series(rows)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=(
        "latency per step (µs)", "megakernel speed-up over graph_pdl"))
    for m, ys in data["latency_us"].items():
        fig.add_trace(go.Scatter(x=data["x"], y=ys, mode="lines+markers", name=m), row=1, col=1)
    fig.add_trace(go.Bar(x=data["x"], y=data["speedup"], name="speed-up", showlegend=False), row=2, col=1)
    fig.add_hline(y=1.0, line_dash="dot", row=2, col=1)
    fig.update_layout(title=f"{model} on {gpu}", height=700)
    p = Path(path)
    fig.write_html(p, include_plotlyjs="cdn")
    return p

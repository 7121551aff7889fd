"""The search report: Optuna's plotly figures and the baselines table in one HTML file.

Data first: :func:`report_rows` is the table the page shows (tested without plotly); the
figures are Optuna's own (history, parameter importance, parallel coordinates, Pareto front). The page
embeds plotly.js once, so it opens offline.
"""

from __future__ import annotations

import html
import warnings
from pathlib import Path
from typing import Any

from mksim.extras import require


def report_rows(result: Any) -> list[dict[str, Any]]:
    """Best schedule first, then every baseline with the best's speed-up over it; on a step split over
    GPUs each row has its ``communication_us`` (the collective ops' span)."""
    best = result.best["latency_us"]

    def comm(r: dict[str, Any]) -> dict[str, Any]:
        return {k: r[k] for k in ("communication_us",) if k in r}

    rows = [{"schedule": f"best (trial {result.best['trial']})", "latency_us": best,
             "smem_KiB": result.best["smem_KiB"], "speedup": 1.0, **comm(result.best)}]
    for name, b in sorted(result.baselines.items(), key=lambda kv: kv[1]["latency_us"]):
        rows.append({"schedule": name, "latency_us": b["latency_us"], "smem_KiB": b["smem_KiB"],
                     "speedup": b["latency_us"] / best, **comm(b)})
    return rows


def candidate_rows(candidate: dict[str, Any]) -> list[tuple[str, str]]:
    """The best schedule's choices as ``(name, value)`` lines for the page: nested choices (options,
    policy options, grains) one per line as ``options.page_KiB``, an empty one as ``(defaults)``.

    >>> candidate_rows({"mode": "megakernel", "policy": None, "options": {"page_KiB": 32.0}, "grain": {}})
    [('mode', 'megakernel'), ('policy', 'none'), ('options.page_KiB', '32'), ('grain', '(defaults)')]
    """
    def text(v: Any) -> str:
        if v is None:
            return "none"
        if isinstance(v, float):
            return f"{v:g}"
        if isinstance(v, list | tuple):
            return ", ".join(text(x) for x in v)
        if isinstance(v, dict):
            return ", ".join(f"{kk}={text(vv)}" for kk, vv in v.items()) or "(defaults)"
        return str(v)

    rows: list[tuple[str, str]] = []
    for k, v in candidate.items():
        if isinstance(v, dict):
            rows.extend([(f"{k}.{kk}", text(vv)) for kk, vv in v.items()] or [(k, "(defaults)")])
        else:
            rows.append((k, text(v)))
    return rows


def write_report(study: Any, result: Any, path: str | Path) -> Path:
    """Write the search report of ``study`` and its :class:`SearchResult` ``result`` as one HTML page at ``path``."""
    vis = require("optuna.visualization", "search", "mksim search --report")
    warnings.filterwarnings("ignore", message="Some regimes for parameter")  # few trials: importance is rough
    figs = []
    target = (lambda t: t.values[0]) if len(result.objectives) > 1 else None
    name = "latency (µs)"
    figs.append(("History", vis.plot_optimization_history(study, target=target, target_name=name)))
    try:
        figs.append(("Parameter importance", vis.plot_param_importances(study, target=target, target_name=name)))
    except (RuntimeError, ValueError):  # too few completed trials for an importance estimate
        figs.append(("Parameter importance (not enough trials to estimate)", None))
    figs.append(("Parallel coordinates", vis.plot_parallel_coordinate(
        study, params=["mode", "policy", "page_KiB", "prefetch_depth", "sync", "kv_split_mult"],
        target=target, target_name=name)))
    if len(result.objectives) > 1:
        figs.append(("Pareto front: latency vs shared memory", vis.plot_pareto_front(
            study, target_names=["latency (µs)", "shared memory per SM (KiB)"])))
    rows = report_rows(result)
    comm = any("communication_us" in r for r in rows)  # a step split over GPUs

    def comm_cell(r: dict[str, Any]) -> str:
        return f"<td>{r['communication_us']:.1f}</td>" if "communication_us" in r else "<td></td>" if comm else ""

    table = "".join(f"<tr><td>{html.escape(r['schedule'])}</td><td>{r['latency_us']:.1f}</td>"
                    f"<td>{r['smem_KiB']:g}</td><td>{r['speedup']:.3f}×</td>{comm_cell(r)}</tr>" for r in rows)
    parts = [f"<h1>mksim search: {html.escape(result.study_name)}</h1>",
             f"<p>{result.n_complete} complete, {result.n_pruned} pruned, {result.n_failed} failed trials; "
             f"storage {html.escape(result.storage)}</p>",
             "<table border=1 cellpadding=4><tr><th>schedule</th><th>latency µs</th><th>smem KiB/SM</th>"
             f"<th>best's speed-up</th>{'<th>communication µs</th>' if comm else ''}</tr>{table}</table>",
             "<h2>Best schedule</h2><table border=1 cellpadding=4><tr><th>choice</th><th>value</th></tr>"
             + "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                       for k, v in candidate_rows(result.best["candidate"])) + "</table>"]
    first = True
    for title, fig in figs:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if fig is not None:
            parts.append(fig.to_html(full_html=False, include_plotlyjs=first))
            first = False
    p = Path(path)
    p.write_text("<!doctype html><html><head><meta charset='utf-8'></head><body>" + "".join(parts) + "</body></html>")
    return p

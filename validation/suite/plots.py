"""Plots of a validation summary: data first (pure functions of ``summary.json``), then matplotlib.

- predicted versus measured, log-log, one colour per mode, with y = x and a ±10 % band;
- each mode's error: mean absolute error as a bar, every case's signed error as a dot;
- bandwidth: bytes moved / measured time per case, against the calibrated HBM read bandwidth;
- by batch: each model's measured step against its batch, per mode and megakernel schedule, with
  the design target's bound (batch 8 within 1.15× of batch 1).

Without matplotlib :func:`write_plots` returns no files: the summary does not depend on it.
"""

from __future__ import annotations

from pathlib import Path

MODE_ORDER = ("stream", "graph", "graph_pdl", "persistent_barrier", "megakernel")
BAND = 0.10
MARKERS = {1: "o", 2: "D", 4: "s", 8: "^"}  # batch -> marker (others: "v")
B8_OVER_B1 = 1.15


def _compared(summary: dict) -> list[dict]:
    return [r for r in summary["cases"] if r["predicted_us"] is not None and r["measured_us"] and not r["error"]]


def _label(r: dict) -> str:
    return r["mode"] + (f" ({r['schedule']})" if r["mode"] == "megakernel" else "")


def scatter_data(summary: dict) -> dict[str, dict[str, list]]:
    """``{series: {"measured_us", "predicted_us", "spread_us", "names", "batches"}}``, one series
    per mode (the megakernel's per schedule), in mode order."""
    out: dict[str, dict[str, list]] = {}
    rows = sorted(_compared(summary), key=lambda r: (MODE_ORDER.index(r["mode"]) if r["mode"] in MODE_ORDER
                                                     else len(MODE_ORDER), r["schedule"]))
    for r in rows:
        s = out.setdefault(_label(r), {"measured_us": [], "predicted_us": [], "spread_us": [], "names": [],
                                       "batches": []})
        s["measured_us"].append(r["measured_us"])
        s["predicted_us"].append(r["predicted_us"])
        s["spread_us"].append(r["measured_spread_us"] or 0.0)
        s["names"].append(r["name"])
        s["batches"].append(r["batch"])
    return out


def error_data(summary: dict) -> dict[str, dict]:
    """``{mode: {"mape_pct", "max_abs_error_pct", "errors_pct": [signed, one per case]}}``."""
    out: dict[str, dict] = {}
    for label, s in scatter_data(summary).items():
        errs = [(p - m) / m * 100 for p, m in zip(s["predicted_us"], s["measured_us"], strict=True)]
        out[label] = {"mape_pct": sum(abs(e) for e in errs) / len(errs), "max_abs_error_pct": max(map(abs, errs)),
                      "errors_pct": errs}
    return out


def batch_data(summary: dict) -> dict[str, dict[str, dict[int, float]]]:
    """``{model: {series: {batch: measured µs}}}`` of every measured case whose output checked,
    series as in :func:`scatter_data`."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for r in summary["cases"]:
        if r["measured_us"] and not r["error"] and r["correct"] is not False:
            out.setdefault(r["model"], {}).setdefault(_label(r), {})[r["batch"]] = r["measured_us"]
    return {m: {k: dict(sorted(v.items())) for k, v in sorted(series.items(), key=lambda kv: _order(kv[0]))}
            for m, series in out.items()}


def _order(label: str) -> tuple[int, str]:
    mode = label.split(" ", 1)[0]
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), label)


def bandwidth_data(summary: dict) -> dict:
    """``{"names", "GBps", "hbm_read_GBps"}``: achieved bandwidth of each measured case."""
    rows = [r for r in summary["cases"] if r.get("achieved_GBps")]
    return {"names": [r["name"] for r in rows], "GBps": [r["achieved_GBps"] for r in rows],
            "hbm_read_GBps": summary["metrics"]["hbm_read_GBps"]}


def write_plots(summary: dict, out_dir: Path | str) -> list[Path]:
    """``predicted-vs-measured.png``, ``error-by-mode.png``, ``bandwidth.png`` and ``by-batch.png``
    in ``out_dir``; [] without matplotlib or without a single measured case."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    pts = scatter_data(summary)
    if not pts:
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{summary.get('gpu') or 'GPU'} vs {summary['predicted_with']}"
    made = []

    fig, ax = plt.subplots(figsize=(6.5, 6))
    every = [v for s in pts.values() for v in s["measured_us"] + s["predicted_us"]]
    lo, hi = min(every) / 1.3, max(every) * 1.3
    grid = [lo, hi]
    ax.fill_between(grid, [g * (1 - BAND) for g in grid], [g * (1 + BAND) for g in grid], color="0.9",
                    label=f"±{BAND:.0%}")
    ax.plot(grid, grid, "k-", lw=0.8, label="predicted = measured")
    for i, (label, s) in enumerate(pts.items()):
        for b in sorted(set(s["batches"])):
            at = [k for k, x in enumerate(s["batches"]) if x == b]
            ax.errorbar([s["measured_us"][k] for k in at], [s["predicted_us"][k] for k in at],
                        xerr=[s["spread_us"][k] / 2 for k in at], fmt=MARKERS.get(b, "v"), ms=5,
                        color=plt.cm.tab10(i), label=label if b == min(s["batches"]) else None, capsize=2)
    batches = sorted({b for s in pts.values() for b in s["batches"]})
    for b in batches if len(batches) > 1 else ():
        ax.plot([], [], MARKERS.get(b, "v"), color="0.4", label=f"batch {b}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured µs (median; bar: p10–p90)")
    ax.set_ylabel("predicted µs")
    ax.set_title(f"{title}: predicted vs measured", fontsize=9)
    ax.legend(fontsize=7)
    made.append(_save(fig, out / "predicted-vs-measured.png"))

    errs = error_data(summary)
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = list(errs)
    ax.bar(range(len(labels)), [errs[k]["mape_pct"] for k in labels], color="0.75", label="mean |error|")
    for i, k in enumerate(labels):
        ax.plot([i] * len(errs[k]["errors_pct"]), errs[k]["errors_pct"], "o", color=plt.cm.tab10(i), ms=4)
    ax.axhline(0, color="k", lw=0.6)
    for y in (-15, -10, 10, 15):
        ax.axhline(y, color="0.5", lw=0.5, ls=":" if abs(y) == 15 else "--")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("error, % (predicted / measured − 1)")
    ax.set_title(f"{title}: error by mode (dots: cases; lines: ±10 %, ±15 %)", fontsize=9)
    ax.legend(fontsize=7)
    made.append(_save(fig, out / "error-by-mode.png"))

    bw = bandwidth_data(summary)
    if bw["names"]:
        fig, ax = plt.subplots(figsize=(7, 0.6 + 0.25 * len(bw["names"])))
        ys = range(len(bw["names"]))
        ax.barh(ys, bw["GBps"], color="tab:blue")
        ax.axvline(bw["hbm_read_GBps"], color="k", lw=0.8, label=f"calibrated HBM read {bw['hbm_read_GBps']:.0f} GB/s")
        ax.axvline(0.7 * bw["hbm_read_GBps"], color="k", lw=0.6, ls="--", label="70 %")
        ax.set_yticks(list(ys), bw["names"], fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("bytes moved / measured time (GB/s)")
        ax.set_title(f"{title}: achieved bandwidth", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        made.append(_save(fig, out / "bandwidth.png"))

    by = batch_data(summary)
    if any(len(v) > 1 for series in by.values() for v in series.values()):
        fig, axes = plt.subplots(1, len(by), figsize=(5.5 * len(by), 4.5), squeeze=False)
        for ax, (model, series) in zip(axes[0], by.items(), strict=True):
            for i, (label, pts_b) in enumerate(series.items()):
                ax.plot(list(pts_b), list(pts_b.values()), "-o", ms=4, color=plt.cm.tab10(i), label=label)
            b1 = [v[1] for k, v in series.items() if k.startswith("megakernel") and 1 in v]
            if b1:
                ax.axhline(B8_OVER_B1 * min(b1), color="k", lw=0.7, ls="--",
                           label=f"{B8_OVER_B1:g}× the fastest megakernel at batch 1")
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({b for v in series.values() for b in v}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_xlabel("batch")
            ax.set_ylabel("measured µs per step")
            ax.set_title(f"{model}", fontsize=9)
            ax.legend(fontsize=6)
        fig.suptitle(f"{title}: the step against the batch", fontsize=9)
        made.append(_save(fig, out / "by-batch.png"))
    return made


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

"""Plots of a validation summary: data first (pure functions of ``summary.json``), then matplotlib.

- predicted versus measured, log-log, one colour per mode, with y = x and a ±10 % band;
- each mode's error: mean absolute error as a bar, every case's signed error as a dot;
- bandwidth: bytes moved / measured time per case, against the calibrated HBM read bandwidth.

Without matplotlib :func:`write_plots` returns no files: the summary does not depend on it.
"""

from __future__ import annotations

from pathlib import Path

MODE_ORDER = ("stream", "graph", "graph_pdl", "persistent_barrier", "megakernel")
BAND = 0.10


def _compared(summary: dict) -> list[dict]:
    return [r for r in summary["cases"] if r["predicted_us"] is not None and r["measured_us"] and not r["error"]]


def _label(r: dict) -> str:
    return r["mode"] + (f" ({r['schedule']})" if r["mode"] == "megakernel" else "")


def scatter_data(summary: dict) -> dict[str, dict[str, list]]:
    """``{series: {"measured_us", "predicted_us", "spread_us", "names"}}``, one series per mode
    (the megakernel's per schedule), in mode order."""
    out: dict[str, dict[str, list]] = {}
    rows = sorted(_compared(summary), key=lambda r: (MODE_ORDER.index(r["mode"]) if r["mode"] in MODE_ORDER
                                                     else len(MODE_ORDER), r["schedule"]))
    for r in rows:
        s = out.setdefault(_label(r), {"measured_us": [], "predicted_us": [], "spread_us": [], "names": []})
        s["measured_us"].append(r["measured_us"])
        s["predicted_us"].append(r["predicted_us"])
        s["spread_us"].append(r["measured_spread_us"] or 0.0)
        s["names"].append(r["name"])
    return out


def error_data(summary: dict) -> dict[str, dict]:
    """``{mode: {"mape_pct", "max_abs_error_pct", "errors_pct": [signed, one per case]}}``."""
    out: dict[str, dict] = {}
    for label, s in scatter_data(summary).items():
        errs = [(p - m) / m * 100 for p, m in zip(s["predicted_us"], s["measured_us"], strict=True)]
        out[label] = {"mape_pct": sum(abs(e) for e in errs) / len(errs), "max_abs_error_pct": max(map(abs, errs)),
                      "errors_pct": errs}
    return out


def bandwidth_data(summary: dict) -> dict:
    """``{"names", "GBps", "hbm_read_GBps"}``: achieved bandwidth of each measured case."""
    rows = [r for r in summary["cases"] if r.get("achieved_GBps")]
    return {"names": [r["name"] for r in rows], "GBps": [r["achieved_GBps"] for r in rows],
            "hbm_read_GBps": summary["metrics"]["hbm_read_GBps"]}


def write_plots(summary: dict, out_dir: Path | str) -> list[Path]:
    """``predicted-vs-measured.png``, ``error-by-mode.png`` and ``bandwidth.png`` in ``out_dir``;
    [] without matplotlib or without a single measured case."""
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
        ax.errorbar(s["measured_us"], s["predicted_us"], xerr=[v / 2 for v in s["spread_us"]], fmt="o", ms=5,
                    color=plt.cm.tab10(i), label=label, capsize=2)
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
    return made


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

"""Calibration plots: data first (pure functions returning series), then matplotlib drawing.

Drawing needs matplotlib (``pip install matplotlib``); without it :func:`write_plots` returns no
files and says nothing else: the overlay and the JSON results do not depend on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .fit import ConcurrencyFit, stat


def concurrency_series(raw: dict) -> dict[int, tuple[list[int], list[float]]]:
    """Bandwidth (GB/s) versus active SMs, one series per bytes-in-flight per SM."""
    series: dict[int, tuple[list[int], list[float]]] = {}
    for p in sorted(raw["concurrency"]["points"], key=lambda p: (p["inflight_bytes"], p["sms"])):
        xs, ys = series.setdefault(p["inflight_bytes"], ([], []))
        if p["sms"] in xs:  # same in-flight amount from another warps x loads split: keep the better
            i = xs.index(p["sms"])
            ys[i] = max(ys[i], p["bytes"] / stat(p["us"]).median / 1e3)
            continue
        xs.append(p["sms"])
        ys.append(p["bytes"] / stat(p["us"]).median / 1e3)
    return series


def boundary_series(raw: dict) -> dict[str, tuple[list[int], list[float]]]:
    rows = raw["boundary"]["boundary"]
    x = [r["bytes"] for r in rows]
    return {"alone": (x, [stat(r["alone_us"]).median for r in rows]),
            "in a CUDA graph": (x, [stat(r["graph_per_kernel_us"]).median for r in rows])}


def barrier_series(raw: dict) -> tuple[list[int], list[float]]:
    rows = raw["launch"].get("grid_sync", [])
    return [r["blocks_per_sm"] for r in rows], [stat(r["us"]).median for r in rows]


def latency_series(raw: dict) -> tuple[list[float], list[float]]:
    rows = raw["latency"]["chase"]
    return [r["size_bytes"] / 2**20 for r in rows], [stat(r["ns_per_load"]).median for r in rows]


def write_plots(raws: list[dict], fits: list[dict], out_dir: Path, stem: str) -> list[Path]:
    """PNG plots of the first run (and the fits) under ``out_dir``; [] without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    raw, fit = raws[0], fits[0]
    device = raw["meta"]["device"]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []

    if "concurrency" in raw:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        c = fit.get("concurrency")
        model = (ConcurrencyFit(c["latency_ns"], c["per_sm_max_GBps"], c["chip_max_GBps"], c["rms_log_err"])
                 if c else None)
        for i, (inflight, (xs, ys)) in enumerate(concurrency_series(raw).items()):
            color = plt.cm.viridis(i / max(len(concurrency_series(raw)) - 1, 1))
            ax.plot(xs, ys, "o", color=color, ms=3, label=f"{inflight / 1024:g} KiB/SM")
            if model:
                grid = np.arange(1, max(xs) + 1)
                ax.plot(grid, model.predict(grid, inflight), "-", color=color, lw=0.8)
        ax.set_xlabel("active SMs")
        ax.set_ylabel("DRAM read bandwidth (GB/s)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{device}: bandwidth vs SMs and bytes in flight (lines: fit)", fontsize=9)
        ax.legend(fontsize=6, ncol=2)
        made.append(_save(fig, out_dir / f"{stem}-bandwidth-vs-sms.png"))

    if "boundary" in raw:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, (x, y) in boundary_series(raw).items():
            ax.plot(np.array(x) / 2**20, y, "o-", ms=3, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bytes read by the kernel (MiB)")
        ax.set_ylabel("time per kernel (µs)")
        ga, gg = fit.get("boundary_alone"), fit.get("boundary_graph")
        if ga and gg:
            ax.set_title(f"{device}: kernel time vs bytes; fixed {ga['fixed_us']:.1f} µs alone, "
                         f"{gg['fixed_us']:.1f} µs in a graph", fontsize=9)
        ax.legend(fontsize=8)
        made.append(_save(fig, out_dir / f"{stem}-kernel-time-vs-bytes.png"))

    if "launch" in raw and raw["launch"].get("grid_sync"):
        fig, ax = plt.subplots(figsize=(6, 4))
        x, y = barrier_series(raw)
        ax.plot(x, y, "o-", label="cooperative grid.sync()")
        if "sync" in raw:
            ax.axhline(stat(raw["sync"]["counter_barrier_us"]).median, color="gray", ls="--",
                       label="counter barrier, 1 block/SM")
        ax.set_xlabel("blocks per SM")
        ax.set_ylabel("µs per barrier")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{device}: grid barrier cost vs blocks per SM", fontsize=9)
        ax.legend(fontsize=8)
        made.append(_save(fig, out_dir / f"{stem}-barrier-vs-blocks.png"))

    if "latency" in raw:
        fig, ax = plt.subplots(figsize=(6, 4))
        mib, ns = latency_series(raw)
        ax.plot(mib, ns, "o-")
        ax.set_xscale("log")
        ax.set_xlabel("pointer-chase footprint (MiB)")
        ax.set_ylabel("ns per dependent load")
        ax.set_ylim(bottom=0)
        ax.axvline(raw["meta"]["l2_bytes"] / 2**20, color="gray", ls=":", label="L2 size")
        ax.set_title(f"{device}: load-to-use latency", fontsize=9)
        ax.legend(fontsize=8)
        made.append(_save(fig, out_dir / f"{stem}-latency-vs-footprint.png"))
    return made


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

"""Pure analysis of the mechanism sweeps: schema checks, medians, fits and summary tables.

Needs only the standard library and numpy, so that it runs on the device machine (whose Python has
no mksim dependencies) as well as here on saved raw files. Units: bytes, microseconds (``us``),
nanoseconds (``ns``), GB/s = 1e9 bytes per second.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

SWEEPS = ("bw", "bwl1", "tma", "chain", "cost", "opb")

# Keys every point of a sweep carries (the schema of mech_bench's JSON).
POINT_KEYS: dict[str, tuple[str, ...]] = {
    "bw": ("set", "ilp", "minb", "threads", "bps", "sms", "stride", "regs", "resident_bps", "inflight_per_sm_B",
           "smem_per_sm_B"),
    "bwl1": ("set", "ilp", "minb", "threads", "bps", "sms", "stride", "regs", "resident_bps", "inflight_per_sm_B",
             "smem_per_sm_B"),
    "tma": ("stage_B", "depth", "sms", "threads", "inflight_per_sm_B"),
    "chain": ("bytes", "shape", "mode", "blocks", "threads", "kernels", "us"),
    "cost": ("bytes", "shape", "blocks", "threads", "n", "graph_n_us", "graph_1_us", "event_us"),
    "opb": ("mode", "work_ns", "region_B", "n_ops", "blocks", "threads", "us", "lat_first_ns", "lat_last_ns",
            "release_skew_ns", "bg_GBps"),
}
HEADER_KEYS = ("sweep", "device", "sms", "driver_version", "runtime_version", "points")
PDL_MODES = ("pdl_never", "pdl_late", "pdl_early", "pdl_early_readfirst")


class RawError(ValueError):
    """A raw sweep file does not have the shape mech_bench writes."""


def check_raw(raw: dict[str, Any]) -> str:
    """Check one sweep's raw JSON against the schema; return the sweep's name.

    >>> check_raw({"sweep": "opb", "device": "x", "sms": 1, "driver_version": 1, "runtime_version": 1, "points": []})
    'opb'
    """
    missing = [k for k in HEADER_KEYS if k not in raw]
    if missing:
        raise RawError(f"raw sweep lacks {', '.join(missing)}")
    sweep = raw["sweep"]
    if sweep not in SWEEPS:
        raise RawError(f"unknown sweep {sweep!r}; expected one of {', '.join(SWEEPS)}")
    for i, p in enumerate(raw["points"]):
        lacks = [k for k in POINT_KEYS[sweep] if k not in p]
        if lacks:
            raise RawError(f"{sweep} point {i} lacks {', '.join(lacks)}")
    return str(sweep)


def median(xs: list[float]) -> float:
    """Median of a non-empty list of samples."""
    if not xs:
        raise RawError("no samples")
    return float(statistics.median(xs))


def spread(xs: list[float]) -> float:
    """(max - min) / median of the samples: how far one run's repeats disagree."""
    m = median(xs)
    return (max(xs) - min(xs)) / m if m else 0.0


@dataclass(frozen=True)
class LineFit:
    """``time_us = intercept_us + bytes / (bandwidth_GBps * 1e3)``, fitted in relative error."""

    intercept_us: float
    bandwidth_GBps: float
    max_rel_residual: float
    n: int

    def predict_us(self, nbytes: float) -> float:
        """The fitted time of a kernel that moves ``nbytes``."""
        return self.intercept_us + nbytes / (self.bandwidth_GBps * 1e3)


def fit_line(nbytes: list[float], us: list[float]) -> LineFit:
    """Least-squares fit of time = a + bytes / BW, each point weighted by 1 / its time (so that a
    64 KiB kernel's few microseconds count as much as a 512 MiB kernel's hundred).

    >>> f = fit_line([1e6, 1e7, 1e8], [2.0 + 1e6 / 4e3, 2.0 + 1e7 / 4e3, 2.0 + 1e8 / 4e3])
    >>> round(f.intercept_us, 6), round(f.bandwidth_GBps, 3)
    (2.0, 4.0)
    """
    if len(nbytes) != len(us) or len(us) < 2:
        raise RawError("a line needs at least two (bytes, time) points")
    x = np.asarray(nbytes, dtype=float)
    y = np.asarray(us, dtype=float)
    w = 1.0 / y
    a = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (c0, c1), *_ = np.linalg.lstsq(a, y * w, rcond=None)
    if c1 <= 0:
        raise RawError("fitted slope is not positive: time does not grow with bytes")
    resid = np.abs((c0 + c1 * x) - y) / y
    return LineFit(float(c0), float(1.0 / c1 / 1e3), float(resid.max()), len(us))


# ----------------------------------------------------------------------------------------- bw
def bw_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per resident configuration: chip GB/s, GB/s per active SM, bytes in flight per SM and
    the load latency Little's law implies (bytes in flight / rate)."""
    rows = []
    for p in raw["points"]:
        if "us" not in p:
            continue  # not resident: recorded with its occupancy only
        gbps = p["bytes"] / median(p["us"]) / 1e3
        per_sm = gbps / p["sms"]
        rows.append({
            "set": p["set"], "smem_per_sm_KiB": p["smem_per_sm_B"] / 1024, "ilp": p["ilp"], "minb": p["minb"],
            "regs": p["regs"], "threads": p["threads"], "bps": p["bps"],
            "sms": p["sms"], "stride": p["stride"], "inflight_per_sm_KiB": p["inflight_per_sm_B"] / 1024,
            "GBps": gbps, "GBps_per_sm": per_sm, "spread": spread(p["us"]),
            "little_latency_ns": p["inflight_per_sm_B"] / per_sm,
        })
    return rows


def not_resident(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Configurations that could not be resident (registers or threads), with the occupancy found."""
    return [{k: p[k] for k in ("ilp", "minb", "regs", "threads", "bps", "resident_bps")}
            for p in raw["points"] if "us" not in p and p["sms"] == 1]


def knee(rows: list[dict[str, Any]], sms: int, fraction: float = 0.9) -> dict[str, Any]:
    """The least bytes in flight per SM at which ``sms`` contiguous SMs reach ``fraction`` of the most
    any configuration drew on them, and that most."""
    pts = [r for r in rows if r["sms"] == sms and r["stride"] == 1]
    if not pts:
        raise RawError(f"no bw points on {sms} SMs")
    best = max(r["GBps"] for r in pts)
    over = sorted((r for r in pts if r["GBps"] >= fraction * best), key=lambda r: r["inflight_per_sm_KiB"])
    return {"sms": sms, "fraction": fraction, "max_GBps": best, "inflight_per_sm_KiB": over[0]["inflight_per_sm_KiB"],
            "at": {k: over[0][k] for k in ("ilp", "threads", "bps")}}


def same_inflight(rows: list[dict[str, Any]], sms: int) -> list[dict[str, Any]]:
    """Groups of configurations with equal bytes in flight per SM on ``sms`` SMs: if one SM's draw
    depended only on bytes in flight, each group's rates would agree (``ratio`` near 1)."""
    groups: dict[float, list[dict[str, Any]]] = {}
    for r in rows:
        if r["sms"] == sms and r["stride"] == 1:
            groups.setdefault(r["inflight_per_sm_KiB"], []).append(r)
    out = []
    for kib, g in sorted(groups.items()):
        if len(g) < 2:
            continue
        lo, hi = min(g, key=lambda r: r["GBps_per_sm"]), max(g, key=lambda r: r["GBps_per_sm"])
        out.append({"inflight_per_sm_KiB": kib, "n": len(g), "min_GBps_per_sm": lo["GBps_per_sm"],
                    "min_at": {k: lo[k] for k in ("ilp", "threads", "bps")}, "max_GBps_per_sm": hi["GBps_per_sm"],
                    "max_at": {k: hi[k] for k in ("ilp", "threads", "bps")},
                    "ratio": hi["GBps_per_sm"] / lo["GBps_per_sm"]})
    return out


def summarize_bw(raw: dict[str, Any], only_set: str | None = None) -> dict[str, Any]:
    """Rows, the knee on 132 (all) SMs, the best one-SM draw and the equal-bytes-in-flight groups
    (of the rows of ``only_set`` where given)."""
    rows = [r for r in bw_rows(raw) if only_set is None or r["set"] == only_set]
    all_sms = max(r["sms"] for r in rows)
    one = [r for r in rows if r["sms"] == 1]
    best1 = max(one, key=lambda r: r["GBps"])
    return {
        "rows": rows, "not_resident": not_resident(raw),
        "knee_all_sms": [knee(rows, all_sms, f) for f in (0.9, 0.95)],
        "best_one_sm": {k: best1[k] for k in ("GBps", "ilp", "threads", "bps", "inflight_per_sm_KiB")},
        "same_inflight_one_sm": same_inflight(rows, 1),
        "same_inflight_all_sms": same_inflight(rows, all_sms),
    }


# ----------------------------------------------------------------------------------------- cost
def summarize_cost(raw: dict[str, Any]) -> dict[str, Any]:
    """Per grid shape: each size's time per kernel in a graph chain (replay / n), the marginal time
    (replay(n) - replay(1)) / (n - 1), one launch between events, and line fits of both."""
    shapes: dict[str, list[dict[str, Any]]] = {}
    for p in raw["points"]:
        n = p["n"]
        gn, g1 = median(p["graph_n_us"]), median(p["graph_1_us"])
        shapes.setdefault(p["shape"], []).append({
            "bytes": p["bytes"], "blocks": p["blocks"], "graph_per_kernel_us": gn / n,
            "marginal_us": (gn - g1) / (n - 1), "graph_1_us": g1, "event_us": median(p["event_us"]),
        })
    out: dict[str, Any] = {}
    for name, rows in shapes.items():
        rows.sort(key=lambda r: r["bytes"])
        x = [r["bytes"] for r in rows]
        fits = {k: fit_line(x, [r[k] for r in rows]).__dict__
                for k in ("graph_per_kernel_us", "marginal_us", "event_us")}
        big = [r for r in rows if r["bytes"] >= 16 << 20]
        if len(big) >= 2:
            fits["marginal_us_from_16MiB"] = fit_line([r["bytes"] for r in big],
                                                      [r["marginal_us"] for r in big]).__dict__
        out[name] = {"rows": rows, "fits": fits}
    return out


# ----------------------------------------------------------------------------------------- chain
def summarize_chain(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (bytes, shape): µs per kernel in each mode, and each PDL mode's change against the plain
    graph (negative: PDL saves time)."""
    cells: dict[tuple[float, str], dict[str, Any]] = {}
    for p in raw["points"]:
        c = cells.setdefault((p["bytes"], p["shape"]),
                             {"bytes": p["bytes"], "shape": p["shape"], "blocks": p["blocks"]})
        c[p["mode"]] = median(p["us"]) / p["kernels"]
    out = []
    for (_, _), c in sorted(cells.items()):
        if "graph" in c:
            for m in PDL_MODES:
                if m in c:
                    c[f"{m}_delta_us"] = c[m] - c["graph"]
                    c[f"{m}_delta_pct"] = 100.0 * (c[m] / c["graph"] - 1.0)
        out.append(c)
    return out


# ----------------------------------------------------------------------------------------- opb
def summarize_opb(raw: dict[str, Any]) -> dict[str, Any]:
    """Per configuration: µs per op, the release-to-resume latencies (from the last block's release to
    the first / last block's resume), the background bandwidth; and, per bytes per op, the cost of a
    boundary with a drained pipeline: (drain - single) / ops."""
    rows = []
    for p in raw["points"]:
        r = {"mode": p["mode"], "work_ns": p["work_ns"], "region_B": p["region_B"],
             "per_op_us": median(p["us"]) / p["n_ops"], "bg_GBps": median(p["bg_GBps"]) if p["bg_GBps"] else 0.0}
        if p["lat_first_ns"]:
            r.update(lat_first_ns=median(p["lat_first_ns"]), lat_last_ns=median(p["lat_last_ns"]),
                     release_skew_ns=median(p["release_skew_ns"]))
        rows.append(r)
    by = {(r["mode"], r["region_B"]): r for r in rows}
    drained = []
    for r in rows:
        if r["mode"] == "drain" and ("single", r["region_B"]) in by:
            s = by[("single", r["region_B"])]
            drained.append({"region_B": r["region_B"], "boundary_us": r["per_op_us"] - s["per_op_us"],
                            "single_per_op_us": s["per_op_us"],
                            "stream_GBps": r["region_B"] * raw["sms"] / s["per_op_us"] / 1e3})
    return {"rows": rows, "drained_boundary": drained,
            "globaltimer_step_ns": raw.get("globaltimer_step_ns")}


def l1_series(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``l1`` rows of a bwl1 sweep: per configuration and SM count, GB/s per SM as shared
    memory per SM grows (so the L1 left over shrinks)."""
    series: dict[tuple[int, int, int, int], dict[str, Any]] = {}
    for r in bw_rows(raw):
        if r["set"] != "l1":
            continue
        key = (r["ilp"], r["threads"], r["bps"], r["sms"])
        d = series.setdefault(key, {"ilp": r["ilp"], "threads": r["threads"], "bps": r["bps"], "sms": r["sms"],
                                    "inflight_per_sm_KiB": r["inflight_per_sm_KiB"], "smem_per_sm_KiB": [],
                                    "GBps_per_sm": []})
        d["smem_per_sm_KiB"].append(r["smem_per_sm_KiB"])
        d["GBps_per_sm"].append(r["GBps_per_sm"])
    return [series[k] for k in sorted(series)]


def summarize_bwl1(raw: dict[str, Any]) -> dict[str, Any]:
    """``summarize_bw`` of the unpadded rows, and the L1 series."""
    out = summarize_bw(raw, only_set="no_pad")
    out["l1"] = l1_series(raw)
    return out


def summarize_tma(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (stage size, depth, SMs): chip GB/s, GB/s per SM and the latency Little's law implies."""
    rows = []
    for p in raw["points"]:
        if "us" not in p:
            continue
        gbps = p["bytes"] / median(p["us"]) / 1e3
        rows.append({"stage_KiB": p["stage_B"] / 1024, "depth": p["depth"], "sms": p["sms"],
                     "inflight_per_sm_KiB": p["inflight_per_sm_B"] / 1024, "GBps": gbps,
                     "GBps_per_sm": gbps / p["sms"], "spread": spread(p["us"]),
                     "little_latency_ns": p["inflight_per_sm_B"] / (gbps / p["sms"])})
    return rows


SUMMARIZERS = {"bw": summarize_bw, "bwl1": summarize_bwl1, "tma": summarize_tma, "cost": summarize_cost,
               "chain": summarize_chain, "opb": summarize_opb}


def summarize(raws: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Summaries of every sweep given (name -> raw JSON), after checking each against the schema."""
    out: dict[str, Any] = {}
    for name, raw in raws.items():
        if check_raw(raw) != name:
            raise RawError(f"file for sweep {name!r} holds sweep {raw['sweep']!r}")
        out[name] = SUMMARIZERS[name](raw)
    return out


# ----------------------------------------------------------------------------------------- tables
def table(summary: dict[str, Any]) -> str:
    """A short plain-text table of the headline numbers of each summarised sweep."""
    lines: list[str] = []
    for name, title in (("bw", "exact blocks/SM by shared-memory padding (L1 ~28 KiB)"),
                        ("bwl1", "no padding (L1 as large as the driver gives)")):
        if name not in summary:
            continue
        s = summary[name]
        lines.append(f"{name}: GB/s on 1 SM, per SM on 8 SMs, on all SMs vs bytes in flight per SM; {title}")
        lines.append(f"{'ilp':>4} {'regs':>4} {'thr':>5} {'bps':>3} {'KiB':>6} {'1SM':>7} {'8SM/SM':>7} {'all':>7}")
        by: dict[tuple[int, int, int, int], dict[int, dict[str, Any]]] = {}
        for r in s["rows"]:
            if r["stride"] == 1:
                by.setdefault((r["ilp"], r["minb"], r["threads"], r["bps"]), {})[r["sms"]] = r
        for (ilp, _minb, thr, bps), d in sorted(by.items(),
                                                key=lambda kv: (kv[1][min(kv[1])]["inflight_per_sm_KiB"], kv[0])):
            any_r = next(iter(d.values()))
            top = d[max(d)]
            one = f"{d[1]['GBps']:7.1f}" if 1 in d else "      -"
            eight = f"{d[8]['GBps_per_sm']:7.1f}" if 8 in d else "      -"
            lines.append(f"{ilp:4d} {any_r['regs']:4d} {thr:5d} {bps:3d} {any_r['inflight_per_sm_KiB']:6.0f} {one} "
                         f"{eight} {top['GBps']:7.0f}")
        for k in s["knee_all_sms"]:
            lines.append(f"knee: {100 * k['fraction']:.0f}% of {k['max_GBps']:.0f} GB/s "
                         f"from {k['inflight_per_sm_KiB']:.0f} KiB/SM")
        for d in s.get("l1", []):
            pts = " ".join(f"{m:.0f}:{g:.0f}" for m, g in zip(d["smem_per_sm_KiB"], d["GBps_per_sm"], strict=True))
            lines.append(f"  l1 ilp {d['ilp']} {d['threads']}x{d['bps']} ({d['inflight_per_sm_KiB']:.0f} KiB) on "
                         f"{d['sms']} SMs, smem KiB:GB/s per SM  {pts}")
    if "tma" in summary:
        lines.append("tma: GB/s per SM on 1 SM and on all SMs (chip GB/s) vs stage x depth")
        by_cfg: dict[tuple[float, int], dict[int, dict[str, Any]]] = {}
        for r in summary["tma"]:
            by_cfg.setdefault((r["stage_KiB"], r["depth"]), {})[r["sms"]] = r
        for (kib, depth), d in sorted(by_cfg.items(), key=lambda kv: (kv[0][0] * kv[0][1], kv[0])):
            one = f"{d[1]['GBps']:7.1f}" if 1 in d else "      -"
            top = d[max(d)]
            lines.append(f"  {kib:4.0f} KiB x {depth:2d} = {kib * depth:4.0f} KiB: "
                         f"1 SM {one}  {max(d)} SMs {top['GBps']:7.0f}")
    if "cost" in summary:
        lines.append("cost: fits t = a + bytes/BW "
                     "(marginal time per kernel in a 16-kernel graph; one launch with events)")
        for name, c in summary["cost"].items():
            m, e = c["fits"]["marginal_us"], c["fits"]["event_us"]
            lines.append(f"  {name:12s} graph a={m['intercept_us']:6.2f} us BW={m['bandwidth_GBps']:6.0f} "
                         f"(max resid {100 * m['max_rel_residual']:4.0f}%)  event a={e['intercept_us']:6.2f} us "
                         f"BW={e['bandwidth_GBps']:6.0f}")
    if "chain" in summary:
        lines.append("chain: us per kernel (32-kernel graph); PDL modes as % vs plain graph")
        lines.append(f"{'MiB':>4} {'shape':12s} {'graph':>7} {'never':>7} {'late':>7} {'early':>7} "
                     f"{'e+read':>7}")
        for c in summary["chain"]:
            pct = [f"{c.get(m + '_delta_pct', float('nan')):+7.1f}" for m in PDL_MODES]
            lines.append(f"{c['bytes'] / 2**20:4.0f} {c['shape']:12s} {c.get('graph', float('nan')):7.2f} "
                         f"{' '.join(pct)}")
    if "opb" in summary:
        s = summary["opb"]
        lines.append(f"opb: op boundary (globaltimer step {s['globaltimer_step_ns']} ns)")
        for r in s["rows"]:
            lat = (f" lat first {r['lat_first_ns']:6.0f} last {r['lat_last_ns']:6.0f} ns"
                   if "lat_first_ns" in r else "")
            lines.append(f"  {r['mode']:7s} work {r['work_ns']:5.0f} ns region {r['region_B'] / 1024:5.0f} KiB: "
                         f"{r['per_op_us']:7.2f} us/op bg {r['bg_GBps']:6.0f} GB/s{lat}")
        for d in s["drained_boundary"]:
            lines.append(f"  drained boundary at {d['region_B'] / 1024:5.0f} KiB/SM/op: {d['boundary_us']:6.2f} us")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- headline
def _best(rows: list[dict[str, Any]], key: str, **match: float) -> float:
    return max((r[key] for r in rows if all(r[k] == v for k, v in match.items())), default=float("nan"))


def _lo_hi(values: list[float], fmt: str = "{:.0f}") -> str:
    """'lo–hi' of the values, one number when they agree at this precision, '-' for none."""
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def headline_rows(summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(mechanism, what was measured, value) rows of the headline numbers, from a full summary
    (every sweep of :data:`SWEEPS`). README.md beside the raw files embeds them."""
    rows: list[tuple[str, str, str]] = []
    # Kernels whose SASS keeps fewer loads in flight than their label (ILP 16 holds 12; ILP 8 at
    # 32 registers holds 4: build.json) are left out, so that "KiB in flight" means what it says.
    def honest(r: dict[str, Any]) -> bool:
        return r["stride"] == 1 and r["ilp"] <= 8 and not (r["ilp"] == 8 and r["regs"] <= 32)

    free = [r for r in summary["bwl1"]["rows"] if honest(r)]
    pad = [r for r in summary["bw"]["rows"] if honest(r)]
    chip = max(r["sms"] for r in free)
    for kib in (8, 16, 32, 64, 128):
        one = [r["GBps"] for r in free if r["sms"] == 1 and r["inflight_per_sm_KiB"] == kib]
        allsm = [r["GBps"] for r in free if r["sms"] == chip and r["inflight_per_sm_KiB"] == kib]
        rows.append(("DRAM bw vs bytes in flight", f"{kib} KiB in flight per SM, L1 free: 1 SM / {chip} SMs",
                     f"{_lo_hi(one)} / {_lo_hi(allsm)} GB/s"))
    rows.append(("DRAM bw vs bytes in flight", "one SM, best of any shape: L1 free / shared memory padded to ~228 KiB",
                 f"{_best(free, 'GBps', sms=1):.0f} / {_best(pad, 'GBps', sms=1):.0f} GB/s"))
    rows.append(("DRAM bw vs bytes in flight", f"chip, best ({chip} SMs, L1 free / padded)",
                 f"{_best(free, 'GBps', sms=chip):.0f} / {_best(pad, 'GBps', sms=chip):.0f} GB/s"))
    lat1 = [r["little_latency_ns"] for r in free if r["sms"] == 1 and r["inflight_per_sm_KiB"] <= 16]
    latk = [r["little_latency_ns"] for r in free if r["sms"] == chip and r["inflight_per_sm_KiB"] == 32]
    rows.append(("DRAM bw vs bytes in flight", "Little's-law latency: 1 SM at <= 16 KiB / chip at 32 KiB per SM",
                 f"{_lo_hi(lat1)} / {_lo_hi(latk)} ns"))
    for d in summary["bwl1"]["l1"]:
        if d["sms"] == 1 and (d["ilp"], d["threads"], d["bps"]) == (4, 1024, 2):
            pts = ", ".join(f"{m:.0f}: {g:.0f}" for m, g in zip(d["smem_per_sm_KiB"], d["GBps_per_sm"], strict=True))
            rows.append(("L1 bounds bytes in flight", "1 SM, 2 x 1024 threads x 4 loads; shared KiB/SM: GB/s", pts))
    for d in summary["tma"]:
        if d["sms"] == 1 and d["depth"] == 4:
            rows.append(("TMA pipeline (this kernel)", f"1 SM, {d['stage_KiB']:.0f} KiB stages x 4",
                         f"{d['GBps']:.1f} GB/s"))
    for name, c in summary["cost"].items():
        m, e = c["fits"]["marginal_us"], c["fits"]["event_us"]
        rows.append(("cost beyond bytes", f"{name}: per kernel in a graph / one launch with events",
                     f"{m['intercept_us']:.2f} / {e['intercept_us']:.2f} us + bytes / {m['bandwidth_GBps']:.0f} GB/s"))
    ch = summary["chain"]
    for mode in PDL_MODES:
        d = [c[f"{mode}_delta_pct"] for c in ch]
        slower = [f"{c['shape']} {c['bytes'] / 2**20:.0f} MiB" for c in ch if c[f"{mode}_delta_pct"] > 3.0]
        rows.append(("PDL trigger", f"{mode} vs plain graph, {len(d)} chains" + (f"; >3 % slower: {', '.join(slower)}"
                                                                             if slower else ""),
                     f"{min(d):+.1f} .. {max(d):+.1f} %"))
    o = summary["opb"]
    by = {(r["mode"], r["work_ns"]): r for r in o["rows"]}
    for mode in ("idle", "loaded"):
        if (mode, 2000) not in by:
            continue
        r = by[(mode, 2000)]
        rows.append(("op boundary", f"{mode} chip: last release -> first / last resume",
                     f"{r['lat_first_ns']:.0f} / {r['lat_last_ns']:.0f} ns"))
    rows.append(("op boundary", "drained (every op streams, then a counter barrier), per boundary",
                 _lo_hi([d["boundary_us"] for d in o["drained_boundary"]], "{:.2f}") + " us"))
    return rows


def headline_markdown(summary: dict[str, Any]) -> str:
    """The headline rows as a markdown table."""
    out = ["| mechanism | measured | value |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in headline_rows(summary)]
    return "\n".join(out) + "\n"

"""Fit the DRAM mechanism of mksim's model to the bandwidth microbenchmarks (no GPU).

The model (:func:`mksim.costs.loaded_total_Bpus`): an SM keeping ``F`` bytes in flight draws
``F / L`` where ``L`` is the latency a load sees, capped by the SM's port; ordinary loads in flight
hold L1 lines, so ``F`` is at most ``l1_load - shared memory``; and ``L`` grows with the chip's
load, ``L = L0 + queue * u / (1 - u)`` at a fraction ``u`` of the reachable bandwidth. Four
parameters — ``L0`` (``memory.dram.stream_latency_ns``), ``queue`` (``memory.dram.queue_ns``), the
port (``memory.concurrency.per_sm_bandwidth_max_GBps``) and ``l1_load``
(``memory.concurrency.l1_load_KiB``) — are fitted by least squares on the log of the rate over every
point of the ``bw`` and ``bwl1`` sweeps (1 to 132 SMs, 1 to 8 blocks per SM, 128 to 1024 threads,
1 to 16 loads per thread, 0 to 228 KiB of shared memory). The reachable bandwidth is the
calibrated chip's (``memory.dram``): not fitted here.

Loads in flight per thread are what the SASS keeps (``build.json``'s ``sass_loads_in_flight``),
not the template's nominal count: at 32 registers an "8 loads" loop keeps 4.

Run: python -m validation mechanisms fit validation/results/h200-mechanisms/raw [--gpu h200-calibrated]
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares  # type: ignore[import-untyped]

from validation.mechanisms.analysis import RawError

SETS = ("no_pad", "l1", "smem_pad")


@dataclass(frozen=True)
class DramFit:
    """The fitted DRAM mechanism and how well it reproduces the points it was fitted on."""
    stream_latency_ns: float
    queue_ns: float
    per_sm_bandwidth_max_GBps: float
    l1_load_KiB: float
    reachable_GBps: float
    points: int
    mape_pct: float
    mape_by_sms: dict[int, float]
    mape_by_set: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def dram_points(raw_bw: dict, raw_bwl1: dict, build: dict) -> np.ndarray:
    """Rows ``(sms, bytes in flight per SM, shared memory per SM, GB/s, set index)`` of every
    contiguous-SM point with times."""
    loads = build.get("sass_loads_in_flight", {})
    rows = []
    for raw in (raw_bw, raw_bwl1):
        for p in raw["points"]:
            if not p.get("us") or p.get("stride", 1) != 1 or p["set"] not in SETS:
                continue
            name = f"_Z4k_bwILi{p['ilp']}ELi{p['minb']}EEvPK5uint4miiiPjS3_S3_"
            per_thread = loads.get(name, p["ilp"])
            inflight = p["threads"] * per_thread * 16 * p["bps"]
            rate = p["bytes"] / statistics.median(p["us"]) / 1e3
            rows.append((p["sms"], inflight, p["smem_per_sm_B"], rate, SETS.index(p["set"])))
    if len(rows) < 8:
        raise RawError(f"the bandwidth sweeps hold {len(rows)} usable points; need at least 8")
    return np.array(rows, dtype=float)


def model_GBps(theta: np.ndarray | list[float], sms: np.ndarray, inflight: np.ndarray, smem: np.ndarray,
               reachable_GBps: float) -> np.ndarray:
    """The chip's rate (GB/s) the mechanism predicts; ``theta = (L0 µs, queue µs, port GB/s, l1 KiB)``.
    The same closed form as :func:`mksim.costs.loaded_total_Bpus` (in GB/s and µs)."""
    L0, q, port, l1 = theta
    f = np.minimum(inflight, np.maximum(l1 * 1024 - smem, 1024.0))
    demand = sms * np.minimum(f / L0 / 1e3, port)
    P = reachable_GBps
    b = L0 * (P + demand)
    disc = b * b + 4 * P * (q - L0) * demand * L0
    return P * 2 * demand * L0 / (b + np.sqrt(disc))


def fit_dram(raw_bw: dict, raw_bwl1: dict, build: dict, reachable_GBps: float) -> DramFit:
    """Least squares on log rates, from a start at typical Hopper values."""
    pts = dram_points(raw_bw, raw_bwl1, build)

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.log(model_GBps(theta, pts[:, 0], pts[:, 1], pts[:, 2], reachable_GBps) / pts[:, 3])

    res = least_squares(residuals, [0.47, 0.08, 180.0, 256.0], bounds=([0.2, 0.0, 50.0, 200.0],
                                                                      [2.0, 1.0, 1000.0, 320.0]),
                        x_scale=[0.1, 0.01, 10.0, 10.0])
    err = np.abs(np.exp(res.fun) - 1) * 100
    by_sms = {int(n): float(err[pts[:, 0] == n].mean()) for n in np.unique(pts[:, 0])}
    by_set = {s: float(err[pts[:, 4] == i].mean()) for i, s in enumerate(SETS) if (pts[:, 4] == i).any()}
    L0, q, port, l1 = (float(v) for v in res.x)
    return DramFit(stream_latency_ns=L0 * 1e3, queue_ns=q * 1e3, per_sm_bandwidth_max_GBps=port,
                   l1_load_KiB=l1, reachable_GBps=reachable_GBps, points=len(pts), mape_pct=float(err.mean()),
                   mape_by_sms=by_sms, mape_by_set=by_set)


def overlay_lines(fit: DramFit, raw_dir: str, sync: SyncLoadFit | None = None) -> str:
    """The fitted values as hardware-file lines (``{ value, source, note }``)."""
    sms = ", ".join(f"{n} SMs {e:.1f} %" for n, e in fit.mape_by_sms.items())
    note = (f"fit of the DRAM mechanism (stream latency, queue, SM port, L1 for loads) to {fit.points} points of "
            f"{raw_dir} bw + bwl1 at {fit.reachable_GBps:.0f} GB/s reachable: MAPE {fit.mape_pct:.1f} % ({sms}); "
            f"python -m validation mechanisms fit {raw_dir}")
    rows = [("memory.dram", "stream_latency_ns", round(fit.stream_latency_ns, 1)),
            ("memory.dram", "queue_ns", round(fit.queue_ns, 1)),
            ("memory.concurrency", "per_sm_bandwidth_max_GBps", round(fit.per_sm_bandwidth_max_GBps, 1)),
            ("memory.concurrency", "l1_load_KiB", round(fit.l1_load_KiB, 1))]
    notes = {key: note for _, key, _ in rows}
    if sync is not None:
        rows.append(("runtime.sync", "load_share_fraction", round(sync.load_share_fraction, 3)))
        notes["load_share_fraction"] = (
            f"opb sweep of {raw_dir}: a counter boundary (release to the mean of first and last resume) takes "
            f"{sync.idle_boundary_ns:.0f} ns idle, {sync.loaded_boundary_ns:.0f} ns while every SM streams "
            f"({sync.background_GBps:.0f} GB/s, where the DRAM fit queues {sync.queue_delay_ns:.0f} ns): the growth "
            f"over that delay; python -m validation mechanisms fit {raw_dir}")
    out, last = [], ""
    for sec, key, val in rows:
        if sec != last:
            out.append(f"[{sec}]")
            last = sec
        out.append(f'{key} = {{ value = {val}, source = "mechanisms", note = "{notes[key]}" }}')
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class SyncLoadFit:
    """What a counter boundary takes more under load, as a share of the DRAM queueing delay."""
    load_share_fraction: float
    idle_boundary_ns: float      # release to the mean of the first and last resume, idle chip
    loaded_boundary_ns: float    # ... while every SM streams
    background_GBps: float
    queue_delay_ns: float        # the DRAM mechanism's queueing delay at that background rate


def fit_sync_load(raw_opb: dict, dram: DramFit) -> SyncLoadFit:
    """From the ``opb`` sweep's ``idle`` and ``loaded`` points (same work per op): the boundary's
    growth (mean of first and last resume) over the queueing delay the DRAM fit gives at the
    measured background rate."""
    def mid(mode: str) -> tuple[float, float]:
        pts = [p for p in raw_opb["points"] if p["mode"] == mode and p.get("lat_first_ns")]
        if not pts:
            raise RawError(f"opb.json has no {mode!r} points with latencies")
        m = statistics.mean((statistics.median(p["lat_first_ns"]) + statistics.median(p["lat_last_ns"])) / 2
                            for p in pts)
        bg = statistics.mean(statistics.median(p["bg_GBps"]) for p in pts)
        return m, bg

    idle, _ = mid("idle")
    loaded, bg = mid("loaded")
    u = min(bg / dram.reachable_GBps, 0.999)
    queue = dram.queue_ns * u / (1 - u)
    return SyncLoadFit(load_share_fraction=(loaded - idle) / queue, idle_boundary_ns=idle,
                       loaded_boundary_ns=loaded, background_GBps=bg, queue_delay_ns=queue)


@dataclass(frozen=True)
class BulkCopyFit:
    """One bulk (TMA) copy of ``B`` bytes takes ``latency + B / rate`` (a pipeline of one block on
    one SM keeps one copy in flight whatever its depth)."""
    latency_ns: float
    GBps: float
    points: int
    max_rel_err: float


def fit_bulk_copy(raw_tma: dict) -> BulkCopyFit:
    """Least squares of time per stage against stage bytes over the ``tma`` sweep's one-SM points of
    depth 2 and more (depth 1 cannot overlap a copy with anything)."""
    xs, ts = [], []
    for p in raw_tma["points"]:
        if p.get("sms") != 1 or p.get("depth", 0) < 2 or not p.get("us"):
            continue
        rate = p["bytes"] / statistics.median(p["us"])  # B / µs
        xs.append(float(p["stage_B"]))
        ts.append(p["stage_B"] / rate)                  # µs per stage
    if len(xs) < 3:
        raise RawError(f"the tma sweep has {len(xs)} usable one-SM points of depth >= 2; need 3")
    slope, icpt = np.polyfit(np.array(xs), np.array(ts), 1)
    pred = icpt + slope * np.array(xs)
    return BulkCopyFit(latency_ns=float(icpt) * 1e3, GBps=1e-3 / float(slope), points=len(xs),
                       max_rel_err=float(np.max(np.abs(pred / np.array(ts) - 1))))


@dataclass(frozen=True)
class SentinelPollFit:
    """Data as its own flag (``sync="sentinel"``): from a producer's last store to a waiter seeing
    every byte it polls takes ``latency + KiB polled * per_KiB``, one line with the chip idle and one
    while every other SM streams DRAM (``background_GBps``); every SM's waiter polls the same bytes
    with the megakernel's poll loop (mech_bench ``poll``)."""
    latency_ns: float
    per_KiB_ns: float
    loaded_latency_ns: float
    loaded_per_KiB_ns: float
    background_GBps: float
    sizes_KiB: tuple[float, ...]
    max_rel_err: float
    seen_us: tuple[float, ...] = ()         # the measured medians the idle line is fitted to, by size
    loaded_seen_us: tuple[float, ...] = ()  # ... and the loaded line


def fit_sentinel_poll(raw_poll: dict) -> SentinelPollFit:
    """Least squares of the relative error of the median seen time (the pollers' median of a
    launch, median over launches) against the KiB polled, over the ``seen`` points of the ``poll``
    sweep, idle (no stream) and loaded apart. Nothing here comes from a megakernel step.

    >>> pts = [{"mode": "seen", "poll_B": k * 1024, "stream_B_per_sm": s, "seen_med_ns": [a + k * b],
    ...         "stream_GBps": [4300.0] if s else []} for k in (4, 16, 64) for s, a, b in ((0, 900, 250),
    ...                                                                                  (1, 3000, 500))]
    >>> f = fit_sentinel_poll({"points": pts})
    >>> round(f.latency_ns), round(f.per_KiB_ns), round(f.loaded_latency_ns), round(f.loaded_per_KiB_ns)
    (900, 250, 3000, 500)
    """
    lines, errs, bg, seen = {}, [], [], {}
    sizes: tuple[float, ...] = ()
    for loaded in (False, True):
        pts = [p for p in raw_poll.get("points", []) if p.get("mode") == "seen" and p.get("seen_med_ns")
               and bool(p.get("stream_B_per_sm")) == loaded]
        if len(pts) < 2:
            raise RawError(f"poll.json has {len(pts)} {'loaded' if loaded else 'idle'} 'seen' points; need 2")
        kib = np.array([p["poll_B"] / 1024 for p in pts], dtype=float)
        ns = np.array([statistics.median(p["seen_med_ns"]) for p in pts], dtype=float)
        a = np.vstack([np.ones_like(kib), kib]).T / ns[:, None]  # relative residuals
        icpt, slope = np.linalg.lstsq(a, np.ones_like(ns), rcond=None)[0]
        lines[loaded] = (float(icpt), float(slope))
        seen[loaded] = tuple(float(v) / 1e3 for v in ns)
        errs += list(np.abs((icpt + slope * kib) / ns - 1))
        if loaded:
            bg = [statistics.median(p["stream_GBps"]) for p in pts if p.get("stream_GBps")]
            sizes = tuple(float(k) for k in kib)
    return SentinelPollFit(latency_ns=lines[False][0], per_KiB_ns=lines[False][1], loaded_latency_ns=lines[True][0],
                           loaded_per_KiB_ns=lines[True][1], background_GBps=float(statistics.mean(bg)) if bg else 0.0,
                           sizes_KiB=sizes, max_rel_err=float(max(errs)), seen_us=seen[False],
                           loaded_seen_us=seen[True])

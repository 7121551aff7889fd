"""Pure fitting for calibration: raw benchmark samples in, hardware-model parameters out.

No GPU and no CuPy here: every function takes plain numbers, so CI tests it on synthetic data.
Units follow the hardware files: µs, ns, GB/s (1e9 B/s), KiB, TFLOP/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stat:
    """The median of repeated samples and their spread: (p90 - p10) / median.

    An inter-percentile range rather than max - min, so that one descheduled host thread among
    200 launches does not make a stable quantity look noisy.
    """
    median: float
    spread: float
    n: int


def stat(samples) -> Stat:
    """Median and relative spread of ``samples``.

    >>> stat([1.0, 1.1, 0.9])
    Stat(median=1.0, spread=0.16, n=3)
    """
    a = np.asarray(samples, dtype=float)
    if a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError("stat() needs finite samples")
    med = float(np.median(a))
    p10, p90 = np.percentile(a, [10, 90])
    spread = float((p90 - p10) / med) if med else 0.0
    return Stat(med, round(spread, 12), int(a.size))


@dataclass(frozen=True)
class Line:
    """``y = intercept + slope * x`` with its largest relative residual."""
    intercept: float
    slope: float
    max_rel_err: float

    def __call__(self, x):
        return self.intercept + self.slope * np.asarray(x, dtype=float)


def fit_line(x, y, relative: bool = True) -> Line:
    """Least-squares line; ``relative`` weights each point by 1/y, so small and large points count alike.

    >>> f = fit_line([1, 2, 4], [3, 5, 9])
    >>> round(f.intercept, 6), round(f.slope, 6)
    (1.0, 2.0)
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("fit_line() needs at least two distinct x")
    w = 1.0 / np.abs(y) if relative else np.ones_like(y)
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (b, m), *_ = np.linalg.lstsq(A, y * w, rcond=None)
    pred = b + m * x
    return Line(float(b), float(m), float(np.max(np.abs(pred - y) / np.abs(y))))


@dataclass(frozen=True)
class BoundaryFit:
    """A kernel's time as a fixed cost plus bytes over a bandwidth."""
    fixed_us: float
    bandwidth_GBps: float
    max_rel_err: float


def fit_boundary(nbytes, t_us) -> BoundaryFit:
    """Fit ``t = fixed + bytes / bandwidth`` to a small memory-bound kernel timed at several sizes.

    >>> f = fit_boundary([1e6, 1e7, 1e8], [2.0 + 1e6 / 4e6, 2.0 + 1e7 / 4e6, 2.0 + 1e8 / 4e6])  # 4e6 B/µs
    >>> round(f.fixed_us, 3), round(f.bandwidth_GBps)
    (2.0, 4000)
    """
    line = fit_line(nbytes, t_us)
    if line.slope <= 0:
        raise ValueError("kernel time does not grow with bytes: the benchmark measured no memory traffic")
    return BoundaryFit(line.intercept, 1.0 / line.slope / 1e3, line.max_rel_err)


@dataclass(frozen=True)
class ConcurrencyFit:
    """DRAM bandwidth versus active SMs and bytes in flight per SM (Little's law with two caps).

    ``bw(sms, inflight) = min(sms * min(inflight / latency, per_sm_max), chip_max)``.
    ``knee_KiB`` is the in-flight amount at which one SM reaches ``per_sm_max``.
    """
    latency_ns: float
    per_sm_max_GBps: float
    chip_max_GBps: float
    rms_log_err: float

    @property
    def knee_KiB(self) -> float:
        return self.per_sm_max_GBps * self.latency_ns / 1024  # GB/s * ns = bytes

    def predict(self, sms, inflight_B):
        sms = np.asarray(sms, dtype=float)
        per = np.minimum(np.asarray(inflight_B, dtype=float) / self.latency_ns, self.per_sm_max_GBps)
        return np.minimum(sms * per, self.chip_max_GBps)


def fit_concurrency(sms, inflight_B, bw_GBps) -> ConcurrencyFit:
    """Fit :class:`ConcurrencyFit` to measured points (least squares on log bandwidth).

    A coarse-to-fine grid search over the three parameters, robust where the regimes meet.
    """
    s = np.asarray(sms, dtype=float)
    f = np.asarray(inflight_B, dtype=float)
    y = np.log(np.asarray(bw_GBps, dtype=float))
    if s.size < 4:
        raise ValueError("fit_concurrency() needs at least 4 points")
    per_sm_obs = np.exp(y) / s
    lo = np.log([20.0, float(per_sm_obs.min()) / 2, float(np.exp(y.max())) * 0.6])
    hi = np.log([20000.0, float(per_sm_obs.max()) * 4, float(np.exp(y.max())) * 1.1])
    best = (math.inf, lo)
    for _ in range(6):
        axes = [np.linspace(lo[k], hi[k], 40) for k in range(3)]
        L, C, H = (np.exp(a) for a in np.meshgrid(*axes, indexing="ij"))
        per = np.minimum(f / L[..., None], C[..., None])
        pred = np.log(np.minimum(s * per, H[..., None]))
        err = ((pred - y) ** 2).mean(axis=-1)
        idx = np.unravel_index(np.argmin(err), err.shape)
        if err[idx] < best[0]:
            best = (float(err[idx]), np.array([axes[k][idx[k]] for k in range(3)]))
        step = np.array([(hi[k] - lo[k]) / 39 for k in range(3)])
        lo, hi = best[1] - 3 * step, best[1] + 3 * step
    lat, cap, chip = np.exp(best[1])
    return ConcurrencyFit(float(lat), float(cap), float(chip), math.sqrt(best[0]))


@dataclass(frozen=True)
class BoundaryParts:
    """The kernel boundary taken apart (``boundary_parts.cu``: chains of empty kernels 1 to 200
    long, and 16-kernel chains of a memory-bound kernel that reads a few bytes per SM).

    - ``node_us[mode]``, ``graph_start_us[mode]``: the fit ``n * t(n) = start + (n - 1) * node``
      over the empty chains (``mode`` is ``graph`` or ``pdl_wait_first``): ``start`` is the graph's
      own start and end as the events around its replay see them, ``node`` the interval per kernel;
    - ``first_load_us``: what a kernel whose blocks are already resident (PDL, waiting for their
      predecessor) adds to an empty kernel before its first bytes: the first DRAM load of a fresh
      kernel on an SM (and its few instructions);
    - ``block_setup_us``: what the same kernel adds beyond that in a plain graph, where its blocks
      start only once the predecessor has ended: their set-up before the first load.
    """
    node_us: dict[str, float]
    graph_start_us: dict[str, float]
    block_setup_us: float
    first_load_us: float
    block_setup_spread: float  # (p90 - p10) of the samples of the chains behind it, summed, over the value
    first_load_spread: float
    read_bytes: int


def fit_boundary_parts(rows: list[dict], read_GBps: float, kernel: str = "read_nowrite") -> BoundaryParts:
    """Fit :class:`BoundaryParts` to the rows of ``boundary_parts.cu``; ``read_GBps`` converts the
    read chain's few bytes (64 KiB, the smallest size) into time.

    >>> rows = [{"part": "empty", "mode": m, "chain": n, "bytes": 0, "threads": 128,
    ...          "us": [(2.0 + (n - 1) * (0.6 if m == "graph" else 0.7)) / n]}
    ...         for m in ("graph", "pdl_wait_first") for n in (1, 16, 200)]
    >>> rows += [{"part": "read", "kernel": "read_nowrite", "mode": "graph", "chain": 16, "bytes": 64000,
    ...           "threads": 512, "us": [rows[1]["us"][0] + 0.9 + 0.016]},
    ...          {"part": "read", "kernel": "read_nowrite", "mode": "pdl_wait_first", "chain": 16, "bytes": 64000,
    ...           "threads": 512, "us": [rows[4]["us"][0] + 0.6 + 0.016]}]
    >>> f = fit_boundary_parts(rows, read_GBps=4000.0)
    >>> round(f.node_us["graph"], 3), round(f.graph_start_us["pdl_wait_first"], 3)
    (0.6, 2.0)
    >>> round(f.block_setup_us, 3), round(f.first_load_us, 3)
    (0.3, 0.6)
    """
    node, start = {}, {}
    empty16: dict[str, Stat] = {}
    for mode in ("graph", "pdl_wait_first"):
        pts = [(r["chain"], stat(r["us"])) for r in rows if r["part"] == "empty" and r["mode"] == mode]
        if len(pts) < 2:
            raise ValueError(f"boundary parts: need empty chains of two lengths ({mode})")
        n = np.array([p[0] for p in pts], dtype=float)
        line = fit_line(n - 1, n * np.array([p[1].median for p in pts]), relative=False)
        node[mode], start[mode] = line.slope, line.intercept
        if 16 not in dict(pts):
            raise ValueError(f"boundary parts: need a 16-kernel empty chain ({mode}), as long as the read chains")
        empty16[mode] = dict(pts)[16]
    reads = [r for r in rows if r["part"] == "read" and r["kernel"] == kernel and r["threads"] == 512
             and r["chain"] == 16 and r["bytes"] > 0]
    if not reads:
        raise ValueError(f"boundary parts: no 16-kernel chains of {kernel}")
    size = min(r["bytes"] for r in reads)
    extra = {}
    for mode in ("graph", "pdl_wait_first"):
        t = stat(next(r for r in reads if r["mode"] == mode and r["bytes"] == size)["us"])
        extra[mode] = (t.median - empty16[mode].median - size / (read_GBps * 1e3),
                       t.spread * t.median + empty16[mode].spread * empty16[mode].median)
    first, setup = extra["pdl_wait_first"][0], extra["graph"][0] - extra["pdl_wait_first"][0]
    return BoundaryParts(node, start, setup, first, (extra["graph"][1] + extra["pdl_wait_first"][1]) / abs(setup),
                         extra["pdl_wait_first"][1] / abs(first), size)


def tflops(flops: float, t_us: float) -> float:
    """FLOP over µs, in TFLOP/s."""
    return flops / t_us / 1e6

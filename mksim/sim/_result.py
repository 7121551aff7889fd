"""Simulation results: latency, where the time went, per-op times, the per-SM timeline."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Where an SM's time goes. Averaged over SMs (or SM slots), the categories sum to the latency.
CATEGORIES = ("memory", "compute", "launch", "barrier wait", "dependency wait", "bubble", "tail idle")


@dataclass
class SimResult:
    """The outcome of :func:`mksim.simulate`. Times in µs."""
    mode: str
    gpu: str
    workload: str
    policy: str | None
    latency_us: float
    tokens: int
    dram_bytes: float
    hbm_spec_Bps: float
    bandwidth_floor_us: float
    breakdown_us: dict[str, float]
    per_op: list[dict[str, Any]]
    n_tasks: int
    n_lanes: int
    lanes_per_sm: int
    timeline: list[tuple[int, float, float, int, str]] = field(repr=False, default_factory=list)
    task_names: list[str] = field(repr=False, default_factory=list)
    hbm_log: list[tuple[float, float]] | None = field(repr=False, default=None)
    task_start_us: np.ndarray | None = field(repr=False, default=None)
    task_end_us: np.ndarray | None = field(repr=False, default=None)
    task_lane: np.ndarray | None = field(repr=False, default=None)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.latency_us * 1e-6)

    @property
    def hbm_util(self) -> float:
        """Achieved DRAM bandwidth as a fraction of the datasheet bandwidth."""
        return self.dram_bytes / (self.latency_us * 1e-6) / self.hbm_spec_Bps

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        d = {"mode": self.mode, "gpu": self.gpu, "workload": self.workload, "policy": self.policy,
             "latency_us": self.latency_us, "tokens_per_s": self.tokens_per_s, "hbm_util": self.hbm_util,
             "dram_bytes": self.dram_bytes, "bandwidth_floor_us": self.bandwidth_floor_us,
             "breakdown_us": self.breakdown_us, "n_tasks": self.n_tasks, "per_op": self.per_op}
        if timeline:
            d["timeline"] = [{"lane": ln, "start_us": a, "end_us": b, "task": self.task_names[t],
                              "what": c} for ln, a, b, t, c in self.timeline]
        return d

    def to_perfetto(self, path: str | Path) -> Path:
        """Write a Chrome trace (opens in Perfetto / chrome://tracing): one track per SM."""
        events: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 0,
                                         "args": {"name": f"{self.gpu} {self.mode}"}}]
        for lane in range(self.n_lanes):
            sm, slot = divmod(lane, self.lanes_per_sm)
            name = f"SM {sm}" + (f" slot {slot}" if self.lanes_per_sm > 1 else "")
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": lane, "args": {"name": name}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": lane,
                           "args": {"sort_index": lane}})
        for lane, a, b, t, cat in self.timeline:
            if lane < 0:
                continue
            name = self.task_names[t] if cat == "task" else cat
            events.append({"name": name, "cat": cat, "ph": "X", "ts": a, "dur": b - a, "pid": 0, "tid": lane,
                           "args": {"task": self.task_names[t]}})
        p = Path(path)
        p.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
        return p


_CODE = {c: i for i, c in enumerate(CATEGORIES + ("task", "data wait"))}
_BUBBLE, _MEMORY, _TASK, _DATA_WAIT = _CODE["bubble"], _CODE["memory"], _CODE["task"], _CODE["data wait"]


def lane_time_us(segs: list[tuple[int, float, float, int, str]], n_tasks: int) -> np.ndarray:
    """SM time per category (indexed like :data:`CATEGORIES`), summed over the SMs' lanes.

    Loader lanes (negative) count only through an executor's data wait: where the loader was
    in a DRAM-latency bubble for that task, the wait is bubble; the rest is memory.
    """
    out = np.zeros(len(CATEGORIES))
    if not segs:
        return out
    lane_t, a_t, b_t, task_t, cat_t = zip(*segs)
    lane, a, b, task = np.array(lane_t), np.array(a_t), np.array(b_t), np.array(task_t)
    code = np.fromiter(map(_CODE.__getitem__, cat_t), dtype=np.int64, count=len(segs))
    own = (lane >= 0) & (code < len(CATEGORIES))
    out += np.bincount(code[own], weights=(b - a)[own], minlength=len(CATEGORIES))
    wait = np.flatnonzero((lane >= 0) & (code == _DATA_WAIT))
    if wait.size:
        bub = np.flatnonzero((lane < 0) & (code == _BUBBLE))
        key = (-1 - lane[bub]) * n_tasks + task[bub]  # (SM, task) of each loader bubble
        order = np.argsort(key, kind="stable")
        key, bub = key[order], bub[order]
        wkey = lane[wait] * n_tasks + task[wait]
        lo, hi = np.searchsorted(key, wkey, "left"), np.searchsorted(key, wkey, "right")
        in_bubble = np.zeros(wait.size)
        for j in range(int((hi - lo).max(initial=0))):  # a task's loader has a few bubbles at most
            has = lo + j < hi
            k = bub[np.minimum(lo + j, len(bub) - 1)]
            ov = np.minimum(b[wait], b[k]) - np.maximum(a[wait], a[k])
            in_bubble += np.where(has, np.maximum(ov, 0.0), 0.0)
        out[_BUBBLE] += in_bubble.sum()
        out[_MEMORY] += (b[wait] - a[wait]).sum() - in_bubble.sum()
    return out


def build_result(s, r, start, end, lane_of, segs, n_lanes, t0, spans, hbm) -> SimResult:
    g = s.graph
    latency = float(np.nanmax(end))
    cover = lane_time_us(segs, len(g))
    total = latency * n_lanes
    if spans is None:
        launch = t0 * n_lanes
    else:  # time outside every kernel is launch time for all lanes
        busy, cur_a, cur_b = 0.0, None, None
        for a, b in sorted(spans):
            if cur_b is None or a > cur_b:
                if cur_b is not None:
                    busy += cur_b - cur_a
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        if cur_b is not None:
            busy += cur_b - cur_a
        launch = (latency - busy) * n_lanes
    covered = float(cover.sum())
    cover[CATEGORIES.index("launch")] += launch
    cover[CATEGORIES.index("tail idle")] += max(0.0, total - covered - launch)
    breakdown = {c: float(v / n_lanes) for c, v in zip(CATEGORIES, cover)}
    first = g.op_first[:-1]
    op_start, op_end = np.minimum.reduceat(start, first), np.maximum.reduceat(end, first)
    per_op = [{"op": op.name, "kind": op.kind, "tasks": int(k), "start_us": float(a), "end_us": float(b),
               "time_us": float(b - a)} for op, k, a, b in zip(g.ops, g.n_tiles, op_start, op_end)]
    names = [f"{op.name}[{i}]" for op, k in zip(g.ops, g.n_tiles.tolist()) for i in range(k)]
    wl = s.workload
    dram = float(hbm.bytes_done)
    return SimResult(mode=s.mode, gpu=s.gpu.name, workload=wl.name, policy=s.policy, latency_us=latency,
                     tokens=wl.tokens, dram_bytes=dram, hbm_spec_Bps=s.gpu.dram.bandwidth_spec_GBps * 1e9,
                     bandwidth_floor_us=wl.bandwidth_floor_us(s.gpu.dram.bandwidth_spec_GBps * 1e9),
                     breakdown_us=breakdown, per_op=per_op, n_tasks=len(g), n_lanes=n_lanes,
                     lanes_per_sm=n_lanes // s.gpu.sm.count, timeline=segs, task_names=names, hbm_log=hbm.log,
                     task_start_us=start, task_end_us=end, task_lane=lane_of)

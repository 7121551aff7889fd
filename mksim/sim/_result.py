"""Simulation results: latency, where the time went, per-op times, the per-SM timeline."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mksim.workload import COLLECTIVE_KINDS

if TYPE_CHECKING:
    from mksim.workload import TaskGraph

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
    # the timeline as the engine records it, five items a segment (`timeline` makes the tuples when first
    # read), and the graph whose tasks `task_names` names (None: no names)
    segments_flat: list[Any] = field(repr=False, default_factory=list, compare=False)
    names_of: TaskGraph | None = field(repr=False, default=None, compare=False)
    hbm_log: list[tuple[float, float]] | None = field(repr=False, default=None)
    task_start_us: np.ndarray | None = field(repr=False, default=None)
    task_end_us: np.ndarray | None = field(repr=False, default=None)
    task_lane: np.ndarray | None = field(repr=False, default=None)
    # what the designs that were on report, by design name (the dies design: traffic across dies)
    design_stats: dict[str, dict[str, Any]] = field(default_factory=dict)

    _timeline: list[tuple[int, float, float, int, str]] | None = field(init=False, repr=False, default=None,
                                                                       compare=False)
    _task_names: list[str] | None = field(init=False, repr=False, default=None, compare=False)

    @property
    def timeline(self) -> list[tuple[int, float, float, int, str]]:
        """What each lane's time went to, as ``(lane, start_us, end_us, task, category)`` segments in the
        order the run recorded them (:class:`Timeline`); empty with ``simulate(..., timeline=False)``.
        Made from the engine's flat record when first read: a caller that never reads it does not pay
        for a tuple per segment."""
        if self._timeline is None:
            it = iter(self.segments_flat)
            self._timeline = list(zip(it, it, it, it, it, strict=True))
            self.segments_flat = []
        return self._timeline

    @property
    def task_names(self) -> list[str]:
        """Each task's name (:func:`timeline_names`), made when first read; empty without a timeline."""
        if self._task_names is None:
            self._task_names = timeline_names(self.names_of) if self.names_of is not None else []
        return self._task_names

    @property
    def communication_us(self) -> float | None:
        """A step split over GPUs: the time its collective ops span (each from its first task's start to
        its last's end, summed: in a decode step they follow one another), None for a step on one GPU.
        It overlaps the breakdown's categories, which hold what the SMs did meanwhile."""
        spans = [op["time_us"] for op in self.per_op if op["kind"] in COLLECTIVE_KINDS]
        return sum(spans) if spans else None

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
        if self.communication_us is not None:
            d["communication_us"] = self.communication_us
        d.update(self.design_stats)
        if timeline:
            d["timeline"] = [{"lane": ln, "start_us": a, "end_us": b, "task": self.task_names[t],
                              "what": c} for ln, a, b, t, c in self.timeline]
        return d

    def to_perfetto(self, path: str | Path) -> Path:
        """Write a Chrome trace (opens in Perfetto / chrome://tracing): one track per SM (SM slot),
        one per persistent SM's loader (``SM n loader``: what it streamed for which task, and its
        first-byte latencies) under its SM, and an ``HBM bandwidth`` counter track (the chip's DRAM
        rate in GB/s over time, from :attr:`hbm_log`; absent when the run kept no log)."""
        events: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 0,
                                         "args": {"name": f"{self.gpu} {self.mode}"}}]

        def track(tid: int, name: str, sort: int) -> None:
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid,
                           "args": {"sort_index": sort}})

        for lane in range(self.n_lanes):
            sm, slot = divmod(lane, self.lanes_per_sm)
            track(lane, f"SM {sm}" + (f" slot {slot}" if self.lanes_per_sm > 1 else ""), 2 * lane)
        loaders = sorted({-1 - lane for lane, *_ in self.timeline if lane < 0})
        for sm in loaders:  # a loader's track: tid after the lanes, sorted right under its SM's last lane
            track(self.n_lanes + sm, f"SM {sm} loader", 2 * ((sm + 1) * self.lanes_per_sm - 1) + 1)
        for lane, a, b, t, cat in self.timeline:
            task = self.task_names[t]
            if lane < 0:
                name = f"load {task}" if cat == "memory" else "first-byte latency"
                events.append({"name": name, "cat": f"loader {cat}", "ph": "X", "ts": a, "dur": b - a,
                               "pid": 0, "tid": self.n_lanes - 1 - lane, "args": {"task": task}})
                continue
            name = task if cat == "task" else cat
            events.append({"name": name, "cat": cat, "ph": "X", "ts": a, "dur": b - a, "pid": 0, "tid": lane,
                           "args": {"task": task}})
        events.extend(self._hbm_counter())
        p = Path(path)
        p.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
        return p

    def _hbm_counter(self) -> list[dict[str, Any]]:
        """The HBM rate log as Chrome counter events (GB/s): the last rate of each instant, a new
        event only where it changes, and 0 at the end of the run."""
        if not self.hbm_log:
            return []
        steps: dict[float, float] = {}
        for t, Bpus in self.hbm_log:
            steps[t] = Bpus * 1e-3  # B/µs -> GB/s
        steps.setdefault(self.latency_us, 0.0)
        out: list[dict[str, Any]] = []
        last = None
        for t in sorted(steps):
            v = steps[t]
            if v != last:
                out.append({"name": "HBM bandwidth", "ph": "C", "ts": t, "pid": 0, "args": {"GB/s": v}})
                last = v
        return out


def task_experts(g: TaskGraph) -> list[tuple[int, int] | None]:
    """Per task of ``g``: ``(expert, tile)`` for a task of a mixture of experts' grouped expert op
    (``attrs["grouped"] == "experts"``): the expert it serves and its tile among that expert's tiles of
    the op; ``None`` for every other task. A task of group ``i`` serves ``attrs["group_experts"][i]``;
    an op's tiles split evenly over its ``groups`` (tiling gives a grouped op a multiple of them)."""
    out: list[tuple[int, int] | None] = []
    for op, k in zip(g.ops, g.n_tiles.tolist(), strict=True):
        experts = op.attrs.get("group_experts") if op.attrs.get("grouped") == "experts" else None
        if experts is None:
            out.extend([None] * k)
            continue
        groups, seen = op.attrs["groups"], dict.fromkeys(experts, 0)
        for i in range(k):
            e = int(experts[i * groups // k])  # gate and up of one expert are two groups: its tiles count on
            out.append((e, seen[e]))
            seen[e] += 1
    return out


def timeline_names(g: TaskGraph) -> list[str]:
    """Each task's name in the timeline, the trace and ``to_dict(timeline=True)``: ``op[tile]``, and for an
    expert task (:func:`task_experts`) its expert and its tile among that expert's (``L3.experts_down e17
    t2``), so a trace says which SM ran which expert."""
    names: list[str] = []
    for op, k in zip(g.ops, g.n_tiles.tolist(), strict=True):
        name = op.name
        names += [f"{name}[{i}]" for i in range(k)]
    experts = task_experts(g)
    if experts.count(None) < len(experts):
        for t, et in enumerate(experts):
            if et is not None:
                names[t] = f"{names[t].rpartition('[')[0]} e{et[0]} t{et[1]}"
    return names


class Timeline:
    """What each stretch of each lane's time was spent on, as ``(lane, start, end, task,
    category)`` segments, and each category's total over the SM lanes (the breakdown), added up
    as the segments are recorded. Lanes are SMs (SM slots in chain modes); a persistent SM's
    loader is lane ``-1 - sm``, and its time counts only through its executor's data waits.

    ``segs`` holds the segments flat, five items each, in the order they are recorded (a run adds
    several per task: ``segs += (lane, a, b, t, cat)`` makes no tuple to keep, and the cycle
    collector has one list to walk, not a tuple per segment); :attr:`SimResult.timeline` makes the
    tuples. With ``segments=False`` only the totals are kept (``simulate(..., timeline=False)``).

    >>> tl = Timeline()
    >>> tl.add(0, 1.0, 2.5, 7, "compute"); tl.add(0, 2.5, 2.5, 7, "compute")
    >>> tl.segs, tl.us["compute"]
    ([0, 1.0, 2.5, 7, 'compute'], 1.5)
    """

    def __init__(self, segments: bool = True) -> None:
        self.segments = segments
        self.segs: list[Any] = []
        self.us = dict.fromkeys(CATEGORIES, 0.0)

    def add(self, lane: int, a: float, b: float, t: int, cat: str) -> None:
        if b > a:
            if self.segments:
                self.segs += (lane, a, b, t, cat)
            self.us[cat] += b - a

    def task(self, lane: int, a: float, b: float, t: int) -> None:
        """Task ``t`` ran on ``lane`` from ``a`` to ``b`` (spanning the categories within)."""
        if b > a and self.segments:
            self.segs += (lane, a, b, t, "task")

    def flow(self, lane: int, a: float, lat_us: float, b: float, t: int, count: bool = True) -> None:
        """A transfer started at ``a``, paid ``lat_us`` of first-byte latency (a bubble) and
        ended at ``b``; ``count=False`` for a loader."""
        if lat_us > 0:
            e = a + lat_us
            if self.segments:
                self.segs += (lane, a, e, t, "bubble")
            if count:
                self.us["bubble"] += e - a
            a = e
        if b > a:
            if self.segments:
                self.segs += (lane, a, b, t, "memory")
            if count:
                self.us["memory"] += b - a

    def data_wait(self, lane: int, a: float, b: float, t: int, bubbles: list[tuple[float, float]]) -> None:
        """The executor waited on its loader: bubble where the loader was in one of
        ``bubbles``, memory otherwise."""
        if b > a:
            if self.segments:
                self.segs += (lane, a, b, t, "data wait")
            bub = sum(max(0.0, min(b, y) - max(a, x)) for x, y in bubbles)
            self.us["bubble"] += bub
            self.us["memory"] += (b - a) - bub


def build_result(s, r, start, end, lane_of, timeline: Timeline, n_lanes, t0, spans, hbm,
                 design_stats: dict[str, dict[str, Any]] | None = None, names: bool = True) -> SimResult:
    """Collect a run; the categories not on the timeline are launch (before the first kernel,
    between kernels) and tail idle (the rest). ``names=False``: no task names (no timeline)."""
    g = s.graph
    latency = float(np.nanmax(end))
    cover = dict(timeline.us)
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
    covered = sum(cover.values())
    cover["launch"] += launch
    cover["tail idle"] += max(0.0, total - covered - launch)
    breakdown = {c: float(cover[c] / n_lanes) for c in CATEGORIES}
    first = g.op_first[:-1]
    op_start, op_end = np.minimum.reduceat(start, first), np.maximum.reduceat(end, first)
    per_op = [{"op": op.name, "kind": op.kind, "tasks": int(k), "start_us": float(a), "end_us": float(b),
               "time_us": float(b - a)} for op, k, a, b in zip(g.ops, g.n_tiles, op_start, op_end, strict=True)]
    wl = s.workload
    dram = float(hbm.bytes_done)
    return SimResult(mode=s.mode, gpu=s.gpu.name, workload=wl.name, policy=s.policy, latency_us=latency,
                     tokens=wl.tokens, dram_bytes=dram, hbm_spec_Bps=s.gpu.dram.bandwidth_spec_GBps * 1e9,
                     bandwidth_floor_us=wl.bandwidth_floor_us(s.gpu.dram.bandwidth_spec_GBps * 1e9),
                     breakdown_us=breakdown, per_op=per_op, n_tasks=len(g), n_lanes=n_lanes,
                     lanes_per_sm=n_lanes // s.gpu.sm.count, segments_flat=timeline.segs, names_of=g if names else None,
                     hbm_log=hbm.log, task_start_us=start, task_end_us=end, task_lane=lane_of,
                     design_stats=design_stats or {})

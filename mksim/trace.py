"""Import a ``torch.profiler`` Chrome trace of a decode step: replay it, map its kernels to ops, predict
the megakernel of the same ops on the same GPU.

A trace (``prof.export_chrome_trace(path)``, plain or gzipped) holds GPU activities (``cat`` ``kernel``,
``gpu_memset``, ``gpu_memcpy``) with their stream, grid, block and a ``correlation`` id that ties them to
the CPU call that launched them. The step is found from, in this order: ``ProfilerStep#N`` ranges on
the GPU timeline (``prof.step()``), CUDA graph launches (every kernel of one ``cudaGraphLaunch`` shares
its correlation id: one replay, one step), or else the whole trace. Of several steps the median (by
its span) is taken, or the one asked for. The file is read as a stream (:mod:`mksim.trace_read`): of each
GPU activity only what the import needs is kept, in arrays, and a trace past a cap (:data:`MAX_BYTES`,
:data:`MAX_EVENTS`, a step of more than :data:`MAX_STEP_ACTIVITIES`) is refused in one line before
memory grows.

The *replay* rebuilds the step from what was measured: each activity starts its measured gap after
the previous activity on its stream ended, and lasts its measured duration. It lands on the trace's
own step (first activity's start to last one's end) up to rounding when the trace is read right; the
kernels' time plus the gaps between them (launch bubbles) is the whole step. It is not run by mksim's
engine: the engine derives each task's time from its bytes and FLOPs and the hardware file, and has no
task of a given duration; a measured chain needs none of its mechanisms (one stream, measured gaps).

With a model (:func:`import_trace`'s ``model``, ``batch``, ``kv_len``), kernels are aligned with the
ops of mksim's workload of that model (:mod:`mksim.trace_map`), and mksim predicts that workload as a
megakernel (and as its own one-kernel-per-op CUDA graph) on the trace's GPU.

>>> from pathlib import Path
>>> t = import_trace(Path(__file__).parents[1] / "tests/data/trace-llama-3.2-1b-b1-step.json.gz")
>>> len(t.kernels), t.steps_by
(648, 'cuda graph launches')
>>> abs(t.replay_us / t.step_us - 1) < 1e-6
True
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
import zlib
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hwmodels.files import check_outputs
from mksim.compare import make_workload
from mksim.schedule import build_schedule, check_fits
from mksim.sim import simulate
from mksim.target import GPUS, gpu_spec
from mksim.trace_map import align, kernel_hint
from mksim.trace_read import (
    CATEGORIES,
    GPU_CATEGORIES,
    GRAPH_LAUNCHES,
    KERNEL,
    MAX_BYTES,
    MAX_EVENTS,
    NO_CORRELATION,
    STEP_MARK,
    Activities,
    JsonEvents,
    TraceError,
    open_trace,
    parse_id,
    parse_time,
    read_activities,
    size_text,
)
from mksim.workload import KINDS

__all__ = ["GPU_CATEGORIES", "GRAPH_LAUNCHES", "MAX_BYTES", "MAX_CUT_BYTES", "MAX_EVENTS", "MAX_STEP_ACTIVITIES",
           "STEP_MARK", "Prediction", "TraceError", "TraceImport", "TraceKernel", "cut_trace", "gpu_key",
           "import_trace", "median_gap_us", "replay_us", "short_name"]

#: A step of more GPU activities than this is refused: a decode step has a few thousand, and the
#: step's kernels are what the import holds as objects (and writes with ``--json``).
MAX_STEP_ACTIVITIES = 200_000
#: A step longer than this (an hour) is refused: its times are not µs of a decode step.
MAX_SPAN_US = 3.6e9
#: ``trace cut`` holds the events it keeps (the step's, the launches', the metadata) up to this many bytes.
MAX_CUT_BYTES = 256 << 20
#: Traced kernels this many times faster than the bytes they must read allow raise a warning (:func:`_too_fast`).
TOO_FAST = 1.5


@dataclass(frozen=True, slots=True)
class TraceKernel:
    """One GPU activity of the step. Times in µs from the step's first activity."""

    name: str
    category: str                    #: kernel, memset or memcpy
    stream: int
    start_us: float
    dur_us: float
    gap_us: float                    #: idle on its stream before it (since the previous end, or the step start)
    grid: tuple[int, ...] | None
    block: tuple[int, ...] | None
    hint: str | None                 #: the op kind its name suggests (:func:`mksim.trace_map.kernel_hint`)
    op: str | None = None            #: the workload op it was mapped to
    kind: str | None = None          #: that op's kind (without a model: the hint, where it is an op kind)


@dataclass(frozen=True)
class Prediction:
    """mksim's prediction of the same model, batch and KV length on the trace's GPU."""

    gpu: str
    hardware_file: str
    megakernel_us: float
    graph_us: float                  #: mksim's own one-kernel-per-op chain in a CUDA graph
    speedup: float                   #: the trace's step over the predicted megakernel
    note: str | None = None
    #: the graph's time per op kind (each op's span, summed): what mksim expects one kernel per op to take
    graph_by_kind_us: dict[str, float] = field(default_factory=dict)
    graph_node_us: float | None = None   #: the hardware file's interval between graph nodes (the trace's gaps)


@dataclass(frozen=True)
class TraceImport:
    """What :func:`import_trace` read: the chosen step's kernels, its replay, mapping and prediction."""

    path: str
    gpu_name: str | None
    n_sms: int | None
    steps_by: str                    #: "ProfilerStep ranges", "cuda graph launches" or "whole trace"
    step_spans_us: tuple[float, ...] #: every step's span, in time order
    step_starts_us: tuple[float, ...] #: every step's first activity, from the first step's
    step_number: int                 #: the chosen step, counted from 1 in time order
    left_out: int                    #: GPU activities outside every step
    kernels: tuple[TraceKernel, ...]
    step_us: float
    replay_us: float
    model: str | None = None
    batch: int | None = None
    kv_len: int | None = None
    ops_without_kernels: tuple[str, ...] = ()
    prediction: Prediction | None = None
    warnings: tuple[str, ...] = ()   #: doubts about the mapping (a trace of another model?)

    @property
    def busy_us(self) -> float:
        return sum(k.dur_us for k in self.kernels)

    @property
    def gaps_us(self) -> float:
        return sum(k.gap_us for k in self.kernels)

    @property
    def replay_error(self) -> float:
        """(replay - step) / step."""
        return self.replay_us / self.step_us - 1.0

    @property
    def step_period_us(self) -> float | None:
        """The median interval between the starts of consecutive steps (``None`` with one step): the span
        plus what separates two steps (a graph launch, the host between steps)."""
        d = [b - a for a, b in zip(self.step_starts_us, self.step_starts_us[1:], strict=False)]
        return statistics.median(d) if d else None

    @property
    def streams(self) -> tuple[int, ...]:
        return tuple(sorted({k.stream for k in self.kernels}))

    @property
    def mapped_fraction(self) -> float:
        """Share of the kernels' time that maps to an op kind (to an op, with a model)."""
        busy = self.busy_us
        return sum(k.dur_us for k in self.kernels if k.kind) / busy if busy else 0.0

    def by_kind(self) -> list[dict[str, Any]]:
        """Per op kind (and ``unmapped``): kernels, their time and the gaps before them; sums to the step."""
        rows: dict[str, dict[str, Any]] = {}
        for k in self.kernels:
            r = rows.setdefault(k.kind or "unmapped", {"kind": k.kind or "unmapped", "kernels": 0, "busy_us": 0.0,
                                                       "gaps_us": 0.0})
            r["kernels"] += 1
            r["busy_us"] += k.dur_us
            r["gaps_us"] += k.gap_us
        out = sorted(rows.values(), key=lambda r: (r["kind"] == "unmapped", -r["busy_us"]))
        for r in out:
            r["share"] = (r["busy_us"] + r["gaps_us"]) / self.step_us
        return out

    def unmapped(self) -> list[dict[str, Any]]:
        """The kernels that map to no op, by name: count and total µs, largest first."""
        rows: dict[str, dict[str, Any]] = {}
        for k in self.kernels:
            if not k.kind:
                r = rows.setdefault(k.name, {"name": k.name, "kernels": 0, "busy_us": 0.0})
                r["kernels"] += 1
                r["busy_us"] += k.dur_us
        return sorted(rows.values(), key=lambda r: -r["busy_us"])

    def to_dict(self, kernels: bool = True) -> dict[str, Any]:
        """A JSON-ready summary (``mksim trace import --json``)."""
        d: dict[str, Any] = {
            "path": self.path, "gpu_name": self.gpu_name, "n_sms": self.n_sms, "steps_by": self.steps_by,
            "step_spans_us": list(self.step_spans_us),
            "step_period_us": self.step_period_us, "step_number": self.step_number, "left_out": self.left_out,
            "step_us": self.step_us, "replay_us": self.replay_us, "replay_error": self.replay_error,
            "n_kernels": len(self.kernels), "streams": list(self.streams), "busy_us": self.busy_us,
            "gaps_us": self.gaps_us, "model": self.model, "batch": self.batch, "kv_len": self.kv_len,
            "mapped_fraction": self.mapped_fraction, "by_kind": self.by_kind(), "unmapped": self.unmapped(),
            "ops_without_kernels": list(self.ops_without_kernels), "warnings": list(self.warnings),
            "prediction": asdict(self.prediction) if self.prediction else None}
        if kernels:
            d["kernels"] = [asdict(k) for k in self.kernels]
        return d


def replay_us(kernels: list[TraceKernel] | tuple[TraceKernel, ...]) -> float:
    """The step rebuilt from measured durations and gaps: on each stream an activity starts ``gap_us``
    after the previous one ends (the first, ``gap_us`` after the step starts).

    >>> ks = [TraceKernel("a", "kernel", 7, 0.0, 2.0, 0.0, None, None, None),
    ...       TraceKernel("b", "kernel", 7, 2.5, 3.0, 0.5, None, None, None)]
    >>> replay_us(ks)
    5.5
    """
    end: dict[int, float] = {}
    last = 0.0
    for k in sorted(kernels, key=lambda k: k.start_us):
        t = end.get(k.stream, 0.0) + k.gap_us + k.dur_us
        end[k.stream] = t
        last = max(last, t)
    return last


def short_name(name: str, width: int = 72) -> str:
    """A kernel name cut for a table: no ``void``, ``at::native::`` or anonymous namespaces, no parameter
    list; for torch's elementwise kernels, the kernel template and the functors or ops it applies.

    >>> short_name("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long>(int)")
    'indexSelectSmallIndex<c10::BFloat16, long>'
    >>> short_name("void at::native::vectorized_elementwise_kernel<4, at::native::cos_kernel_cuda("
    ...            "at::TensorIteratorBase&)::{lambda()#2}::operator()() const>(int)")
    'vectorized_elementwise_kernel [cos]'
    """
    s = re.sub(r"^void ", "", name.strip())
    s = s.replace("at::native::", "").replace("(anonymous namespace)::", "")
    outer = re.split(r"[<(]", s, maxsplit=1)[0]
    if outer.endswith("elementwise_kernel") or outer.endswith("elementwise_kernel_with_index"):
        found = re.findall(r"(\w+?)(?:_kernel_cuda|_kernel_impl|_kernel|_cuda_out)\b|(\w*Functor\w*)",
                           s[len(outer):])
        parts = [a or b for a, b in found if (a or b) not in ("gpu", "vectorized_elementwise", "elementwise",
                                                              "unrolled_elementwise")]
        if parts:
            s = f"{outer} [{', '.join(dict.fromkeys(parts))}]"
            return s if len(s) <= width else s[: width - 1] + "…"
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # the parameter list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    s = s[:cut]
    return s if len(s) <= width else s[: width - 1] + "…"


# -- reading ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Steps:
    """The steps of a trace: each a set of activities (indices into :class:`Activities`), in time order."""

    acts: Activities
    how: str
    members: np.ndarray        #: the steps' activities, one step after another
    starts: np.ndarray         #: where each step begins in ``members``
    sizes: np.ndarray
    first_us: list[float]      #: each step's first activity (trace time)
    spans: list[float]
    dev: int | None
    left_out: int

    def group(self, i: int) -> np.ndarray:
        """Step ``i``'s activities in file order."""
        s = int(self.starts[i])
        return np.sort(self.members[s:s + int(self.sizes[i])])


def _device(acts: Activities, label: str, device: int | None) -> tuple[np.ndarray, int | None]:
    """The activities of the chosen GPU (all of them when the kernels ran on one) and its id."""
    _, _, cat, devc, _ = acts.columns()
    codes = np.unique(devc[cat == KERNEL])
    if not len(codes):
        raise TraceError(f"{label}: no GPU kernel events (cat 'kernel'); profile with "
                         "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    devices = sorted((acts.ids[c] for c in codes.tolist()), key=str)
    if device is None and len(devices) > 1:
        raise TraceError(f"{label}: kernels on {len(devices)} GPUs ({', '.join(map(str, devices))}); "
                         "pick one with --device")
    if device is None:
        sel = np.arange(len(acts))
    else:
        if device not in devices:
            raise TraceError(f"{label}: no kernels on GPU {device}; it has kernels on {', '.join(map(str, devices))}")
        sel = np.nonzero(devc == acts.code(device))[0]
    dev = device if device is not None else devices[0]
    return sel, dev if isinstance(dev, int) else None


def _segments(acts: Activities, sel: np.ndarray, label: str) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """How the steps were found, their activities one after another, each step's size and a tie-break for
    steps that start together (the order they were found in)."""
    ts, _, cat, _, corr = acts.columns()
    if acts.marks and len(sel):
        order = sel[np.argsort(ts[sel], kind="stable")]
        sts = ts[order]
        m0 = np.array([m[0] for m in acts.marks])
        m1 = m0 + np.array([m[1] for m in acts.marks])
        lo, hi = np.searchsorted(sts, m0, "left"), np.searchsorted(sts, m1, "left")
        sizes = np.maximum(hi - lo, 0)
        if int(sizes.sum()) > acts.max_events:
            raise TraceError(f"{label}: its ProfilerStep ranges overlap (they hold {int(sizes.sum()):,} GPU "
                             "activities between them); give a trace whose steps follow one another")
        keep = sizes > 0
        lo, sizes, tie = lo[keep], sizes[keep], np.nonzero(keep)[0]
        if len(sizes):
            offsets = np.repeat(np.cumsum(sizes) - sizes, sizes)
            members = order[np.repeat(lo, sizes) + np.arange(int(sizes.sum())) - offsets]
            # a range with memory copies only is no step
            has_kernel = np.maximum.reduceat((cat[members] == KERNEL).astype(np.int8), np.cumsum(sizes) - sizes) > 0
            if has_kernel.any():
                members = members[np.repeat(has_kernel, sizes)]
                return "ProfilerStep ranges", members, sizes[has_kernel], tie[has_kernel]
    if acts.launches and len(sel):
        sub = sel[np.isin(corr[sel], np.fromiter(acts.launches, np.int64, len(acts.launches)))]
        if len(sub):
            members = sub[np.argsort(corr[sub], kind="stable")]
            c = corr[members]
            starts = np.concatenate(([0], np.nonzero(np.diff(c))[0] + 1))
            sizes = np.diff(np.append(starts, len(members)))
            return "cuda graph launches", members, sizes, np.minimum.reduceat(members, starts)
    return "whole trace", sel, np.array([len(sel)]), np.zeros(1, np.int64)


def _read(path: str | Path, device: int | None, max_bytes: int, max_events: int) -> _Steps:
    label = f"trace {path}"
    with open_trace(path, label) as fh:
        acts = read_activities(fh, label, max_bytes=max_bytes, max_events=max_events)
    sel, dev = _device(acts, label, device)
    how, members, sizes, tie = _segments(acts, sel, label)
    ts, dur, _, _, _ = acts.columns()
    starts = np.cumsum(sizes) - sizes
    t = ts[members]
    t0 = np.minimum.reduceat(t, starts)
    # as the chain measures it: each activity's start from the first, plus its duration
    spans = np.maximum.reduceat((t - np.repeat(t0, sizes)) + dur[members], starts)
    order = np.lexsort((tie, t0))
    return _Steps(acts, how, members, starts[order], sizes[order], t0[order].tolist(), spans[order].tolist(), dev,
                  len(sel) - int(sizes.sum()))


def _chain(acts: Activities, group: np.ndarray) -> tuple[list[TraceKernel], float]:
    """The step's activities as :class:`TraceKernel` s, in time order, with their gaps; and its span."""
    ts, dur, _, _, _ = acts.columns()
    g = group[np.lexsort((ts[group] + dur[group], ts[group]))]   # stable: ties keep the file's order
    t0 = float(ts[g[0]])
    end: dict[Any, float] = {}
    out = []
    for i, a_ts, a_dur in zip(g.tolist(), ts[g].tolist(), dur[g].tolist(), strict=True):
        s = acts.stream_of(i)
        start = a_ts - t0
        gap = start - end.get(s, 0.0)
        end[s] = start + a_dur
        stream = s if isinstance(s, int) else zlib.crc32(str(s).encode()) % 100_000
        name, category = acts.name(i), CATEGORIES[acts.cat[i]]
        out.append(TraceKernel(name, category, stream, start, a_dur, gap, acts.dims_of(acts.grid_i[i]),
                               acts.dims_of(acts.block_i[i]), kernel_hint(name) if category == "kernel" else "memory"))
    return out, max(k.start_us + k.dur_us for k in out)


# -- the whole import ------------------------------------------------------------------------------------
def gpu_key(name: str) -> str:
    """The model of a GPU name, to match the trace's name with a hardware file's: the first word with a
    digit in it.

    >>> gpu_key("NVIDIA H100 80GB HBM3"), gpu_key("NVIDIA A100-SXM4-80GB"), gpu_key("NVIDIA GeForce RTX 4090")
    ('h100', 'a100', '4090')
    """
    words = [w for w in re.split(r"[\s\-_]+", name.lower()) if any(c.isdigit() for c in w)]
    return words[0] if words else name.lower().strip()


def _default_gpu(name: str | None) -> str:
    """The hardware file of the trace's GPU (same model, :func:`gpu_key`): a calibrated one if there is,
    else the datasheet model."""
    if not name:
        raise TraceError("the trace does not name its GPU; give --gpu (mksim hw list)")
    found = [n for n in GPUS if gpu_key(gpu_spec(n).full_name) == gpu_key(name)]
    if not found:
        raise TraceError(f"no mksim hardware file for the trace's GPU {name!r}; give --gpu (mksim hw list)")
    return sorted(found, key=lambda n: (not n.endswith("-calibrated"), len(n)))[0]


def _pick(spans: list[float], step: int | None) -> int:
    """The index of ``step`` (counted from 1), or of the median step by span (of an even count, the
    shorter of the two middle ones)."""
    if step is None:
        return sorted(range(len(spans)), key=lambda i: spans[i])[(len(spans) - 1) // 2]
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= len(spans):
        raise TraceError(f"step {step!r} out of range: the trace has {len(spans)} step(s); steps count from 1")
    return step - 1


def _step(steps: _Steps, step: int | None, label: str, max_step: int) -> tuple[int, np.ndarray]:
    """The chosen step's index and its activities, refused when it holds more than ``max_step``."""
    index = _pick(steps.spans, step)
    group = steps.group(index)
    if len(group) > max_step:
        raise TraceError(f"{label}: step {index + 1} (by {steps.how}) holds {len(group):,} GPU activities, over "
                         f"{max_step:,}: a decode step has a few thousand. Mark steps with prof.step() or profile "
                         "fewer")
    return index, group


def import_trace(path: str | Path, *, model: str | None = None, batch: int = 1, kv_len: int = 1024,
                 gpu: str | None = None, device: int | None = None, step: int | None = None,
                 predict: bool = True, max_bytes: int = MAX_BYTES, max_events: int = MAX_EVENTS,
                 max_step: int = MAX_STEP_ACTIVITIES) -> TraceImport:
    """Read a ``torch.profiler`` Chrome trace (see the module's docstring); with ``model`` (a built-in
    name or a Hugging Face config.json), map its kernels to that model's ops and, with ``predict``,
    predict the megakernel on ``gpu`` (default: the trace's GPU, calibrated where mksim has a calibration).
    ``step``: which step (1 = the first, in time order) instead of the median; ``device``: which GPU's
    kernels, when the trace holds several. The file is read as a stream; ``max_bytes`` (uncompressed),
    ``max_events`` (GPU activities kept) and ``max_step`` (activities in the chosen step) bound the
    memory it takes, and a trace past one of them is refused in one line (:mod:`mksim.trace_read`)."""
    label = f"trace {path}"
    steps = _read(path, device, max_bytes, max_events)
    index, group = _step(steps, step, label, max_step)
    kernels, span = _chain(steps.acts, group)
    if not span > 0:
        raise TraceError(f"{label}: step {index + 1} lasts 0 µs (its GPU activities have no duration)")
    if span > MAX_SPAN_US:
        raise TraceError(f"{label}: step {index + 1} (by {steps.how}) lasts {span / 1e6:.3g} s; a decode step lasts "
                         "milliseconds: are ts and dur in µs? Give a trace from prof.export_chrome_trace()")
    props = _device_properties(steps.acts.meta.get("deviceProperties"))
    prop = props.get(steps.dev, {})
    gpu_name = prop.get("name") if isinstance(prop.get("name"), str) else None
    n_sms = prop.get("numSms") if isinstance(prop.get("numSms"), int) and not isinstance(prop.get("numSms"), bool) \
        else None
    starts = steps.first_us
    result = TraceImport(str(path), gpu_name, n_sms, steps.how, tuple(steps.spans),
                         tuple(t - starts[0] for t in starts), index + 1, steps.left_out, tuple(kernels), span,
                         replay_us(kernels))
    if not all(math.isfinite(x) for x in (result.busy_us, result.gaps_us, result.replay_us, *result.step_starts_us)):
        raise TraceError(f"{label}: its times add up to more than a double holds; give a trace in µs")
    if model is None:
        op_kinds = set(KINDS)
        return replace(result, kernels=tuple(
            replace(k, kind="matmul" if k.hint == "epilogue" else k.hint if k.hint in op_kinds else None)
            for k in kernels))
    gpu = gpu or _default_gpu(gpu_name)
    g = gpu_spec(gpu)
    wl = make_workload(model, batch, kv_len, n_sms=g.sm.count)
    idx = align([k.hint for k in kernels], wl.ops)
    mapped = tuple(replace(k, op=wl.ops[j].name, kind=wl.ops[j].kind) if j is not None else k
                   for k, j in zip(kernels, idx, strict=True))
    used = {j for j in idx if j is not None}
    name = wl.model.name if wl.model else model
    missing = tuple(op.name for j, op in enumerate(wl.ops) if j not in used)
    doubts = _doubts(kernels, wl.ops, missing, name) or _too_fast(mapped, wl.ops, g, name, batch, kv_len)
    result = replace(result, kernels=mapped, model=name, batch=batch, kv_len=kv_len, ops_without_kernels=missing,
                     warnings=doubts)
    if not predict:
        return result
    check_fits(wl, g)
    mk = simulate(build_schedule(wl, g, "megakernel"), timeline=False).latency_us
    graph_res = simulate(build_schedule(wl, g, "graph"), timeline=False)
    by_kind: dict[str, float] = defaultdict(float)
    for row in graph_res.per_op:
        by_kind[row["kind"]] += row["time_us"]
    note = None
    if n_sms is not None and n_sms != g.sm.count:
        note = f"the trace ran on {n_sms} SMs, {g.name} has {g.sm.count}: the prediction is for {g.name}"
    elif gpu_name and gpu_key(g.full_name) != gpu_key(gpu_name):
        note = f"the trace ran on {gpu_name}, the prediction is for {g.full_name}"
    return replace(result, prediction=Prediction(g.name, str(g.path or ""), mk, graph_res.latency_us, span / mk,
                                                 note, dict(by_kind), g.launch.graph_node_us))


def _device_properties(v: Any) -> dict[int | str | None, dict[str, Any]]:
    """``deviceProperties`` by device id (digits as numbers, as the kernels' devices); anything that is not
    a list of objects with an id counts as no properties."""
    out: dict[int | str | None, dict[str, Any]] = {}
    for d in v if isinstance(v, list) else ():
        if isinstance(d, dict):
            try:
                out.setdefault(parse_id(d.get("id")), d)
            except TypeError:
                continue
    return out


def _doubts(kernels: list[TraceKernel], ops: tuple[Any, ...], missing: tuple[str, ...], model: str) -> tuple[str, ...]:
    """Signs that the trace is not a step of ``model``: attention kernels and layers disagree, or many
    ops got no kernel."""
    n_attn = sum(1 for k in kernels if k.hint == "attn_partial")
    layers = sum(1 for op in ops if op.kind == "attn_partial")
    if n_attn and n_attn != layers:
        return (f"the trace has {n_attn} attention kernels, {model} has {layers} layers: "
                "is --model the traced model?",)
    if len(missing) > 0.1 * len(ops):
        return (f"{len(missing)} of {model}'s {len(ops)} ops got no kernel: is --model the traced model?",)
    return ()


def _too_fast(kernels: tuple[TraceKernel, ...], ops: tuple[Any, ...], g: Any, model: str, batch: int,
              kv_len: int) -> tuple[str, ...]:
    """Doubts when the traced kernels were faster than the GPU's memory can be: the step reads every
    weight and the whole KV cache of ``batch`` x ``kv_len`` from HBM at least once, which takes at least
    bytes / the datasheet bandwidth. Traced kernels more than :data:`TOO_FAST` times quicker than that
    (on more bytes than twice the L2 cache, which could hold them) are not a step of that model, batch and
    KV length. A warning, not a refusal: a quantized model reads fewer bytes than mksim's bf16 one."""
    bw = g.dram.bandwidth_spec_GBps * 1e9
    l2 = g.l2.size_MiB * 2**20
    where = f"at least {{:.0f}} µs at {g.name}'s {bw / 1e12:.1f} TB/s"
    out = []
    kv = sum(op.kv_read_bytes for op in ops)
    attention = set(KINDS.names(lambda kind: kind.attention))
    attn_us = sum(k.dur_us for k in kernels if k.kind in attention)
    if kv > 2 * l2 and attn_us and attn_us * TOO_FAST < kv / bw * 1e6:
        out.append(f"the traced attention kernels ran {attn_us:.1f} µs, but reading the KV cache of batch {batch} x "
                   f"KV {kv_len} ({kv / 1e9:.2f} GB) takes " + where.format(kv / bw * 1e6)
                   + ": give --batch and --kv-len as traced; the prediction below is for another step")
    need = sum(op.weight_bytes + op.kv_read_bytes for op in ops)
    busy = sum(k.dur_us for k in kernels)
    if not out and need > 2 * l2 and busy * TOO_FAST < need / bw * 1e6:
        out.append(f"the traced kernels ran {busy:.1f} µs, but {model} at batch {batch}, KV {kv_len} reads "
                   f"{need / 1e9:.2f} GB of weights and KV cache, " + where.format(need / bw * 1e6)
                   + ": give --model, --batch and --kv-len as traced (a quantized model reads fewer bytes)")
    return tuple(out)


def cut_trace(path: str | Path, out: str | Path, *, step: int | None = None, device: int | None = None,
              max_bytes: int = MAX_BYTES, max_events: int = MAX_EVENTS, max_step: int = MAX_STEP_ACTIVITIES) -> int:
    """Write one step of a trace to ``out`` (gzipped if it ends in ``.gz``): the metadata, the step's GPU
    activities, the CPU calls that launched them and the ``ProfilerStep`` ranges around them; flow
    events and everything else are left out. Returns the number of events written. Made to share (and
    to test on) one step of a long trace; :func:`import_trace` of the result picks that step. The
    trace is read twice, as a stream (the caps as in :func:`import_trace`); ``out`` may not be ``path``.
    """
    label = f"trace {path}"
    check_outputs({"DEST": out}, [("trace", path)], error=TraceError)
    steps = _read(path, device, max_bytes, max_events)
    acts = steps.acts
    _, group = _step(steps, step, label, max_step)
    ts, dur, _, _, corr_codes = acts.columns()
    ids = set(np.frombuffer(acts.ordinal, dtype=np.int64)[group].tolist())
    corr = set(corr_codes[group].tolist()) - {NO_CORRELATION}
    t0, t1 = float(ts[group].min()), float((ts[group] + dur[group]).max())
    keep: list[str] = []
    kept_chars, cap = 0, min(max_bytes, MAX_CUT_BYTES)
    ordinal = -1

    def pick(e: Any) -> None:
        nonlocal ordinal, kept_chars
        ordinal += 1
        if type(e) is not dict:
            return
        args: dict[str, Any] = e["args"] if isinstance(e.get("args"), dict) else {}
        launch = False
        if str(e.get("cat", "")).lower() in ("cuda_runtime", "runtime", "cuda_driver"):
            try:
                launch = acts.corr_code(parse_id(args.get("correlation"))) in corr
            except TypeError:
                launch = False
        mark = False
        if e.get("ph") == "X" and str(e.get("name", "")).startswith(STEP_MARK):
            m0, md = parse_time(e.get("ts")), parse_time(e.get("dur"))
            mark = m0 is not None and md is not None and m0 < t1 and m0 + md > t0
        if e.get("ph") == "M" or ordinal in ids or launch or mark:
            text = json.dumps(e)
            kept_chars += len(text)
            if len(keep) >= max_events or kept_chars > cap:
                raise TraceError(f"{label}: the step's events come to more than {max_events:,} events or "
                                 f"{size_text(cap)}; profile fewer steps")
            keep.append(text)

    with open_trace(path, label) as fh:
        meta = JsonEvents(fh, label, max_bytes=max_bytes).read(pick)
    head = json.dumps({**meta, "traceEvents": []})
    body = (head[:-2] + ", ".join(keep) + "]}").encode()
    o = Path(out)
    o.write_bytes(gzip.compress(body, mtime=0) if o.suffix == ".gz" else body)
    return len(keep)


def median_gap_us(t: TraceImport) -> float:
    """The median gap between consecutive activities (the typical launch bubble of the step)."""
    gaps = [k.gap_us for k in t.kernels[1:]]
    return statistics.median(gaps) if gaps else 0.0

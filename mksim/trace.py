"""Import a ``torch.profiler`` Chrome trace of a decode step: replay it, map its kernels to ops, predict
the megakernel of the same ops on the same GPU.

A trace (``prof.export_chrome_trace(path)``, plain or gzipped) holds GPU activities (``cat`` ``kernel``,
``gpu_memset``, ``gpu_memcpy``) with their stream, grid, block and a ``correlation`` id that ties them to
the CPU call that launched them. The step is found from, in this order: ``ProfilerStep#N`` ranges on
the GPU timeline (``prof.step()``), CUDA graph launches (every kernel of one ``cudaGraphLaunch`` shares
its correlation id: one replay, one step), or else the whole trace. Of several steps the median (by
its span) is taken, or the one asked for.

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

import hwmodels
from mksim.compare import make_workload
from mksim.errors import MksimError
from mksim.schedule import build_schedule, check_fits
from mksim.sim import simulate
from mksim.trace_map import align, kernel_hint
from mksim.workload import KINDS

__all__ = ["Prediction", "TraceError", "TraceImport", "TraceKernel", "cut_trace", "gpu_key", "import_trace",
           "median_gap_us", "replay_us", "short_name"]

#: Chrome-trace categories of GPU activities (lower-cased; older torch wrote ``Kernel``, ``Memset``).
GPU_CATEGORIES = {"kernel": "kernel", "gpu_memset": "memset", "gpu_memcpy": "memcpy", "memset": "memset",
                  "memcpy": "memcpy"}
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")
STEP_MARK = "ProfilerStep#"
MAX_BYTES = 2 << 30   # a trace file larger than this (uncompressed) is refused before parsing


class TraceError(MksimError, ValueError):
    """A trace file that cannot be imported (not JSON, no kernels, several GPUs, ...)."""


@dataclass(frozen=True)
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
def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise TraceError(f"trace {path}: no such file")
    try:
        with path.open("rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        opener = gzip.open if gz else open
        with opener(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except (OSError, EOFError) as exc:
        raise TraceError(f"trace {path}: cannot read ({exc}); give a Chrome trace from "
                         "prof.export_chrome_trace(), plain or gzipped") from None
    if len(raw) > MAX_BYTES:
        raise TraceError(f"trace {path}: over {MAX_BYTES >> 30} GiB uncompressed; profile fewer steps")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise TraceError(f"trace {path}: not JSON{where}; give a Chrome trace from prof.export_chrome_trace()") \
            from None
    if isinstance(data, list):   # the Chrome format allows a bare array of events
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"trace {path}: JSON without a 'traceEvents' list; give a Chrome trace from "
                         "prof.export_chrome_trace()")
    return data


def _number(e: dict[str, Any], key: str, path: Path) -> float:
    v = e.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (key == "dur" and v < 0):
        raise TraceError(f"trace {path}: GPU event {e.get('name')!r} has {key} = {v!r}; expected a number "
                         f"{'>= 0 ' if key == 'dur' else ''}(µs)")
    return float(v)


def _dims(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return tuple(v)
    return None


def _activities(data: dict[str, Any], path: Path, device: int | None) -> tuple[list[dict[str, Any]], int | None]:
    acts = []
    for e in data["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = GPU_CATEGORIES.get(str(e.get("cat", "")).lower())
        if cat is None:
            continue
        args: dict[str, Any] = e["args"] if isinstance(e.get("args"), dict) else {}
        dev = args.get("device", e.get("pid"))
        acts.append({"name": str(e.get("name", "")), "category": cat, "ts": _number(e, "ts", path),
                     "dur": _number(e, "dur", path), "stream": args.get("stream", e.get("tid", 0)), "device": dev,
                     "correlation": args.get("correlation"), "grid": _dims(args.get("grid")),
                     "block": _dims(args.get("block")), "event": e})
    if not any(a["category"] == "kernel" for a in acts):
        raise TraceError(f"trace {path}: no GPU kernel events (cat 'kernel'); profile with "
                         "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    devices = sorted({a["device"] for a in acts if a["category"] == "kernel"}, key=str)
    if device is None and len(devices) > 1:
        raise TraceError(f"trace {path}: kernels on {len(devices)} GPUs ({', '.join(map(str, devices))}); "
                         "pick one with --device")
    if device is not None:
        if device not in devices:
            raise TraceError(f"trace {path}: no kernels on GPU {device}; it has kernels on "
                             f"{', '.join(map(str, devices))}")
        acts = [a for a in acts if a["device"] == device]
    dev = device if device is not None else devices[0]
    return acts, dev if isinstance(dev, int) else None


def _steps(data: dict[str, Any], acts: list[dict[str, Any]]) -> tuple[str, list[list[dict[str, Any]]]]:
    events = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    marks = [e for e in events if str(e.get("cat", "")).lower() == "gpu_user_annotation"
             and str(e.get("name", "")).startswith(STEP_MARK)
             and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    if marks:
        groups = [[a for a in acts if m["ts"] <= a["ts"] < m["ts"] + m["dur"]] for m in marks]
        groups = [g for g in groups if any(a["category"] == "kernel" for a in g)]
        if groups:
            return "ProfilerStep ranges", groups
    launches = {e.get("args", {}).get("correlation") for e in events
                if e.get("name") in GRAPH_LAUNCHES and isinstance(e.get("args"), dict)}
    launches.discard(None)
    by_corr: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for a in acts:
        if a["correlation"] in launches:
            by_corr[a["correlation"]].append(a)
    if by_corr:
        return "cuda graph launches", list(by_corr.values())
    return "whole trace", [acts]


def _chain(group: list[dict[str, Any]]) -> tuple[list[TraceKernel], float]:
    group = sorted(group, key=lambda a: (a["ts"], a["ts"] + a["dur"]))
    t0 = group[0]["ts"]
    end: dict[Any, float] = {}
    out = []
    for a in group:
        start = a["ts"] - t0
        gap = start - end.get(a["stream"], 0.0)
        end[a["stream"]] = start + a["dur"]
        stream = a["stream"] if isinstance(a["stream"], int) else zlib.crc32(str(a["stream"]).encode()) % 100_000
        out.append(TraceKernel(a["name"], a["category"], stream, start, a["dur"], gap, a["grid"], a["block"],
                               kernel_hint(a["name"]) if a["category"] == "kernel" else "memory"))
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
    found = [n for n in hwmodels.available() if gpu_key(hwmodels.load(n).full_name) == gpu_key(name)]
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


def _read(p: Path, device: int | None) -> tuple[dict[str, Any], list[dict[str, Any]], int | None, str,
                                                  list[list[dict[str, Any]]]]:
    data = _load(p)
    acts, dev = _activities(data, p, device)
    how, groups = _steps(data, acts)
    groups.sort(key=lambda g: min(a["ts"] for a in g))
    return data, acts, dev, how, groups


def import_trace(path: str | Path, *, model: str | None = None, batch: int = 1, kv_len: int = 1024,
                 gpu: str | None = None, device: int | None = None, step: int | None = None,
                 predict: bool = True) -> TraceImport:
    """Read a ``torch.profiler`` Chrome trace (see the module's docstring); with ``model`` (a built-in
    name or a Hugging Face config.json), map its kernels to that model's ops and, with ``predict``,
    predict the megakernel on ``gpu`` (default: the trace's GPU, calibrated where mksim has a calibration).
    ``step``: which step (1 = the first, in time order) instead of the median; ``device``: which GPU's
    kernels, when the trace holds several."""
    data, acts, dev, how, groups = _read(Path(path), device)
    chains = [_chain(g) for g in groups]
    spans = [span for _, span in chains]
    index = _pick(spans, step)
    kernels, span = chains[index]
    if not span > 0:
        raise TraceError(f"trace {path}: step {index + 1} lasts 0 µs (its GPU activities have no duration)")
    props = {d.get("id"): d for d in data.get("deviceProperties", []) if isinstance(d, dict)}
    prop = props.get(dev, {})
    gpu_name = prop.get("name") if isinstance(prop.get("name"), str) else None
    n_sms = prop.get("numSms") if isinstance(prop.get("numSms"), int) else None
    starts = [min(a["ts"] for a in g) for g in groups]
    result = TraceImport(str(path), gpu_name, n_sms, how, tuple(spans), tuple(t - starts[0] for t in starts), index + 1,
                         len(acts) - sum(len(g) for g in groups), tuple(kernels), span, replay_us(kernels))
    if model is None:
        op_kinds = set(KINDS)
        return replace(result, kernels=tuple(
            replace(k, kind="matmul" if k.hint == "epilogue" else k.hint if k.hint in op_kinds else None)
            for k in kernels))
    gpu = gpu or _default_gpu(gpu_name)
    g = hwmodels.load(gpu)
    wl = make_workload(model, batch, kv_len, n_sms=g.sm.count)
    idx = align([k.hint for k in kernels], wl.ops)
    mapped = tuple(replace(k, op=wl.ops[j].name, kind=wl.ops[j].kind) if j is not None else k
                   for k, j in zip(kernels, idx, strict=True))
    used = {j for j in idx if j is not None}
    name = wl.model.name if wl.model else model
    missing = tuple(op.name for j, op in enumerate(wl.ops) if j not in used)
    result = replace(result, kernels=mapped, model=name, batch=batch, kv_len=kv_len, ops_without_kernels=missing,
                     warnings=_doubts(kernels, wl.ops, missing, name))
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


def cut_trace(path: str | Path, out: str | Path, *, step: int | None = None, device: int | None = None) -> int:
    """Write one step of a trace to ``out`` (gzipped if it ends in ``.gz``): the metadata, the step's GPU
    activities, the CPU calls that launched them and the ``ProfilerStep`` ranges around them; flow
    events and everything else are left out. Returns the number of events written. Made to share (and
    to test on) one step of a long trace; :func:`import_trace` of the result picks that step.
    """
    data, _, _, _, groups = _read(Path(path), device)
    spans = [max(a["ts"] + a["dur"] for a in g) - min(a["ts"] for a in g) for g in groups]
    group = groups[_pick(spans, step)]
    ids = {id(a["event"]) for a in group}
    corr = {a["correlation"] for a in group} - {None}
    t0, t1 = min(a["ts"] for a in group), max(a["ts"] + a["dur"] for a in group)
    keep = []
    for e in data["traceEvents"]:
        if not isinstance(e, dict):
            continue
        args: dict[str, Any] = e["args"] if isinstance(e.get("args"), dict) else {}
        cat = str(e.get("cat", "")).lower()
        launch = cat in ("cuda_runtime", "runtime", "cuda_driver") and args.get("correlation") in corr
        mark = (e.get("ph") == "X" and str(e.get("name", "")).startswith(STEP_MARK)
                and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))
                and e["ts"] < t1 and e["ts"] + e["dur"] > t0)
        if e.get("ph") == "M" or id(e) in ids or launch or mark:
            keep.append(e)
    body = json.dumps({**{k: v for k, v in data.items() if k != "traceEvents"}, "traceEvents": keep}).encode()
    o = Path(out)
    if o.suffix == ".gz":
        o.write_bytes(gzip.compress(body, mtime=0))
    else:
        o.write_bytes(body)
    return len(keep)


def median_gap_us(t: TraceImport) -> float:
    """The median gap between consecutive activities (the typical launch bubble of the step)."""
    gaps = [k.gap_us for k in t.kernels[1:]]
    return statistics.median(gaps) if gaps else 0.0

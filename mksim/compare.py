"""Execution modes and megakernel designs side by side: the comparison ``mksim compare`` prints.

The CLI (``mksim compare``, ``mksim sweep``) and the explorer's Compare page both call this module.
Each mode is simulated in its own worker process (:func:`parallel_map`); a worker's error is raised
again in the caller, with its one-line message.

>>> from mksim.compare import compare_modes
>>> d = compare_modes("llama-3.2-1b", "h200")
>>> list(d["modes"])
['stream', 'graph', 'graph_pdl', 'persistent_barrier', 'megakernel']
>>> d["modes"]["stream"]["speedup_vs_stream"]
1.0

A mode the GPU lacks is left out, with the reason in ``"absent"``:

>>> compare_modes("llama-3.2-1b", "l40s")["absent"]
{'graph_pdl': 'l40s has no programmatic dependent launch (compute capability 8.9; PDL needs 9.0 or later)'}
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from hwmodels import VALIDATION_FAMILIES, GPUSpec, hardware_validation, profile_info
from mksim import models
from mksim.errors import MksimError, UnknownNameError
from mksim.models import ModelConfig
from mksim.schedule import build_schedule, design_rows, get_design, get_mode, modes_on
from mksim.sim import CATEGORIES, SimResult, simulate
from mksim.target import PROFILES, Target
from mksim.workload import Step, Workload

__all__ = ["DATASHEET_REFERENCE", "TRANSFER_WIDENING", "Comparison", "ModeSummary", "absent_rows", "assumptions",
           "compare", "compare_modes", "compare_workload", "family_of",
           "interval_basis", "interval_bases", "latency_interval", "make_workload", "parallel_map", "parse_designs",
           "simulate_summary", "speedup_interval", "stack_row", "verdict"]

T = TypeVar("T")
R = TypeVar("R")

#: how much wider an interval is on a GPU its profile was not measured on: the transfer (fixed costs
#: scaled by the clock, rates kept) has never been held against a measurement there, so its error is
#: unknown; twice the measured one is a stated guess, not a fit, and the output says so
TRANSFER_WIDENING = 2.0
#: the hardware file whose own validation record (its datasheet-only predictions against our H200's
#: measured steps) is the interval of every GPU described by numbers never held against a measurement
DATASHEET_REFERENCE = "h200-datasheet"
_FAMILY_WORDS = {"chain": "chain-mode (stream, graph, graph_pdl)", "persistent": "persistent-mode"}


def parse_designs(text: str | None) -> list[str]:
    """Design names from ``--designs`` text (``"sentinel,dynamic"``, ``"all"``), in order, each once.

    >>> parse_designs("dynamic, sentinel,dynamic"), parse_designs(None)
    (['dynamic', 'sentinel'], [])
    """
    if not text:
        return []
    names = [d.strip() for d in text.split(",") if d.strip()]
    rows = design_rows()  # the registered designs (mksim.schedule.register_design)
    if names == ["all"]:
        return list(rows)
    for d in names:
        if d not in rows:
            raise UnknownNameError("design", d, [*rows, "all"])
    return list(dict.fromkeys(names))


def make_workload(model: str | ModelConfig | Step, batch: int = 1, kv_len: int = 1024, phase: str = "decode",
                  prefill_tokens: int = 0, dtype: str = "bf16", *, n_sms: int) -> Workload:
    """The workload of a :class:`~mksim.Step` (or of a built-in model name, a Hugging Face ``config.json``
    path or a :class:`ModelConfig` with the step's fields), tiled for ``n_sms`` SMs, as every ``mksim``
    command builds it."""
    step = model if isinstance(model, Step) else Step(model, batch, kv_len, phase, prefill_tokens, dtype)
    if isinstance(step.model, str) and models.is_config_path(step.model):
        step = step.with_(model=models.config_from_hf(step.model))
    return models.workload(step, n_sms=n_sms)


@dataclass(frozen=True)
class ModeSummary:
    """The part of a :class:`mksim.sim.SimResult` a comparison needs (small to send between processes)."""

    latency_us: float
    tokens_per_s: float
    hbm_util: float
    policy: str | None
    breakdown_us: dict[str, float]
    op_time_us: list[float]  #: each op's span (first task start to last task end), in workload order
    communication_us: float | None = None  #: a step split over GPUs: its collective ops' spans, summed

    @classmethod
    def of(cls, r: SimResult) -> ModeSummary:
        """The summary of one simulated step."""
        return cls(r.latency_us, r.tokens_per_s, r.hbm_util, r.policy, r.breakdown_us,
                   [op["time_us"] for op in r.per_op], r.communication_us)

    def row(self, stream_latency_us: float) -> dict[str, Any]:
        """The row of ``mksim compare --json``, with the speed-up over a stream step of ``stream_latency_us``;
        a step split over GPUs adds its communication (``communication_us`` and its share of the step)."""
        out = {"latency_us": self.latency_us, "tokens_per_s": self.tokens_per_s, "hbm_util": self.hbm_util,
               "speedup_vs_stream": stream_latency_us / self.latency_us, "policy": self.policy,
               "breakdown_us": self.breakdown_us}
        if self.communication_us is not None:
            out["breakdown_us"] = {**self.breakdown_us, "communication": self.communication_us}
            out["communication_share"] = self.communication_us / self.latency_us
        return out


def simulate_summary(job: tuple[Workload, GPUSpec, str, dict[str, Any]]) -> ModeSummary:
    """Simulate ``(workload, gpu, mode, schedule options)`` once (in a worker process, by :func:`parallel_map`)."""
    wl, g, mode, options = job
    return ModeSummary.of(simulate(build_schedule(wl, g, mode, **options), timeline=False))


def parallel_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]`` on the machine's cores: forked worker processes where the platform forks,
    one by one otherwise (one core, no fork, no process support, or inside a daemon process).

    ``fn`` must be a module-level function. An exception in a worker is raised here, in the caller
    (mksim's errors pickle, so it keeps its type and message); a worker that dies raises
    :class:`concurrent.futures.process.BrokenProcessPool` instead of hanging.
    """
    jobs = list(items)
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers > 1 and "fork" in mp.get_all_start_methods() and not mp.current_process().daemon:
        try:
            pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"))
        except OSError:  # no process support here (no semaphores): run one by one
            pass
        else:
            with pool:
                return list(pool.map(fn, jobs))
    return [fn(j) for j in jobs]


def absent_rows(g: GPUSpec, designs: str | None = None) -> dict[str, str]:
    """``{row: why}`` for the modes ``g`` cannot run (:func:`mksim.schedule.modes_on`) and the rows of
    the designs of ``designs`` it cannot have (:meth:`mksim.schedule.BaseDesign.available_on`): a
    comparison leaves them out and says why.

    >>> import hwmodels
    >>> absent_rows(hwmodels.load("h200"), "all")
    {}
    """
    absent = dict(modes_on(g)[1])
    by_design = design_rows()
    for d in parse_designs(designs):
        why = get_design(d).available_on(g)
        if why is not None:
            absent.update((row, why) for row, _ in by_design[d])
    return absent


def compare_workload(wl: Workload, g: GPUSpec, policy: str | None = None, designs: str | None = None,
                     opts: dict[str, Any] | None = None) -> dict[str, ModeSummary]:
    """Every mode ``g`` can run (:data:`mksim.schedule.MODES`, in that order), then a megakernel row per
    design of ``designs`` (:func:`mksim.schedule.design_rows`) that ``g`` can have, simulated on ``wl``
    and ``g`` (:func:`absent_rows` says why the others are left out). ``policy`` and ``opts`` are the
    schedule options of the megakernel rows."""
    have = modes_on(g)[0]
    order = sorted(have, key=lambda m: m != "megakernel")  # the longest job first: the pool ends sooner
    mk = {**({"policy": policy} if policy else {}), **(opts or {})}
    jobs = [(wl, g, mode, mk if mode == "megakernel" else {}) for mode in order]
    rows = list(order)
    by_design = design_rows()
    for d in parse_designs(designs):
        if get_design(d).available_on(g) is not None or get_design(d).available_for(wl) is not None:
            continue
        for row, kw in by_design[d]:
            jobs.append((wl, g, "megakernel", {**mk, **kw}))
            rows.append(row)
    done = dict(zip(rows, parallel_map(simulate_summary, jobs), strict=True))
    return {m: done[m] for m in [*have, *rows[len(order):]]}


def assumptions(g: GPUSpec) -> dict[str, Any]:
    """What a prediction on ``g`` assumes: the hardware file and the implementation profile, and a
    sentence saying so (every output that shows a prediction prints it).

    >>> import hwmodels
    >>> assumptions(hwmodels.load("h200"))["text"][:80]
    "assumes: hardware h200; implementation profile mksim (mksim's generated kernels,"
    >>> assumptions(hwmodels.load("h200"))["status"], assumptions(hwmodels.load("h100"))["status"]
    ('validated: whole steps measured on h200-calibrated', 'datasheet, unvalidated')
    """
    hw = g.name.split("+", 1)[0] if g.profile and "+" in g.name else g.name
    if not g.profile:
        status = _unprofiled_status(g)
        return {"hardware": hw, "profile": None, "status": status,
                "text": f"assumes: hardware {hw} ({status}); no implementation profile: the best kernels the chip "
                        f"allows, not a particular library (GPU+PROFILE names one: {', '.join(PROFILES)})"}
    info = profile_info(g.profile)
    home = info["measured_on"] in (hw, g.extends)
    moved = "" if home else f", transferred to {hw}: unvalidated there"
    status = ("validated: whole steps measured on " + info["validation"]["gpu"]
              if home and info["validation"] else "unvalidated")
    return {"hardware": hw, "profile": g.profile, "measured_on": info["measured_on"], "status": status,
            "text": f"assumes: hardware {hw}; implementation profile {g.profile} ({info['full_name']}, measured on "
                    f"{info['measured_on']}{moved}); {status}"}


def _unprofiled_status(g: GPUSpec) -> str:
    """What a GPU without a profile is: ``"datasheet, unvalidated"`` (its numbers never held against a
    measured step), ``"datasheet, held against the steps measured on ..."`` (a file with its own record:
    ``h200-datasheet``), or ``"calibrated, unvalidated"`` (an overlay with measured numbers, no profile)."""
    own = _own_record(g)
    if own is not None:
        return f"datasheet, held against the steps measured on {own['gpu']}"
    calibrated = bool(g.extends) and any(s.kind == "measured" for s in g.sources.values())
    return "calibrated, unvalidated" if calibrated else "datasheet, unvalidated"


def _own_record(g: GPUSpec) -> dict[str, Any] | None:
    """The validation record of ``g``'s own hardware file (no profile), if it has one."""
    try:
        return hardware_validation(g.path)
    except MksimError:  # a what-if or a file since moved: no record of its own
        return None


def family_of(row: str) -> str:
    """The mode family of a comparison row (``"chain"`` or ``"persistent"``: a validation record's
    sub-tables, :data:`hwmodels.VALIDATION_FAMILIES`); a design's row (``megakernel:dies``) is its mode's.

    >>> family_of("graph_pdl"), family_of("megakernel:sentinel")
    ('chain', 'persistent')
    """
    return "chain" if get_mode(row.split(":", 1)[0]).kind == "chain" else "persistent"


def interval_basis(g: GPUSpec, family: str | None = None) -> dict[str, Any]:
    """How sure a prediction on ``g`` is: ``half_width_pct``, the 90th percentile of |error| over the
    measured cases of a validation record (``None``: unknown), and ``text``, which says whose.

    With a profile, its record (``[validation]``, :func:`hwmodels.profile_info`), the sub-table of the
    mode ``family`` where it has one (``"chain"``, ``"persistent"``: :func:`family_of`);
    ``TRANSFER_WIDENING`` times that on a GPU the profile was not measured on. Without a profile, the
    hardware file's own record (``h200-datasheet``'s: its datasheet-only predictions against our H200's
    measured steps), else that of :data:`DATASHEET_REFERENCE`, carried over and said to be:
    ``datasheet, unvalidated``.

    >>> import hwmodels
    >>> interval_basis(hwmodels.load("h200-calibrated+torch"))["half_width_pct"]
    13.0
    >>> interval_basis(hwmodels.load("h100+torch"))["half_width_pct"]
    26.0
    >>> interval_basis(hwmodels.load("h100"), "chain")["text"][:40]
    'datasheet, unvalidated: h100 was never m'
    """
    a = assumptions(g)
    if a["profile"] is None:
        return _unprofiled_basis(g, a["hardware"], family)
    rec = profile_info(g.profile)["validation"]
    if rec is None:
        return {"half_width_pct": None, "transfer": False, "cases": 0,
                "text": f"interval unknown: profile {g.profile} has no validation record"}
    transfer = a["measured_on"] not in (a["hardware"], g.extends)
    sub = rec.get(family) if family else None
    r = sub or rec
    h = float(r["p90_abs_pct"])
    which = f" {_FAMILY_WORDS[family]}" if sub and family else ""
    basis = f"the 90th percentile of |error| of {g.profile} over {r['cases']}{which} cases measured on {rec['gpu']}"
    if transfer:
        return {"half_width_pct": round(h * TRANSFER_WIDENING, 2), "transfer": True, "cases": r["cases"],
                "source": r["source"],
                "text": f"{TRANSFER_WIDENING:g} × {h:.1f} %, {basis}: a transfer to {a['hardware']}, unvalidated"}
    return {"half_width_pct": h, "transfer": False, "cases": r["cases"], "source": r["source"],
            "text": f"{basis} ({r['source']})"}


def _unprofiled_basis(g: GPUSpec, hw: str, family: str | None) -> dict[str, Any]:
    """:func:`interval_basis` of a GPU without a profile."""
    own = _own_record(g)
    rec = own if own is not None else hardware_validation(DATASHEET_REFERENCE)
    if rec is None:
        return {"half_width_pct": None, "transfer": False, "cases": 0,
                "text": "interval unknown: no implementation profile, so no validation (the best kernels the chip "
                        "allows, never measured)"}
    r = rec.get(family) or rec if family else rec
    which = f" {_FAMILY_WORDS[family]}" if family and family in rec else ""
    h = float(r["p90_abs_pct"])
    if own is not None:
        return {"half_width_pct": h, "transfer": False, "cases": r["cases"], "source": r["source"],
                "text": f"the 90th percentile of |error| of {hw}'s datasheet-only predictions over {r['cases']}"
                        f"{which} cases measured on {rec['gpu']} ({r['source']})"}
    return {"half_width_pct": h, "transfer": True, "cases": r["cases"], "source": r["source"],
            "text": f"{_unprofiled_status(g)}: {hw} was never measured; the 90th percentile of |error| of "
                    f"datasheet-only predictions of the GPU we measured ({DATASHEET_REFERENCE} over {r['cases']}"
                    f"{which} cases on {rec['gpu']}, {r['source']}), carried over"}


def interval_bases(g: GPUSpec) -> dict[str, dict[str, Any]]:
    """:func:`interval_basis` of each mode family (:data:`hwmodels.VALIDATION_FAMILIES`)."""
    return {fam: interval_basis(g, fam) for fam in VALIDATION_FAMILIES}


def latency_interval(latency_us: float, half_width_pct: float | None) -> list[float | None] | None:
    """Where the measured latency lies if the prediction's error (predicted - measured) / measured is
    within ± ``half_width_pct``: ``[latency / (1 + h), latency / (1 - h)]`` (``None`` for an unbounded
    upper end, h >= 100 %); ``None`` where the half-width is unknown.

    >>> latency_interval(110.0, 10.0)
    [100.0, 122.22]
    """
    if half_width_pct is None:
        return None
    h = half_width_pct / 100
    return [round(latency_us / (1 + h), 2), round(latency_us / (1 - h), 2) if h < 1 else None]


def speedup_interval(stack_us: list[float | None] | None,
                     megakernel_us: list[float | None] | None) -> list[float | None] | None:
    """The interval of a speed-up stack / megakernel from the two latencies' intervals, at their far
    ends (the slowest megakernel against the fastest stack, and the other way): errors of the two
    are not assumed to cancel. ``None`` where either is unknown; an unbounded end stays ``None``.

    >>> speedup_interval([90.0, 110.0], [45.0, 55.0])
    [1.636, 2.444]
    """
    if stack_us is None or megakernel_us is None:
        return None
    s_lo, s_hi = stack_us
    m_lo, m_hi = megakernel_us
    lo = round(s_lo / m_hi, 3) if s_lo is not None and m_hi is not None else 0.0
    hi = round(s_hi / m_lo, 3) if s_hi is not None and m_lo is not None else None
    return [lo, hi]


def verdict(speedup: float, interval: list[float | None] | None) -> str:
    """``"faster"``, ``"slower"`` (the megakernel than the stack), or ``"tie"`` where the speed-up's
    interval contains 1; ``"faster (interval unknown)"`` and the like where there is no interval.

    >>> verdict(1.2, [0.9, 1.5]), verdict(1.2, [1.1, 1.3]), verdict(0.8, None)
    ('tie', 'faster', 'slower (interval unknown)')
    """
    if interval is None:
        return f"{'faster' if speedup >= 1 else 'slower'} (interval unknown)"
    lo, hi = interval
    if lo is not None and lo > 1:
        return "faster"
    if hi is not None and hi < 1:
        return "slower"
    return "tie"


@dataclass(frozen=True)
class Comparison:
    """Every execution mode (and a megakernel row per design asked for) on one step and target: what
    ``mksim compare`` prints as tables, ``--json`` as :meth:`to_dict`, and the explorer's Compare page
    draws (the one assembly of them all).

    ``results`` holds a :class:`ModeSummary` per row (the modes the target can run, in
    :data:`~mksim.schedule.MODES`' order, then the design rows); ``absent`` says why the others are
    left out; ``stack`` is the user's stack beside them (:func:`stack_row`), if asked for.
    """

    step: Step
    target: Target
    workload: Workload
    results: dict[str, ModeSummary]
    absent: dict[str, str]
    stack: dict[str, Any] | None = None

    @property
    def base_latency_us(self) -> float:
        """The stream row's latency (the first row's without one): what ``speedup_vs_stream`` divides."""
        r = self.results
        return (r["stream"] if "stream" in r else next(iter(r.values()))).latency_us

    def to_dict(self, detail: bool = False) -> dict[str, Any]:
        """``mksim compare --json``. With ``detail`` (the explorer), each mode's ``op_time_us``, the
        workload's ``ops`` (``op kind unit dtype flops bytes``), the GPU's ``roofs`` and the breakdown's
        ``categories`` too."""
        g, wl, base = self.target.spec, self.workload, self.base_latency_us
        bases = interval_bases(g)
        modes = {}
        for mode, r in self.results.items():
            h = bases[family_of(mode)]["half_width_pct"]
            modes[mode] = {**r.row(base), "interval_us": latency_interval(r.latency_us, h)}
            if detail:
                modes[mode]["op_time_us"] = r.op_time_us
        d: dict[str, Any] = {"model": self.step.model_name, "gpu": g.name, "workload": wl.name,
                             "batch": self.step.batch, "kv_len": self.step.kv_len, "phase": self.step.phase,
                             "bandwidth_floor_us": wl.bandwidth_floor_us(g.dram.bandwidth_spec_GBps * 1e9),
                             "modes": modes, "absent": dict(self.absent), "assumes": assumptions(g),
                             "interval": bases["persistent"], "intervals": bases}
        if self.stack is not None:
            d["stack"] = dict(self.stack)
        if detail:
            c = g.compute
            d["categories"] = list(CATEGORIES)
            d["ops"] = [{"op": op.name, "kind": op.kind, "unit": op.unit, "dtype": op.dtype, "flops": op.flops,
                         "bytes": op.weight_bytes + op.kv_read_bytes + op.kv_write_bytes + op.out_bytes}
                        for op in wl.ops]
            d["roofs"] = {"hbm_spec_GBps": g.dram.bandwidth_spec_GBps, "hbm_reachable_GBps": g.hbm_bandwidth_Bps / 1e9,
                          "tensor_TFLOPs": {"bf16": c.tensor_bf16_dense_TFLOPs, "fp16": c.tensor_fp16_dense_TFLOPs,
                                            "fp8": c.tensor_fp8_dense_TFLOPs or c.tensor_bf16_dense_TFLOPs},
                          "vector_TFLOPs": c.vector_fp32_TFLOPs}
        return d


def compare(step: Step, target: Target | str, *, policy: str | None = None, designs: str | None = None,
            opts: dict[str, Any] | None = None, stack: str | None = None) -> Comparison:
    """Simulate every mode the target can run on ``step`` (:func:`compare_workload`), and the user's
    stack ``stack`` (an implementation profile, :data:`mksim.target.PROFILES`) beside them where asked.

    ``opts`` are schedule options of the megakernel rows; ``designs`` (``"sentinel,dynamic"``, ``"all"``)
    adds a megakernel row per design (:func:`mksim.schedule.design_rows`).
    Raises :class:`mksim.errors.MksimError` on bad input.

    >>> c = compare(Step("llama-3.2-1b"), "h200")
    >>> list(c.results)[-1], c.to_dict()["modes"]["stream"]["speedup_vs_stream"]
    ('megakernel', 1.0)
    """
    t = Target.of(target)
    g = t.spec
    wl = make_workload(step, n_sms=g.sm.count)
    results = compare_workload(wl, g, policy, designs, opts)
    row = stack_row(wl, t, stack, results.get("megakernel")) if stack is not None else None
    return Comparison(step, t, wl, results, absent_rows(g, designs), row)


def compare_modes(model: str, gpu: str, batch: int = 1, kv_len: int = 1024, phase: str = "decode",
                  prefill_tokens: int = 0, dtype: str = "bf16", *, policy: str | None = None,
                  designs: str | None = None, opts: dict[str, Any] | None = None,
                  stack: str | None = None, routing: str = "uniform") -> dict[str, Any]:
    """:func:`compare` of ``model``'s step on ``gpu``, as the dict ``mksim compare --json`` prints
    (``{"modes": {...}, "absent": ..., "stack": ...}``). ``stack`` (an implementation profile) adds
    ``"stack"``: the user's stack — that library's kernels in one CUDA graph (``graph`` mode on
    ``gpu``'s hardware with the profile) — with the megakernel row's predicted speed-up over it.
    ``routing``: a mixture of experts' routing model (``Step.routing``). Raises
    :class:`mksim.errors.MksimError` on bad input.
    """
    step = Step(model, batch, kv_len, phase, prefill_tokens, dtype, routing=routing)
    return compare(step, gpu, policy=policy, designs=designs, opts=opts, stack=stack).to_dict()


def stack_row(wl: Workload, target: Target | str, impl: str, megakernel: ModeSummary | None) -> dict[str, Any]:
    """The user's stack on ``target``'s hardware (a profile ``target`` names is the megakernel's, not
    the stack's): the kernels of profile ``impl`` in the mode the profile says its step runs in
    (``mode``: one CUDA graph, ``graph``, unless it is an eager stack the host launches kernel by kernel,
    ``stream``), and the megakernel's speed-up over it (``None`` where the target has no megakernel row)."""
    t = Target.of(target)
    sg = t.with_profile(impl).spec
    mode = profile_info(impl)["mode"]
    r = simulate_summary((wl, sg, mode, {}))
    basis = interval_basis(sg, "chain")
    iv = latency_interval(r.latency_us, basis["half_width_pct"])
    out: dict[str, Any] = {"impl": impl, "gpu": sg.name, "mode": mode, "latency_us": r.latency_us,
                           "tokens_per_s": r.tokens_per_s, "assumes": assumptions(sg), "interval": basis,
                           "interval_us": iv, "megakernel_speedup": None, "speedup_interval": None, "verdict": None}
    if megakernel:
        speedup = r.latency_us / megakernel.latency_us
        siv = speedup_interval(iv, latency_interval(megakernel.latency_us, interval_basis(t.spec,
                                                                                          "persistent")["half_width_pct"]))
        out.update(megakernel_speedup=speedup, speedup_interval=siv, verdict=verdict(speedup, siv))
    return out

"""The validation suite: standard cases run on the GPU and held against their predictions.

- :data:`CASES` — two model shapes × batch 1, 4 and 8 × every execution mode, the megakernel four
  times: the default policy, the schedule ``mksim search`` found (stored under
  ``validation/schedules/``), the default policy on a fused workload (:func:`fused_workload_options`)
  and the default schedule with ``sync="sentinel"``: 48 cases at KV length 1024. A case the
  generated kernels cannot run (llama-3.1-8b at batch 8 does not fit their shared memory) is
  *refused*: recorded with its reason in one line, shown as such, never measured nor compared.
- :func:`run_suite` builds each case's schedule, has it checked and timed on the GPU (the runner
  of :mod:`validation.megakernel.gpu`, imported only then) and writes ``measured.json`` after every
  case: a failing case records its error in one line and the others go on. Persistent cases keep
  their tasks' per-op spans (``op_trace``, :mod:`validation.suite.anatomy`). The suite runs in
  parts and merges (:mod:`validation.suite.parts`).
- :func:`summarize` re-predicts every measured schedule on the CPU (:func:`predicted_us`) and
  returns ``summary.json``: each case's prediction, measurement and error, the suite's metrics
  (MAPE, each mode's error, Kendall's τ between predicted and measured rankings), the design
  targets (:func:`design_targets`) and a middle layer's anatomy of each persistent case.
- :func:`markdown_table` renders a summary for docs/validation.md; plots are in
  :mod:`validation.suite.plots`, the searched schedules' search in :mod:`validation.suite.schedules`.

Nothing here needs a GPU except the ``measure`` it is given (tests pass a fake one).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import hwmodels
import mksim
from mksim import models
from mksim.errors import MksimError
from mksim.schedule import MODE_DEFAULTS, Schedule
from mksim.sim import simulate
from mksim.workload import Build
from validation.calibrate import NoGPUError, driver_string
from validation.megakernel.gpu import measure
from validation.megakernel.program import BATCHES as KERNEL_BATCHES
from validation.megakernel.program import check_supported
from validation.megakernel.program import kernel_options as program_kernel_options
from validation.suite.anatomy import anatomy_table, layer_anatomy, middle_layer, op_trace_of_npz
from validation.suite.plots import write_plots
from validation.suite.targets import design_targets

HERE = Path(__file__).resolve().parents[1]  # validation/: the schedules, results and kernel sources
SCHEDULES = HERE / "schedules"
RESULTS = HERE / "results" / "h200"
GPU = "h200-mk-kernels"      # the predictions: the calibrated H200 and the single-op costs of our device functions
KV_LEN = 1024
MODELS = ("llama-3.2-1b", "llama-3.1-8b")
BATCHES = (1, 4, 8)
MODES = tuple(mksim.schedule.MODES)  # every execution mode, as registered (stream ... megakernel)
MEGAKERNEL_SCHEDULES = ("default", "searched", "fused", "sentinel")
FUSIONS = ("fuse_norm", "fuse_rope", "fuse_silu")  # workload options of the fused case, where the builder has them
SEARCHED = "searched"        # a workload option's value taken from the searched schedule of the same model and batch
MEASURED, SUMMARY, TABLE = "measured.json", "summary.json", "table.md"
FORMAT = "mksim-validation-measured"
REL_ERR_MAX = 1e-2           # bf16 outputs against torch: the issue's bound
DOCS_BEGIN, DOCS_END = "<!-- validation-suite-results:begin -->", "<!-- validation-suite-results:end -->"

Measure = Callable[..., dict]


class Refused(MksimError):
    """A case the generated kernels cannot run (its reason in one line): recorded, not measured."""


@dataclass(frozen=True)
class Case:
    """One case: a model step in one mode; ``schedule`` says which schedule (``default``, the
    ``searched`` one, ``fused``, ``sentinel``, a policy name, or a schedule file's name) and
    ``schedule_file`` where it is. ``workload_options`` are keywords of
    :func:`mksim.workload.build_llm_workload` (the value :data:`SEARCHED`: the searched schedule's),
    ``options`` schedule options on top of the kernel's (:func:`kernel_options`)."""
    model: str
    batch: int
    mode: str
    schedule: str = "default"
    kv_len: int = KV_LEN
    policy: str | None = None
    schedule_file: str | None = None
    workload_options: tuple[tuple[str, Any], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.model}/b{self.batch}/{self.mode}" + (f":{self.schedule}" if self.mode == "megakernel" else "")

    def record(self) -> dict[str, Any]:
        """The case as ``measured.json`` keeps it (its options as objects)."""
        return {"name": self.name, **asdict(self), "workload_options": dict(self.workload_options),
                "options": dict(self.options)}


def searched_schedule_path(model: str, batch: int) -> Path:
    return SCHEDULES / f"{model}-b{batch}.json"


def fused_workload_options() -> tuple[tuple[str, Any], ...]:
    """The fused case's workload: every fusion of :data:`FUSIONS` that
    :func:`mksim.workload.build_llm_workload` offers (read from :class:`mksim.workload.Build`'s fields,
    so that the suite runs before and after a fusion is added), with the searched schedule's KV splits."""
    params = {f.name for f in fields(Build)}
    return tuple((f, True) for f in FUSIONS if f in params) + (("kv_splits", SEARCHED),)


def standard_cases(models: tuple[str, ...] = MODELS, batches: tuple[int, ...] = BATCHES) -> list[Case]:
    """The standard suite (48 cases), largest model last so a first look comes quickly."""
    cases = []
    for model in models:
        for batch in batches:
            cases += [Case(model, batch, mode) for mode in MODES]
            cases.append(Case(model, batch, "megakernel", "searched",
                              schedule_file=str(searched_schedule_path(model, batch).relative_to(HERE.parent))))
            cases.append(Case(model, batch, "megakernel", "fused", workload_options=fused_workload_options()))
            cases.append(Case(model, batch, "megakernel", "sentinel", options=(("sync", "sentinel"),)))
    return cases


CASES = standard_cases()


def select(cases: list[Case], only: list[str] | None) -> list[Case]:
    """Cases whose name contains one of ``only`` (all when empty); one-line error when none does."""
    if not only:
        return list(cases)
    chosen = [c for c in cases if any(s in c.name for s in only)]
    if not chosen:
        raise MksimError(f"no case matches --only {' '.join(only)}; case names look like {cases[0].name}")
    return chosen


# -- what the kernel needs --------------------------------------------------------------------------
def _formula_kernel_options(model: str, batch: int, kv_len: int = KV_LEN, gpu: str = GPU) -> dict:
    """The first draft of the kernel's needs, now the floor of a searched schedule's reserve: the
    largest matmul input (``intermediate_size``) of every sequence in bf16 plus 16 KiB of scratch."""
    max_k = models.get(model).intermediate_size
    return {"smem_reserve_KiB": math.ceil((batch * max_k * 2 + 16384) / 1024)}


def kernel_options(model: str, batch: int, kv_len: int = KV_LEN, gpu: str = GPU, mode: str = "megakernel") -> dict:
    """Schedule options the generated kernels need for this model and batch, with the prefetch
    depth of ``mode``'s default clamped to the shared memory left beside the reserve
    (from :func:`validation.megakernel.program.kernel_options`). :class:`Refused` where the kernels have no
    instance for the batch, or not even the weight pages the mode needs fit beside the kernel's inputs."""
    if batch not in KERNEL_BATCHES:
        raise Refused(f"{model} batch {batch}: the generated kernel handles batch "
                      f"{', '.join(map(str, KERNEL_BATCHES))}, not {batch}")
    try:
        opts = dict(program_kernel_options(model, batch, kv_len, gpu, mode=mode))
    except MksimError as exc:  # not even one weight page fits beside the inputs
        raise Refused(str(exc)) from None
    smem = hwmodels.load(gpu).sm.shared_memory_per_block_KiB
    reserve, page = opts.get("smem_reserve_KiB", 32.0), opts.get("page_KiB", 32.0)
    need = 1 if MODE_DEFAULTS[mode]["prefetch_depth"] else 2  # without prefetch a task still streams through 2 pages
    if smem - reserve < need * page:
        raise Refused(f"{model} batch {batch} does not fit the kernel's shared memory: its inputs and accumulators "
                      f"take {reserve:g} of the {smem:g} KiB a block has, leaving {max(smem - reserve, 0):g} KiB "
                      f"for its {page:g} KiB weight pages")
    if "prefetch_depth" not in opts:
        cap = int((smem - reserve) // page)
        if MODE_DEFAULTS[mode]["prefetch_depth"] > cap:
            opts["prefetch_depth"] = max(cap, 0)
    return opts


def search_fixed(model: str, batch: int, kv_len: int = KV_LEN, gpu: str = GPU) -> dict:
    """The options a schedule search must keep: the kernel's needs. The search itself keeps the
    weight ring the device-function costs were measured with (32 KiB pages, the default depth) as
    long as the profile has no cost per page (:func:`mksim.search.ring_fixed`): searched with the
    ring free and no such cost, the schedules went to 16 KiB pages and two-page rings the single
    ops never ran, and measured 19–35 % slower than predicted (docs/validation.md). With the
    profile's ``page_us`` (fitted by ``python -m validation kernel-costs`` to single ops at several
    page sizes) page size and depth are searched.

    The reserve is the larger of the kernel's and the draft formula's (which allows for the
    whole input row of every sequence plus 16 KiB), so that the stored schedules survive small
    changes to the kernel's scratch space; :func:`check_kernel_fit` says when they no longer do."""
    kopts = kernel_options(model, batch, kv_len, gpu)
    opts = {k: v for k, v in kopts.items() if k != "prefetch_depth"}
    draft = _formula_kernel_options(model, batch, kv_len, gpu)["smem_reserve_KiB"]
    # where whole input rows leave no room for two weight pages, the kernel chunks them along k: the draft
    # then gives way to what leaves those pages (the kernel's own reserve still counts)
    smem = hwmodels.load(gpu).sm.shared_memory_per_block_KiB
    draft = min(draft, smem - 2 * opts.get("page_KiB", 32.0))
    opts["smem_reserve_KiB"] = max(opts.get("smem_reserve_KiB", 0), draft)
    # the L2 prefetcher measured 1.6x slower on llama-3.2-1b b1 (256 KiB lead; the model predicts
    # 1 % faster: validation/results/evidence/h200-mk18-ab): kept off until the model sees why
    opts["l2_prefetch_KiB"] = 0.0
    return opts


def check_kernel_fit(schedule, model: str, batch: int, kv_len: int, gpu: str = GPU) -> None:
    """Raise a one-line MksimError when a stored schedule was made without what the kernel now
    needs (fewer KiB reserved, another block count): the searched schedules must be regenerated."""
    o = asdict(schedule.options)
    need = {k: v for k, v in kernel_options(model, batch, kv_len, gpu).items() if k != "prefetch_depth"}
    for k, v in need.items():
        ok = o[k] >= v if k == "smem_reserve_KiB" else o[k] == v
        if not ok:
            raise MksimError(f"this schedule has {k}={o[k]:g} but the kernel needs {k}"
                             f"{'>=' if k == 'smem_reserve_KiB' else '='}{v:g}; regenerate the searched schedules "
                             "with: mksim validate schedules")


# -- building and predicting -----------------------------------------------------------------------
def workload_options(case: Case) -> dict[str, Any]:
    """The case's workload options, those given as :data:`SEARCHED` read from the searched
    schedule of its model and batch (its ``workload`` object)."""
    opts = dict(case.workload_options)
    wanted = [k for k, v in opts.items() if v == SEARCHED]
    if wanted:
        path = searched_schedule_path(case.model, case.batch)
        try:
            spec = json.loads(path.read_text())["workload"]
        except (OSError, ValueError, KeyError, TypeError):
            raise MksimError(f"{path.relative_to(HERE.parent)}: no searched schedule to take {wanted[0]} from; make "
                             "the searched schedules with: mksim validate schedules") from None
        opts.update((k, spec.get(k)) for k in wanted)
    return opts


def build(case: Case, gpu: str = GPU):
    """The case's schedule: the stored file, or built with the kernel's options (and the case's
    workload and schedule options). :class:`Refused` where the kernels cannot hold the model at
    that batch, before anything else."""
    if case.schedule_file:
        if case.schedule == SEARCHED and case.model in models.names():  # refused before a file is looked for
            kernel_options(case.model, case.batch, case.kv_len, gpu)
        path = Path(case.schedule_file)
        if not path.is_absolute() and not path.is_file():
            path = HERE.parent / path
        if not path.is_file():
            raise MksimError(f"{case.schedule_file}: no such schedule file"
                             + ("; make the searched schedules with: mksim validate schedules"
                                if case.schedule == "searched" else ""))
        sched = Schedule.from_json(path)
        if sched.gpu.name != gpu:  # the suite predicts every case with one hardware model
            sched = schedule_for_gpu(sched.to_dict(), gpu)
        if isinstance(sched.workload_spec.get("model"), str):
            check_kernel_fit(sched, sched.workload_spec["model"], sched.workload.batch, sched.workload.kv_len, gpu)
        return sched
    g = hwmodels.load(gpu)
    opts = {**kernel_options(case.model, case.batch, case.kv_len, gpu, case.mode), **dict(case.options)}
    wl = mksim.models.workload(case.model, batch=case.batch, kv_len=case.kv_len, n_sms=g.sm.count,
                               **workload_options(case))
    return mksim.build_schedule(wl, g, case.mode, policy=case.policy, **opts)


def predicted_us(schedule) -> float:
    """The simulated step time as CUDA events measure it: the simulator's latency less the
    launch latency before the first kernel starts.

    The simulator's latency runs from the host's first launch call (it includes
    ``launch.launch_latency_us``, launch to kernel start on an idle GPU, as the host sees it);
    the measurement brackets the step with CUDA events recorded on the GPU's stream, which see
    GPU time, not the host's submission latency. Every prediction of the suite goes through
    here, so that the two are compared on the same footing. (No timeline is recorded: the latency
    is the same without, and a fifth or so of the time is saved.)"""
    return simulate(schedule, timeline=False).latency_us - schedule.gpu.launch.launch_latency_us


def schedule_for_gpu(schedule_json: dict, gpu: str):
    """A stored schedule, re-read for the hardware model ``gpu`` (its queues kept)."""
    return Schedule.from_json(json.dumps({**schedule_json, "gpu": gpu}))


# -- running --------------------------------------------------------------------------------------
def real_measure() -> Measure:
    """The GPU runner's measurement (:func:`validation.megakernel.gpu.measure`; it raises NoGPUError
    without a GPU)."""
    return measure


def device_info() -> dict:
    """Name and driver of GPU 0, as far as this machine can tell (``None`` without CuPy or a GPU)."""
    info: dict[str, Any] = {"name": None, "driver": None, "host": platform.node()}
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        info["name"] = name.decode() if isinstance(name, bytes) else str(name)
        info["driver"] = driver_string(cupy.cuda.runtime.driverGetVersion())
    except Exception:  # no CuPy, no GPU, no driver: the measurement will say so
        pass
    return info


KERNEL_SOURCES = ("megakernel/*.cu", "kernels/*.cuh")  # under validation/: what the GPU runner compiles


def code_version(root: Path = HERE.parent) -> dict[str, Any]:
    """The code a run measures, recorded instead of copies of the kernel sources: the commit
    (``git rev-parse HEAD``), whether tracked files differ from it (``dirty``), and each kernel
    source's git blob id (``sources``: path → blob), which ``git log --all --find-object=BLOB``
    turns into the commits holding that exact file, dirty tree or not (computed here, so also on a
    machine given a copy of the tree without its git directory). ``commit`` and ``dirty`` are
    ``None`` where ``root`` is not a git checkout or git is missing."""
    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    files = sorted(p.relative_to(root).as_posix() for pat in KERNEL_SOURCES for p in HERE.glob(pat))
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status),
            "sources": {f: git_blob_id((root / f).read_bytes()) for f in files}}


def git_blob_id(data: bytes) -> str:
    """The id git gives a file with these bytes (``git hash-object``), without git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, MksimError) else f"{type(exc).__name__}: {text}".rstrip(": ")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write(path: Path, doc: dict, compact: bool = False) -> None:
    """Write-then-rename: an interrupted run leaves the previous complete file, never half a one.
    ``compact``: one line (measured.json holds every case's schedule, tens of thousands of ids)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text((json.dumps(doc, separators=(",", ":")) if compact else json.dumps(doc, indent=1)) + "\n")
    os.replace(tmp, path)


def trace_file(name: str) -> str:
    """The raw trace file of a case (its name without ``/`` and ``:``)."""
    return name.replace("/", "-").replace(":", "-") + ".npz"


def run_case(case: Case, measure: Measure, *, reps: int = 20, watchdog_s: float = 60.0,
             source_dir: Path | None = None, gpu: str = GPU, traces: Path | None = None) -> dict:
    """Build and measure one case; returns its record: the schedule (JSON, so that it can be
    predicted again) and the measurement, or the error in one line, or why the kernels refuse it
    (``refused``: :class:`Refused` from :func:`build`, or
    :func:`validation.megakernel.program.check_supported`, before any GPU work). A persistent
    case's per-task stamps become its ``op_trace`` (:func:`validation.suite.anatomy.op_trace`);
    ``traces``: a folder to keep the raw stamps in (``.npz``). Only
    :class:`~validation.calibrate.NoGPUError` (and an interrupt) propagate."""
    rec: dict[str, Any] = case.record()
    t0 = time.monotonic()
    try:
        try:
            sched = build(case, gpu)
            refusal = None
        except Refused as exc:
            refusal = one_line(exc)
        if refusal is None:
            try:
                check_supported(sched)
            except MksimError as exc:
                refusal = one_line(exc)
        if refusal is not None:
            rec["refused"] = refusal
        else:
            rec["schedule_json"] = sched.to_dict()
            if sched.queues is None:  # chains: the per-task stamps say little about one layer
                rec["measurement"] = measure(sched, reps=reps, watchdog_s=watchdog_s, source_dir=source_dir)
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    raw = (traces or Path(tmp)) / trace_file(case.name)
                    raw.parent.mkdir(parents=True, exist_ok=True)
                    rec["measurement"] = measure(sched, reps=reps, watchdog_s=watchdog_s, source_dir=source_dir,
                                                 raw_trace=raw)
                    if raw.is_file():
                        rec["op_trace"] = op_trace_of_npz(raw)
    except NoGPUError:
        raise
    except Exception as exc:  # one case's failure (wrong output, hung kernel, bad schedule) is data
        rec["error"] = one_line(exc)
    rec["elapsed_s"] = round(time.monotonic() - t0, 1)
    return rec


def ordered(records: list[dict]) -> list[dict]:
    """Records in the standard suite's order, any others after them as they came."""
    rank = {c.name: i for i, c in enumerate(CASES)}
    return sorted(records, key=lambda r: rank.get(r["name"], len(rank)))  # stable: the others keep their order


def run_suite(cases: list[Case], out_dir: Path | str, measure: Measure | None = None, *, reps: int = 20,
              watchdog_s: float = 60.0, gpu: str = GPU, resume: bool = False, device: dict | None = None,
              say: Callable[[str], None] = lambda _msg: None, timeout_s: float | None = None,
              traces: bool = False) -> dict:
    """Run ``cases`` and write ``out_dir/measured.json`` after each; returns its content.
    ``measure(schedule, reps=, watchdog_s=, source_dir=[, raw_trace=])`` is the GPU runner
    (default: the real one, imported now). A case that fails records its error in one line and
    the suite goes on; no GPU at all (:class:`~validation.calibrate.NoGPUError`) stops it.

    ``resume`` keeps what an earlier ``measured.json`` in ``out_dir`` holds: the cases of this run
    it measured without error (not run again) and every case not in this run (another part's).
    ``timeout_s``: begin no case after this many seconds; those left are listed in ``not_begun``
    (run them with ``resume``). ``traces``: keep each persistent case's raw per-task stamps in
    ``out_dir/traces/``."""
    measure = measure or real_measure()
    out = Path(out_dir)
    path = out / MEASURED
    names = {c.name for c in cases}
    records: dict[str, dict] = {}
    if resume and path.is_file():
        old = load_measured(path)
        for r in old["cases"]:  # a kept case keeps the code it ran (doc["code"]: this run's)
            if r["name"] not in names or ("measurement" in r and not r.get("error")):
                records[r["name"]] = {"code": old.get("code"), **r}
    info = device if device is not None else device_info()
    code = code_version()
    doc: dict[str, Any] = {"format": FORMAT, "version": 1, "gpu": info.get("name"), "driver": info.get("driver"),
                           "host": info.get("host"), "started": _now(), "date": _now(), "predicted_with": gpu,
                           "reps": reps, "code": code, "cases": [], "not_begun": []}
    t_end = None if timeout_s is None else time.monotonic() + timeout_s
    for i, case in enumerate(cases):
        if case.name in records:
            say(f"[{i + 1}/{len(cases)}] {case.name}: kept from the earlier run")
            continue
        if t_end is not None and time.monotonic() > t_end:
            doc["not_begun"] = [c.name for c in cases[i:] if c.name not in records]
            say(f"{timeout_s:g} s are up: {len(doc['not_begun'])} case(s) not begun, from {doc['not_begun'][0]}; "
                "run them with --resume")
            break
        rec = run_case(case, measure, reps=reps, watchdog_s=watchdog_s, gpu=gpu,
                       traces=out / "traces" if traces else None)  # sources: doc["code"]
        records[case.name] = rec
        doc["cases"] = ordered(list(records.values()))
        doc["date"] = _now()
        _write(path, doc, compact=True)
        m = rec.get("measurement")
        say(f"[{i + 1}/{len(cases)}] {case.name}: " + (
            f"{m['measured_us']:.1f} µs, max rel err {m['max_rel_err']:.1e}" if m else
            f"refused: {rec['refused']}" if "refused" in rec else f"failed: {rec['error']}"))
    doc["cases"] = ordered(list(records.values()))
    _write(path, doc, compact=True)
    return doc


def load_measured(path: Path | str) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / MEASURED
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise MksimError(f"{p}: cannot read measured results ({one_line(exc)})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise MksimError(f"{p}: not a validation measured.json (expected \"format\": \"{FORMAT}\")")
    return doc


# -- comparing -------------------------------------------------------------------------------------
def kendall_tau_b(x: list[float], y: list[float]) -> float | None:
    """Kendall's τ-b between two rankings (ties counted as neither concordant nor discordant and
    corrected for); ``None`` when undefined (fewer than 2 items, or one side all tied).

    Not ``scipy.stats.kendalltau``, on purpose: validation runs on the GPU machine, where scipy is not
    installed, and scipy's τ-b differs in the last digit (``0.9999999999999999`` for a perfect
    ranking, ``0.911111111111111`` for ``0.9111111111111111``), which would change the committed
    summaries. The tests check the two agree to 1e-12 (ties, floats, the committed cases) and that
    the committed τ values recompute exactly. O(n²) pairs: a suite has a few dozen cases.

    >>> kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4])
    0.6666666666666666
    """
    if len(x) != len(y):
        raise ValueError("kendall_tau_b needs two sequences of one length")
    n = len(x)
    conc = disc = tie_x = tie_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0:
                tie_x += 1
            if dy == 0:
                tie_y += 1
            if dx and dy:
                conc += (dx > 0) == (dy > 0)
                disc += (dx > 0) != (dy > 0)
    pairs = n * (n - 1) // 2
    denom = math.sqrt((pairs - tie_x) * (pairs - tie_y))
    return (conc - disc) / denom if denom else None


def _row(rec: dict, gpu: str, hbm_GBps: float) -> tuple[dict, dict | None]:
    """A case's summary row, and the anatomy of its middle layer where it has an ``op_trace``."""
    m = rec.get("measurement") or {}
    pred = err = anatomy = None
    error = rec.get("error")
    if rec.get("schedule_json"):
        try:
            sched = schedule_for_gpu(rec["schedule_json"], gpu)
            pred = predicted_us(sched)
            layer = middle_layer(sched.workload.ops)
            if rec.get("op_trace") and layer is not None:
                anatomy = layer_anatomy(rec["op_trace"], sched.workload.ops, layer, hbm_GBps)
        except MksimError as exc:
            error = error or f"cannot predict: {one_line(exc)}"
    meas = m.get("measured_us")
    if pred is not None and meas:
        err = (pred - meas) / meas * 100
    moved = m.get("bytes_moved")
    rel = m.get("max_rel_err")
    correct = m.get("ok", rel <= REL_ERR_MAX if rel is not None else None) if m else None
    gbps = moved / meas / 1e3 if moved and meas else None
    row = {"model": rec["model"], "batch": rec["batch"], "mode": rec["mode"], "schedule": rec["schedule"],
           "predicted_us": pred, "measured_us": meas, "measured_spread_us": m.get("measured_spread_us"),
           "max_rel_err": m.get("max_rel_err"), "name": rec["name"], "kv_len": rec.get("kv_len"),
           "error": error, "error_pct": err, "bytes_moved": moved, "achieved_GBps": gbps,
           "bandwidth_fraction": gbps / hbm_GBps if gbps else None, "correct": correct,
           "refused": rec.get("refused"), "workload_options": rec.get("workload_options") or {},
           "options": rec.get("options") or {}}
    return row, anatomy


def metrics(rows: list[dict], hbm_GBps: float) -> dict:
    """MAPE, each mode's error, Kendall's τ (all cases, and the modes of each model and batch),
    and the issue's targets, over the cases with both a prediction and a measurement."""
    ok = [r for r in rows if r["error_pct"] is not None and not r["error"]]
    out: dict[str, Any] = {"cases": len(rows), "compared": len(ok), "hbm_read_GBps": hbm_GBps,
                           "wrong_output": sum(r["correct"] is False for r in rows),
                           "refused": sum(bool(r.get("refused")) for r in rows)}
    if not ok:
        return out
    out["mape_pct"] = statistics.fmean(abs(r["error_pct"]) for r in ok)
    out["by_mode"] = {}
    for mode in dict.fromkeys(r["mode"] for r in ok):
        errs = [r["error_pct"] for r in ok if r["mode"] == mode]
        out["by_mode"][mode] = {"n": len(errs), "mape_pct": statistics.fmean(abs(e) for e in errs),
                                "max_abs_error_pct": max(abs(e) for e in errs),
                                "mean_error_pct": statistics.fmean(errs)}
    groups: dict[str, list[dict]] = {}
    for r in ok:
        groups.setdefault(f"{r['model']}/b{r['batch']}", []).append(r)
    by_group = {g: kendall_tau_b([r["predicted_us"] for r in rs], [r["measured_us"] for r in rs])
                for g, rs in groups.items()}
    defined = [t for t in by_group.values() if t is not None]
    out["kendall_tau"] = {"overall": kendall_tau_b([r["predicted_us"] for r in ok], [r["measured_us"] for r in ok]),
                          "by_group": by_group, "mean_of_groups": statistics.fmean(defined) if defined else None}
    targets: dict[str, Any] = {
        "mape_le_10pct": out["mape_pct"] <= 10.0,
        "every_mode_mape_le_15pct": all(v["mape_pct"] <= 15.0 for v in out["by_mode"].values()),
        "kendall_tau_ge_0_8": (out["kendall_tau"]["mean_of_groups"] or -1) >= 0.8,
    }
    one_b1 = [r for r in ok if (r["model"], r["batch"]) == (MODELS[0], 1)]
    mks = [r for r in one_b1 if r["mode"] == "megakernel"]
    pdl = [r for r in one_b1 if r["mode"] == "graph_pdl"]
    if mks:
        best = min(mks, key=lambda r: r["measured_us"])
        targets["megakernel_bandwidth_fraction"] = best["bandwidth_fraction"]
        targets["megakernel_ge_70pct_bandwidth"] = (best["bandwidth_fraction"] or 0) >= 0.7
        if pdl:
            targets["megakernel_faster_than_graph_pdl"] = best["measured_us"] < pdl[0]["measured_us"]
    out["targets"] = targets
    return out


def summarize(measured: dict | Path | str, gpu: str = GPU, stacks: dict | None = None) -> dict:
    """``summary.json``: the issue's schema (``gpu``, ``date``, ``cases`` with model, batch, mode,
    schedule, predicted_us, measured_us, measured_spread_us, max_rel_err) plus each case's error,
    bandwidth, name and refusal; the suite's :func:`metrics`; the design targets
    (:func:`validation.suite.targets.design_targets`; ``stacks``: a
    :func:`~validation.suite.targets.read_stacks` of the same machine, for the target against
    ``torch.compile``); ``anatomy``: the middle layer of every persistent case with a trace
    (:func:`validation.suite.anatomy.layer_anatomy`), by case name. Predictions are recomputed
    here, on the CPU, with the hardware model ``gpu``."""
    doc = measured if isinstance(measured, dict) else load_measured(measured)
    hbm_GBps = hwmodels.load(gpu).hbm_bandwidth_Bps / 1e9
    done = [_row(rec, gpu, hbm_GBps) for rec in doc["cases"]]
    rows = [r for r, _ in done]
    m = metrics(rows, hbm_GBps)
    out = {"gpu": doc.get("gpu"), "date": doc.get("date"), "cases": rows, "driver": doc.get("driver"),
           "predicted_with": gpu, "metrics": m,
           "design_targets": design_targets(rows, m, MODELS, hbm_GBps, stacks),
           "anatomy": {r["name"]: a for r, a in done if a is not None}}
    if stacks is not None:
        out["stacks"] = stacks
    left = [n for n in doc.get("not_begun") or [] if n not in {r["name"] for r in rows}]
    if left:
        out["not_begun"] = left
    return out


def write_summary(measured_dir: Path | str, gpu: str = GPU, out_dir: Path | str | None = None,
                  stacks: dict | None = None) -> dict:
    """Summary, plots and markdown table of ``measured_dir/measured.json`` into ``out_dir``
    (default: the same folder). Returns ``{"summary": ..., "files": [paths]}``."""
    summary = summarize(Path(measured_dir), gpu, stacks)
    out = Path(out_dir) if out_dir else Path(measured_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / SUMMARY, out / TABLE]
    _write(files[0], summary)
    files[1].write_text(markdown_table(summary))
    files += write_plots(summary, out)
    return {"summary": summary, "files": files}


# -- docs ------------------------------------------------------------------------------------------
def _f(v: float | None, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def _case_rows(rows: list[dict]) -> list[str]:
    """The table's rows; the cases of one model and batch refused for one reason in one row."""
    out, i = [], 0
    while i < len(rows):
        r = rows[i]
        if r.get("refused"):
            j = i
            while j + 1 < len(rows) and (rows[j + 1]["model"], rows[j + 1]["batch"], rows[j + 1].get("refused")) \
                    == (r["model"], r["batch"], r["refused"]):
                j += 1
            group = sum((x["model"], x["batch"]) == (r["model"], r["batch"]) for x in rows)
            what = (f"{r['mode']} | {r['schedule']}" if j == i else
                    "every mode | every schedule" if j - i + 1 == group else f"{j - i + 1} cases | –")
            out.append(f"| {r['model']} | {r['batch']} | {what} | – | – | – | refused: {r['refused']} | – | – |")
            i = j + 1
            continue
        bw = (f"{r['achieved_GBps'] / 1e3:.2f} TB/s ({r['bandwidth_fraction']:.0%})"
              if r["achieved_GBps"] else "–")
        err = f"{r['error_pct']:+.1f} %" if r["error_pct"] is not None else ("failed" if r["error"] else "–")
        out.append(f"| {r['model']} | {r['batch']} | {r['mode']} | {r['schedule']} | "
                   f"{_f(r['predicted_us'], '.1f')} | "
                   f"{_f(r['measured_us'], '.1f')} | {_f(r['measured_spread_us'], '.1f')} | {err} | {bw} | "
                   f"{_f(r['max_rel_err'], '.1e')} |")
        i += 1
    return out


def _variants_line(rows: list[dict]) -> list[str]:
    """What the megakernel's schedules are, where the summary has more than default and searched."""
    mk = {r["schedule"]: r for r in rows if r["mode"] == "megakernel"}
    if not {"fused", "sentinel"} & set(mk):
        return []
    words = {"default": "the default placement policy (`dag`)",
             "searched": "the schedule `mksim validate schedules` found (`validation/schedules/`)",
             "sentinel": "the default schedule with `sync=sentinel`"}
    if "fused" in mk:
        wo = mk["fused"].get("workload_options") or {}
        fused = [f"`{k}`" for k, v in wo.items() if v is True]
        splits = " and the searched schedule's KV splits" if wo.get("kv_splits") == SEARCHED else ""
        words["fused"] = f"the default policy on a workload with {', '.join(fused) or 'no fusion'}{splits}"
    return ["", "Megakernel schedules: " + "; ".join(f"{k}: {words[k]}" for k in MEGAKERNEL_SCHEDULES
                                                   if k in mk and k in words) + "."]


def _targets_lines(summary: dict) -> list[str]:
    goals = summary.get("design_targets")
    if not goals:
        return []
    met = {True: "**met**", False: "**missed**", None: "not measured"}
    return ["", "The design targets, from these measurements (a model and batch's megakernel: its fastest "
                "schedule whose output checked):", "", "| target | | measured |", "|---|---|---|",
            *(f"| {g['target']} | {met[g['met']]} | {g['detail']} |" for g in goals)]


def _anatomy_lines(summary: dict) -> list[str]:
    """Each model's batch-1 anatomy (its smallest batch with one), default against the faster of
    fused and searched."""
    an = summary.get("anatomy") or {}
    by_name = {r["name"]: r for r in summary["cases"]}
    out: list[str] = []
    for model in dict.fromkeys(r["model"] for r in summary["cases"]):
        for batch in sorted({r["batch"] for r in summary["cases"] if r["model"] == model}):
            before = f"{model}/b{batch}/megakernel:default"
            after = [n for n in (f"{model}/b{batch}/megakernel:{k}" for k in ("fused", "searched"))
                     if n in an and not by_name[n]["error"] and by_name[n]["correct"] is not False]
            if before not in an or not after:
                continue
            aft = min(after, key=lambda n: by_name[n]["measured_us"] or math.inf)
            a, b = an[before], an[aft]
            la, lb = "default", by_name[aft]["schedule"]
            out += ["", f"Per-layer anatomy of {model} batch {batch}, layer {a['layer']} of {a['layers']} "
                        f"({la} {_f(by_name[before]['measured_us'], '.1f')} µs a step, {lb} "
                        f"{_f(by_name[aft]['measured_us'], '.1f')} µs): from each task's `%globaltimer` stamps, "
                        "µs from the layer's first task start to each op's first start and last end; wait and "
                        "compute are means per task.", "", anatomy_table((la, a), (lb, b)).rstrip("\n"), "",
                    f"The layer takes {a['span_us']:.1f} µs ({la}) and {b['span_us']:.1f} µs ({lb}); its DRAM "
                    f"bytes (weights and KV cache read), {a['bytes'] / 1e6:.1f} MB"
                    + (f" and {b['bytes'] / 1e6:.1f} MB" if abs(a["bytes"] - b["bytes"]) > 0.5e5 else "")
                    + f", take {a['dram_us']:.1f} µs"
                    + (f" and {b['dram_us']:.1f} µs" if abs(a["bytes"] - b["bytes"]) > 0.5e5 else "")
                    + f" at the HBM read bandwidth ({a['hbm_read_GBps']:.0f} GB/s)."]
            break
    return out


def markdown_table(summary: dict) -> str:
    """The summary as markdown (what docs/validation.md shows): the cases, the metrics and the
    targets, what the megakernel schedules are, the design targets and the per-layer anatomy."""
    lines = [f"{summary.get('gpu') or 'GPU'}, {summary.get('date') or ''}; predictions by `{summary['predicted_with']}`"
             f" (µs; error = predicted / measured − 1):", "",
             "| model | batch | mode | schedule | predicted µs | measured µs | spread µs | error | bandwidth | "
             "max rel err |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|", *_case_rows(summary["cases"])]
    m = summary["metrics"]
    if "mape_pct" in m:
        tau = m["kendall_tau"]
        modes = ", ".join(f"{k} {v['mape_pct']:.1f} %" for k, v in m["by_mode"].items())
        refused = f" ({m['refused']} refused)" if m.get("refused") else ""
        lines += ["", f"MAPE {m['mape_pct']:.1f} % over {m['compared']} of {m['cases']} cases{refused}; by mode: "
                      f"{modes}. Kendall τ-b {_f(tau['overall'], '.2f')} over all cases, "
                      f"{_f(tau['mean_of_groups'], '.2f')} on average within each model and batch."]
        t = m.get("targets", {})
        met = {True: "met", False: "missed"}
        goals = [("MAPE ≤ 10 %", t.get("mape_le_10pct")), ("every mode ≤ 15 %", t.get("every_mode_mape_le_15pct")),
                 ("τ ≥ 0.8 within model and batch", t.get("kendall_tau_ge_0_8"))]
        if "megakernel_ge_70pct_bandwidth" in t:
            goals.append((f"{MODELS[0]} batch 1 megakernel ≥ 70 % of HBM read bandwidth "
                          f"({_f(t['megakernel_bandwidth_fraction'], '.0%')})", t["megakernel_ge_70pct_bandwidth"]))
        if "megakernel_faster_than_graph_pdl" in t:
            goals.append(("and faster than graph_pdl", t["megakernel_faster_than_graph_pdl"]))
        lines.append("Targets: " + "; ".join(f"{g}: {met[v]}" for g, v in goals if v is not None) + ".")
    lines += _variants_line(summary["cases"]) + _targets_lines(summary) + _anatomy_lines(summary)
    notes = [f"- {r['name']} failed: {r['error']}" for r in summary["cases"] if r["error"]]
    notes += [f"- {r['name']}: wrong output (max rel err {r['max_rel_err']:.1e})" for r in summary["cases"]
              if r["correct"] is False]
    if summary.get("not_begun"):
        notes.append(f"- not run (the run's time was up): {', '.join(summary['not_begun'])}")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def splice_docs(page: Path | str, table: str) -> bool:
    """Put ``table`` between the suite-results markers of ``page``; True when the page changed."""
    p = Path(page)
    text = p.read_text()
    if DOCS_BEGIN not in text or DOCS_END not in text:
        raise MksimError(f"{p}: no {DOCS_BEGIN} ... {DOCS_END} markers to put the table between")
    head, rest = text.split(DOCS_BEGIN, 1)
    _, tail = rest.split(DOCS_END, 1)
    new = f"{head}{DOCS_BEGIN}\n{table}{DOCS_END}{tail}"
    if new != text:
        p.write_text(new)
    return new != text

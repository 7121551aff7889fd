"""Plain data for the explorer's pages, extracted from mksim (no Dash, no plotly).

Every function returns dicts and lists of numbers and strings, so pages and tests share one
source of truth and the figures in :mod:`explorer.figures` stay pure.
"""

from __future__ import annotations

import base64
import copy
import json
import tempfile
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Any

import mksim.models
import validation
from explorer.hwdata import WhatIf, whatif_changes
from hwmodels.files import parse_json
from mksim.compare import compare
from mksim.errors import MksimError, UnknownNameError
from mksim.extras import require
from mksim.schedule import Schedule, build_schedule, design_rows, registered_designs
from mksim.search import Problem, build, candidate_from_params
from mksim.sim import CATEGORIES, simulate, task_experts
from mksim.target import GPUS, PROFILES, Target, gpu_spec
from mksim.workload import Step
from mksim.workload.routing import ROUTINGS, CountsFile, parse_routing

#: Validation result sets committed under ``validation/results/``, in display order.
VALIDATION_SETS = ("h200", "h200-heldout")


def models() -> list[str]:
    """Built-in model names."""
    return list(mksim.models.names())


def gpus() -> list[str]:
    """GPU names (built-in and calibrated), as ``mksim hw list`` knows them."""
    return list(GPUS)


def whole_number(value: object, what: str) -> int:
    """``value`` as an int if it is a whole number (an int, a float without a fraction, or its text);
    else MksimError in one line (``batch must be a whole number, got 1.5``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and len(value) < 20 and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    shown = repr(value)[:30] if isinstance(value, str | float) else ("nothing" if value is None else
                                                                      f"a {type(value).__name__}")
    raise MksimError(f"{what} must be a whole number, got {shown}")


def _shown(value: object) -> str:
    return repr(value)[:60] if isinstance(value, str) else f"a {type(value).__name__}"


def check_model(model: object) -> str:
    """``model`` if it is a built-in model's name (:func:`models`); else MksimError in one line. The explorer
    never takes a path from the browser: a config of one's own goes through the upload box."""
    if not isinstance(model, str) or model not in models():
        raise MksimError(f"unknown model {_shown(model)}: choose one of {', '.join(models())}, or upload a config.json")
    return model


def check_gpu(gpu: object) -> str:
    """``gpu`` if it is a GPU name of :func:`gpus`, or ``NAME+PROFILE`` with a profile of
    ``hwmodels.profiles()``; else MksimError in one line (never a path: the explorer opens no file the
    browser names)."""
    if isinstance(gpu, str):
        name, _, profile = gpu.partition("+")
        if name in gpus() and (not profile or profile in PROFILES):
            return gpu
    raise MksimError(f"unknown GPU {_shown(gpu)}: choose one of {', '.join(gpus())} (optionally +PROFILE, PROFILE "
                     f"one of {', '.join(PROFILES)})")


#: The longest routing text a page takes (``uniform``, ``zipf:1.2``): a name and a number, never a path.
MAX_ROUTING_CHARS = 40


def named_routings() -> list[str]:
    """The routing models a page may name (every registered one but the counts file, which names a path)."""
    return [n for n in ROUTINGS if n != CountsFile.name]


def check_routing(routing: object) -> str:
    """``routing`` as a :class:`mksim.workload.Step` takes it, if it names a registered routing model
    (:func:`named_routings`: ``uniform``, ``zipf:S``); empty or ``None`` is ``uniform``. Anything else
    (a path, a counts file, text over :data:`MAX_ROUTING_CHARS`) is refused in one line (MksimError): the
    explorer never opens a file the browser names.

    >>> check_routing(" zipf:1.2 "), check_routing(None)
    ('zipf:1.2', 'uniform')
    >>> check_routing("/etc/counts.json")
    Traceback (most recent call last):
    ...
    hwmodels.errors.InputError: routing '/etc/counts.json': give uniform or zipf:S (S > 0, 1.2 is typical)
    """
    if routing is None or (isinstance(routing, str) and not routing.strip()):
        return "uniform"
    if not isinstance(routing, str) or len(routing) > MAX_ROUTING_CHARS:
        raise MksimError(f"routing {_shown(routing)}: give uniform or zipf:S (S > 0, 1.2 is typical), "
                         f"at most {MAX_ROUTING_CHARS} characters")
    text = routing.strip()
    if text.partition(":")[0] not in named_routings():
        raise MksimError(f"routing {_shown(text)}: give uniform or zipf:S (S > 0, 1.2 is typical)")
    parse_routing(text)  # zipf:abc: mksim's one line
    return text


#: The largest tensor- or expert-parallel degree a page takes: a node's GPUs are far fewer (mksim refuses more
#: than the GPU file's ``[interconnect] gpus_count``, in one line); a bound on what a request makes mksim check.
MAX_SPLIT = 64


def check_split(tp: object, ep: object) -> tuple[int, int]:
    """The page's tensor- and expert-parallel GPUs (``--tp``, ``--ep``) as whole numbers from 1 to
    :data:`MAX_SPLIT`; empty is 1. Whether the model and the node can take them is mksim's to say, as
    ``mksim compare`` says it (:class:`mksim.workload.Step`, one line).

    >>> check_split(2, None), check_split("4", 2.0)
    ((2, 1), (4, 2))
    >>> check_split(0, 1)
    Traceback (most recent call last):
    ...
    hwmodels.errors.InputError: tensor-parallel GPUs must be a whole number from 1 to 64, got 0
    """
    out = []
    for value, what in ((tp, "tensor-parallel GPUs"), (ep, "expert-parallel GPUs")):
        n = 1 if value is None or value == "" else whole_number(value, what)
        if not 1 <= n <= MAX_SPLIT:
            raise MksimError(f"{what} must be a whole number from 1 to {MAX_SPLIT}, got {n}")
        out.append(n)
    return out[0], out[1]


def has_experts(model: str, config: dict[str, Any] | None = None) -> bool:
    """Whether the built-in ``model`` (or the uploaded ``config``) is a mixture of experts."""
    cfg = mksim.models.get(check_model(model)) if config is None else mksim.models.config_from_hf(config, name=model)
    return bool(getattr(cfg, "num_experts", 0))


def routing_for(model: str, routing: object, config: dict[str, Any] | None = None) -> str:
    """The routing a page simulates ``model`` with: ``routing`` checked (:func:`check_routing`) for a
    mixture of experts, ``uniform`` for a dense model (which has no router: the page's choice is ignored)."""
    text = check_routing(routing)
    return text if text != "uniform" and has_experts(model, config) else "uniform"


def moe_design_rows() -> dict[str, dict[str, Any]]:
    """The megakernel rows (label: ``build_schedule`` options) of the registered designs that place a mixture of
    experts' expert tiles (those a model without experts cannot have), as ``mksim compare --designs`` names
    them: ``megakernel:moe_stride``, ``megakernel:moe_queue``, ...

    >>> list(moe_design_rows())[:2]
    ['megakernel:moe_stride', 'megakernel:moe_queue']
    """
    dense = _Dense()
    moe = [d.name for d in registered_designs() if d.available_for(dense) is not None]
    return {label: opts for rows in design_rows(moe).values() for label, opts in rows}


class _Dense:
    """A stand-in workload without experts, to ask each design whether it needs them."""

    ops: tuple[Any, ...] = ()
    model = None
    name = "a dense model"


def check_schedule_text(text: str) -> None:
    """Check a schedule file's JSON before :meth:`mksim.schedule.Schedule.from_json` reads it: a JSON object
    (nested no deeper than a schedule is) whose ``gpu`` is a GPU name (:func:`check_gpu`) and whose
    ``workload.model`` a built-in model name or an embedded config, never a path on this machine."""
    d = parse_json(text, "schedule", error=MksimError)
    if not isinstance(d, dict):
        raise MksimError("not a schedule file: expected the JSON object that mksim simulate --save writes")
    if "gpu" in d:
        try:
            check_gpu(d["gpu"])
        except MksimError as exc:
            raise MksimError(f"schedule {exc}; the explorer reads GPU names only") from None
    wl = d.get("workload")
    if isinstance(wl, dict) and "model" in wl and not isinstance(wl["model"], dict):
        try:
            check_model(wl["model"])
        except MksimError as exc:
            raise MksimError(f"schedule workload {exc}") from None
    if isinstance(wl, dict) and "routing" in wl:
        try:
            check_routing(wl["routing"])
        except MksimError as exc:
            raise MksimError(f"schedule workload {exc}; the explorer reads no routing file") from None


def compare_data(model: str, gpu: str, batch: int = 1, kv_len: int = 1024, phase: str = "decode") -> dict[str, Any]:
    """Every execution mode on one workload: what ``mksim compare --json`` prints, plus the breakdown order.
    Keys: ``model gpu workload batch kv_len phase bandwidth_floor_us modes categories``; ``modes`` maps each
    mode to ``latency_us tokens_per_s hbm_util speedup_vs_stream policy breakdown_us``. Raises
    :class:`mksim.errors.MksimError` on bad input (batch 0, a KV length past the model's context, ...).
    A mode the GPU cannot run is not in ``modes``: ``absent`` maps it to the reason.
    """
    d = compare(Step(model, batch, kv_len, phase), Target.parse(check_gpu(gpu))).to_dict()
    return {**d, "categories": list(CATEGORIES)}


def _results_dir() -> Path:
    return Path(validation.__file__).resolve().parent / "results"


def validation_sets() -> list[str]:
    """The committed validation result sets that have a ``summary.json``."""
    root = _results_dir()
    return [s for s in VALIDATION_SETS if (root / s / "summary.json").is_file()]


def validation_data(name: str = "h200") -> dict[str, Any]:
    """Predicted vs measured from ``validation/results/<name>/summary.json``.
    Keys: ``name gpu date predicted_with`` (strings), ``cases`` (the compared cases: ``name model batch
    mode schedule predicted_us measured_us error_pct``), ``by_mode`` (per mode ``n mape_pct mean_error_pct
    max_abs_error_pct``) and ``metrics_line`` (one sentence: MAPE, per-mode errors, Kendall τ).
    """
    if name not in VALIDATION_SETS:

        raise MksimError(f"unknown validation set {name!r}; known: {', '.join(VALIDATION_SETS)}")
    s = json.loads((_results_dir() / name / "summary.json").read_text())
    keys = ("name", "model", "batch", "mode", "schedule", "predicted_us", "measured_us", "error_pct")
    cases = [{k: c.get(k) for k in keys} for c in s["cases"]
             if c.get("predicted_us") and c.get("measured_us") and c.get("error_pct") is not None]
    m = s.get("metrics", {})
    return {"name": name, "gpu": s.get("gpu", ""), "date": s.get("date", ""),
            "predicted_with": s.get("predicted_with", ""), "cases": cases,
            "by_mode": m.get("by_mode", {}), "metrics_line": metrics_line(m)}


def metrics_line(m: dict[str, Any]) -> str:
    """One sentence summarising a validation summary's ``metrics`` (as in ``table.md``)."""
    if "mape_pct" not in m:
        return "no compared cases"
    modes = ", ".join(f"{k} {v['mape_pct']:.1f} %" for k, v in m.get("by_mode", {}).items())
    line = f"MAPE {m['mape_pct']:.1f} % over {m.get('compared', '?')} of {m.get('cases', '?')} cases; by mode: {modes}."
    tau = m.get("kendall_tau") or {}
    if tau.get("overall") is not None:
        line += f" Kendall τ-b {tau['overall']:.2f} over all cases"
        if tau.get("mean_of_groups") is not None:
            line += f", {tau['mean_of_groups']:.2f} on average within each model and batch"
        line += "."
    return line


# -- Timeline: one simulated step, task by task ------------------------------------------
#: Segments the simulator records on an SM besides its tasks, drawn as bars of their own kind.
WAIT_KINDS = ("dependency wait", "barrier wait")
TASK_COLUMNS = ("task", "name", "op", "kind", "sm", "slot", "start_us", "end_us", "bytes", "expert")
WAIT_COLUMNS = ("kind", "task", "name", "sm", "slot", "start_us", "end_us")


def timeline_schedule(model: str = "llama-3.2-1b", gpu: str = "h200", batch: int = 1, kv_len: int = 1024,
                      phase: str = "decode", mode: str = "megakernel", policy: str | None = None,
                      schedule: str | None = None, prefill_tokens: int = 0, routing: str | None = None,
                      design: str | None = None, tp: Any = 1, ep: Any = 1):
    """The :class:`mksim.schedule.Schedule` the Timeline page simulates.
    ``schedule`` is the JSON text of a schedule file (what ``mksim simulate --save`` and ``mksim search --out``
    write); without it, ``mode``'s default schedule of the workload (``policy``: a persistent mode's placement
    policy, ``None`` for the default; ``prefill_tokens``: new tokens per sequence, for the prefill phase;
    ``routing``: a mixture of experts' routing model, :func:`routing_for`; ``design``: a row of
    :func:`moe_design_rows`, ``None`` for none; ``tp``, ``ep``: the step split over GPUs, :func:`check_split`).
    Raises :class:`mksim.errors.MksimError` on bad input.
    """
    if schedule is not None:
        if not isinstance(schedule, str) or not schedule.lstrip().startswith("{"):  # from_json would take other
            raise MksimError("not a schedule file: expected the JSON that mksim simulate --save writes")  # a path
        check_schedule_text(schedule)
        try:
            return Schedule.from_json(schedule)
        except (TypeError, ValueError) as exc:  # a key the workload's builder does not take, say
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise MksimError(f"not a schedule this mksim reads ({first})") from None

    g = gpu_spec(check_gpu(gpu))
    opts: dict[str, Any] = {}
    if design:
        rows = moe_design_rows()
        if design not in rows:
            raise MksimError(f"unknown MoE design {_shown(design)}: choose none or one of {', '.join(rows)}")
        opts = dict(rows[design])
    tp, ep = check_split(tp, ep)
    step = Step(check_model(model), batch, kv_len, phase, prefill_tokens, tp=tp, routing=routing_for(model, routing),
                ep=ep)
    wl = mksim.models.workload(step, n_sms=g.sm.count)
    return build_schedule(wl, g, mode, **{"policy": policy or None, **opts})


def timeline_data(model: str = "llama-3.2-1b", gpu: str = "h200", batch: int = 1, kv_len: int = 1024,
                  phase: str = "decode", mode: str = "megakernel", policy: str | None = None,
                  schedule: str | None = None, prefill_tokens: int = 0, routing: str | None = None,
                  design: str | None = None, tp: Any = 1, ep: Any = 1) -> dict[str, Any]:
    """One simulated step, task by task, for the per-SM Gantt chart (arguments as :func:`timeline_schedule`).
    Keys: ``workload gpu mode policy latency_us n_tasks n_sms lanes_per_sm``; ``tracks``, the SMs that ran a
    task, in order; ``tasks``, one row per task as columns (``TASK_COLUMNS``: equal-length lists; ``slot`` is
    the block slot on its SM in chain modes, ``bytes`` what the task reads and writes, ``expert`` the expert an
    expert task serves, -1 for another task); ``waits``, each dependency or barrier wait on an SM
    (``WAIT_COLUMNS``; ``task`` is the task waiting); ``wait_kinds``, ``schedule_json`` (the schedule simulated:
    to download, or to trace again), ``moe`` (the workload's routing summary, ``None`` for a dense step) and
    ``design_stats`` (what the designs on reported: an MoE design's per-layer expert tiles per SM and the top-k's
    serial time) and ``communication_us`` (a step split over GPUs: its collective ops' span; ``None`` on one
    GPU). Times in µs from the step's start.

    >>> d = timeline_data("llama-3.2-1b", "h200", mode="megakernel")
    >>> len(d["tracks"]), sorted(d["tasks"]["task"]) == list(range(d["n_tasks"]))
    (132, True)
    """
    sched = timeline_schedule(model, gpu, batch, kv_len, phase, mode, policy, schedule, prefill_tokens, routing,
                              design, tp, ep)
    res = simulate(sched)
    expert = [-1 if et is None else et[0] for et in task_experts(sched.graph)]
    g = sched.graph
    op_of = g.op_of.tolist()
    op_names, op_kinds = [op.name for op in g.ops], [op.kind for op in g.ops]
    moved = (g.weight_bytes + g.kv_bytes + g.in_bytes + g.out_bytes).tolist()
    lps = res.lanes_per_sm
    tasks: dict[str, list] = {c: [] for c in TASK_COLUMNS}
    waits: dict[str, list] = {c: [] for c in WAIT_COLUMNS}
    for lane, a, b, t, cat in res.timeline:
        if lane < 0:  # a persistent SM's loader: its time shows as its executor's waits and memory
            continue
        sm, slot = divmod(lane, lps)
        if cat == "task":
            op = op_of[t]
            for c, v in zip(TASK_COLUMNS, (t, res.task_names[t], op_names[op], op_kinds[op], sm, slot, a, b,
                                           moved[t], expert[t]), strict=True):
                tasks[c].append(v)
        elif cat in WAIT_KINDS:
            for c, v in zip(WAIT_COLUMNS, (cat, t, res.task_names[t], sm, slot, a, b), strict=True):
                waits[c].append(v)
    return {"workload": res.workload, "gpu": res.gpu, "mode": res.mode, "policy": res.policy,
            "latency_us": res.latency_us, "n_tasks": res.n_tasks, "n_sms": sched.gpu.sm.count,
            "lanes_per_sm": lps, "tracks": sorted(set(tasks["sm"])), "tasks": tasks, "waits": waits,
            "wait_kinds": list(WAIT_KINDS), "schedule_json": sched.to_json(),
            "moe": sched.workload.routing_summary(), "design_stats": res.design_stats,
            "communication_us": res.communication_us}


def perfetto_trace(schedule: str) -> str:
    """The Chrome trace (JSON text, opens in Perfetto) of a schedule file's JSON, as ``mksim simulate --trace``
    writes it: one track per SM."""


    res = simulate(timeline_schedule(schedule=schedule))
    with tempfile.TemporaryDirectory() as d:
        return res.to_perfetto(Path(d) / "trace.json").read_text()


# -- Search: an Optuna study read from its storage -----------------------------------------
#: Trial states as the Search page counts them.
TRIAL_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")


def storage_url(text: str) -> str:
    """An Optuna storage URL from what a user typed: a URL (``sqlite:///...``, ``postgresql://...``) as it
    is, a file path as an SQLite URL.

    >>> storage_url("/tmp/s.db"), storage_url("sqlite:///s.db")
    ('sqlite:////tmp/s.db', 'sqlite:///s.db')
    """
    text = (text or "").strip()
    if not text:
        raise MksimError("give a study storage: an SQLite file path or an RDB URL")
    return text if "://" in text else f"sqlite:///{Path(text).expanduser().resolve()}"


#: Storages kept (one per URL; the least recently used is closed beyond this many).
KEPT_STORAGES = 8
_STORAGES: OrderedDict[str, Any] = OrderedDict()
_STORAGES_LOCK = threading.Lock()


def _storage(url: str) -> Any:
    """The Optuna storage of ``url``, opened once and kept: opening one checks its tables against Optuna's
    schema, loading ten alembic migration scripts (about 0.2 s of CPU), which every poll of a followed
    search paid twice. An SQLite file is opened anew by each read (no connection is kept: a file deleted
    or replaced is read as it is now); a storage that fails a read is forgotten (:func:`_forget`), so the
    next read opens it again. Raises what Optuna raises."""
    optuna = require("optuna", "explorer", "the Search page")
    with _STORAGES_LOCK:
        if url in _STORAGES:
            _STORAGES.move_to_end(url)
            return _STORAGES[url]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:"):
        from sqlalchemy.pool import NullPool

        kwargs = {"engine_kwargs": {"poolclass": NullPool}}
    storage = optuna.storages.RDBStorage(url, **kwargs)
    with _STORAGES_LOCK:
        storage = _STORAGES.setdefault(url, storage)
        while len(_STORAGES) > KEPT_STORAGES:
            _STORAGES.popitem(last=False)[1].engine.dispose()
    return storage


def _forget(url: str) -> None:
    with _STORAGES_LOCK:
        storage = _STORAGES.pop(url, None)
    if storage is not None:
        storage.engine.dispose()


def _study_names(url: str) -> list[str]:
    optuna = require("optuna", "explorer", "the Search page")
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        raise MksimError(f"no study storage at {url[len('sqlite:///'):]}")  # opening it would create it
    while True:
        kept = url in _STORAGES
        try:
            return list(optuna.study.get_all_study_names(_storage(url)))
        except Exception as exc:  # sqlalchemy's own errors: not a database, server down, missing driver
            _forget(url)
            if kept:  # opened before and failing now (its file replaced, say): open it anew, once
                continue
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise MksimError(f"cannot open study storage {url!r}: {first}") from None


def study_names(storage: str) -> list[str]:
    """The names of the studies in ``storage`` (a path or URL, as :func:`storage_url` reads it), sorted;
    ``[]`` for an SQLite file that does not exist yet. Raises MksimError if the storage cannot be read."""
    url = storage_url(storage)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        return []
    return sorted(_study_names(url))


def _load_study(storage: str, study: str) -> Any:
    optuna = require("optuna", "explorer", "the Search page")
    url = storage_url(storage)
    names = _study_names(url)
    if study not in names:
        raise MksimError(f"no study {study!r} in {url}; studies there: {', '.join(names) or 'none'}")
    return optuna.load_study(study_name=study, storage=_storage(url))


def study_data(storage: str, study: str) -> dict[str, Any]:
    """A search study as plain data, read from its storage (a running study: what it holds so far).
    Keys: ``study storage problem objectives`` (``["latency"]`` or ``["latency", "smem"]``), ``counts`` (trials
    per state of ``TRIAL_STATES``), ``finished`` (complete and pruned: what ``trials`` counts), ``trials`` (one
    row per trial: ``number state latency_us smem_KiB params communication_us baseline mode reason``;
    ``communication_us`` ``None`` but in a study of a step split over GPUs), ``best`` (the complete
    trial of least latency, or ``None``), ``pareto`` (with two objectives, the numbers of the complete trials no
    other beats on both, by latency) and ``params`` (the parameters every complete megakernel trial chose, for
    the parallel coordinates). Raises :class:`mksim.errors.MksimError` if the storage or study cannot be opened.
    """
    st = _load_study(storage, study)
    problem = st.user_attrs.get("problem", {})
    objectives = list(problem.get("objectives") or (["latency", "smem"] if len(st.directions) > 1 else ["latency"]))
    rows = []
    for t in st.get_trials(deepcopy=False):
        reason = t.user_attrs.get("pruned_reason") or t.system_attrs.get("fail_reason")
        rows.append({"number": t.number, "state": t.state.name, "latency_us": t.user_attrs.get("latency_us"),
                     "smem_KiB": t.user_attrs.get("smem_KiB"), "params": dict(t.params),
                     "communication_us": t.user_attrs.get("communication_us"),
                     "baseline": t.user_attrs.get("baseline"),
                     "mode": t.params.get("mode", t.user_attrs.get("mode", "megakernel")),
                     "reason": str(reason).splitlines()[0] if reason else None})
    done = [r for r in rows if r["state"] == "COMPLETE" and r["latency_us"] is not None]
    counts = {s: sum(r["state"] == s for r in rows) for s in TRIAL_STATES}
    best = min(done, key=lambda r: (r["latency_us"], r["number"])) if done else None
    mk = [r for r in done if r["mode"] == "megakernel"]
    params = [p for p in mk[0]["params"] if all(p in r["params"] for r in mk)] if mk else []
    return {"study": study, "storage": storage_url(storage), "problem": problem, "objectives": objectives,
            "counts": counts, "finished": counts["COMPLETE"] + counts["PRUNED"], "trials": rows, "best": best,
            "pareto": pareto_front(done) if len(objectives) > 1 else [], "params": params}


def pareto_front(rows: list[dict[str, Any]]) -> list[int]:
    """Numbers of the rows no other row beats on both latency and shared memory (least latency first).
    >>> pareto_front([{"number": 0, "latency_us": 5, "smem_KiB": 64}, {"number": 1, "latency_us": 4,
    ...               "smem_KiB": 160}, {"number": 2, "latency_us": 6, "smem_KiB": 96}])
    [1, 0]
    """
    front, least = [], float("inf")
    for r in sorted(rows, key=lambda r: (r["latency_us"], r["smem_KiB"], r["number"])):
        if r["smem_KiB"] < least:
            front.append(r["number"])
            least = r["smem_KiB"]
    return front


def best_schedule_json(storage: str, study: str, trial: int | None = None) -> str:
    """The schedule file (JSON text) of a study's best trial, or of trial ``trial``: what ``mksim search
    --out`` writes. Raises :class:`mksim.errors.MksimError` if there is no such complete trial."""
    st = _load_study(storage, study)
    p = st.user_attrs.get("problem")
    if not p:
        raise MksimError(f"study {study!r} was not made by mksim search (it records no problem)")
    done = [t for t in st.get_trials(deepcopy=False) if t.state.name == "COMPLETE" and "latency_us" in t.user_attrs]
    if trial is not None:
        done = [t for t in done if t.number == trial]
    if not done:
        raise MksimError(f"study {study!r} has no complete trial" + (f" {trial}" if trial is not None else " yet"))
    best = min(done, key=lambda t: (t.user_attrs["latency_us"], t.number))
    model = p["model"]
    if isinstance(p.get("config"), dict):  # a study of a config (mksim search --model config.json) records it
        try:
            model = mksim.models.ModelConfig(**p["config"])
        except TypeError as exc:
            raise MksimError(f"study {study!r} records a model config this mksim cannot read: {exc}") from None
    problem = Problem(model=model, gpu=gpu_spec(p["gpu"]), batch=p["batch"], kv_len=p["kv_len"],
                      phase=p.get("phase", "decode"), fixed=p.get("fixed", {}), designs=tuple(p.get("designs", ())),
                      tp=p.get("tp", 1), ep=p.get("ep", 1))
    return build(candidate_from_params(best.params, problem.gpu, problem.fixed, problem.designs), problem).to_json()


# -- Compare: uploaded configs, per-op times, the roofline, hardware what-ifs -----------------
@lru_cache(maxsize=32)
def _compare_run(model: str, gpu: str, batch: int, kv_len: int, phase: str, config_json: str | None,
                 whatif: WhatIf, routing: str = "uniform", tp: int = 1, ep: int = 1) -> dict[str, Any]:
    t = Target.parse(gpu)
    target = Target(t.hardware, t.profile, whatif.apply(t.spec))
    spec = model if config_json is None else mksim.models.config_from_hf(json.loads(config_json), name=model)
    step = Step(spec, batch, kv_len, phase, tp=tp, routing=routing, ep=ep)
    d = compare(step, target).to_dict(detail=True)  # what `mksim compare` simulates
    d["model"] = model  # the name the user gave an uploaded config
    d["routing"] = routing
    d["tp"], d["ep"] = tp, ep  # the split the comparison is of (your stack is predicted on the same)
    return d


def compare_run(model: str, gpu: str, batch: int = 1, kv_len: int = 1024, phase: str = "decode", *,
                config: dict[str, Any] | None = None, whatif: WhatIf | None = None,
                routing: str | None = None, tp: Any = 1, ep: Any = 1) -> dict[str, Any]:
    """:func:`compare_data` for the explorer's pages, remembered per inputs, with more in it.
    ``config`` is a Hugging Face ``config.json`` (parsed; ``model`` is then its display name),
    ``whatif`` hardware overrides (:class:`WhatIf`), ``routing`` a mixture of experts' routing model
    (:func:`routing_for`: ``uniform``, ``zipf:S``; a dense model ignores it; ``d["routing"]`` is the one used),
    ``tp`` and ``ep`` the step split over GPUs (:func:`check_split`; each mode's row then has its
    ``communication_share`` and ``breakdown_us["communication"]``, as ``mksim compare --tp`` gives them).
    Besides :func:`compare_data`'s keys, each mode
    has ``op_time_us`` (each op's span, first task start to last task end, in the order of ``ops``),
    ``ops`` lists each op's ``op kind unit dtype flops bytes`` (bytes it must move: weights, KV cache,
    its output), ``roofs`` the GPU's ``hbm_spec_GBps hbm_reachable_GBps tensor_TFLOPs vector_TFLOPs`` and
    ``assumes`` what the prediction assumes (:func:`mksim.compare.assumptions`: hardware file, profile).
    ``gpu`` may name an implementation profile (``"h200+mksim"``).

    The last 32 comparisons are remembered (a comparison is deterministic), so asking again, or
    moving a what-if slider back, answers at once. Raises :class:`mksim.errors.MksimError` on bad input.
    """
    if config is None:
        check_model(model)
    elif not isinstance(config, dict) or not isinstance(model, str):
        raise MksimError("the uploaded config is gone; upload it again")
    check_gpu(gpu)
    if phase not in ("decode", "prefill"):
        raise MksimError("phase: choose decode or prefill")
    key = None if config is None else json.dumps(config, sort_keys=True)
    used = routing_for(model, routing, config)
    tp, ep = check_split(tp, ep)
    return copy.deepcopy(_compare_run(model, gpu, int(batch), int(kv_len), phase, key, whatif or WhatIf(), used,
                                      tp, ep))


#: An uploaded config or schedule larger than this is refused before it is decoded.
MAX_TEXT_UPLOAD_BYTES = 16 << 20


def upload_bytes(contents: object, name: str, limit: int = MAX_TEXT_UPLOAD_BYTES) -> bytes:
    """The bytes of a ``dcc.Upload``'s contents (a ``data:...;base64,...`` URL), refused in one line
    (MksimError, naming the file ``name``) when it is not such a URL or holds more than ``limit`` bytes."""
    if not isinstance(contents, str) or not contents.startswith("data:") or "," not in contents:
        raise MksimError(f"{name}: not an uploaded file (expected a data: URL); upload the file again")
    b64 = contents.split(",", 1)[1]
    if len(b64) // 4 * 3 > limit + 3:
        raise MksimError(f"{name}: larger than {limit >> 20} MiB; this is not a file the explorer reads")
    try:
        return base64.b64decode(b64, validate=True)
    except ValueError:
        raise MksimError(f"{name}: not a readable upload (bad base64); upload the file again") from None


def upload_name(filename: object, default: str) -> str:
    """An upload's file name as shown (only its last part, at most 100 characters); ``default`` if none."""
    if not isinstance(filename, str) or not filename.strip():
        return default
    return Path(filename.replace("\\", "/")).name[:100] or default


def parse_config_upload(contents: str, filename: str | None) -> dict[str, Any]:
    """An uploaded Hugging Face ``config.json`` (a ``data:...;base64,`` URL, as ``dcc.Upload`` gives it).
    Returns ``name`` (the file's stem, or the config's own name for a ``config.json``), ``config``
    (the parsed dict, to pass to :func:`compare_run`) and ``summary`` (one line). A file mksim cannot
    read raises :class:`mksim.errors.MksimError` with mksim's one-line message, naming the file.
    """
    fname = upload_name(filename, "config.json")
    raw = parse_json(upload_bytes(contents, fname), f"{fname}: not a readable JSON config", error=MksimError)
    if not isinstance(raw, dict):
        raise MksimError(f"{fname}: a config.json must hold a JSON object")
    stem = Path(fname).stem
    try:
        cfg = mksim.models.config_from_hf(raw, name=None if fname == "config.json" else stem)
    except MksimError as exc:  # its messages start with "config: " for a dict
        msg = str(exc)
        raise MksimError(f"{fname}: {msg.removeprefix('config: ')}") from None
    summary = (f"{cfg.name}: {cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
               f"{cfg.num_heads} heads ({cfg.num_kv_heads} KV), {cfg.param_count() / 1e9:.2f} B parameters")
    return {"name": cfg.name, "config": raw, "summary": summary}


def roofline_data(run: dict[str, Any], mode: str = "graph") -> dict[str, Any]:
    """Each op of a :func:`compare_run` on the roofline of its GPU, as simulated in ``mode``.
    ``points``: per op ``op kind unit intensity_flop_per_B attained_TFLOPs time_us`` with intensity
    = FLOPs / bytes it must move and attained = FLOPs / its span in ``mode`` (in a megakernel, ops
    overlap: a span is from its first task's start to its last task's end); ops without FLOPs or
    bytes are left out and counted in ``skipped``. ``roofs``: the GPU's ``hbm_spec_GBps
    hbm_reachable_GBps tensor_TFLOPs vector_TFLOPs`` and ``ridge_flop_per_B`` (the bf16 tensor
    peak over the spec bandwidth).
    """
    if mode not in run["modes"]:

        raise UnknownNameError("mode", mode, list(run["modes"]))
    times = run["modes"][mode]["op_time_us"]
    points, skipped = [], 0
    for op, t in zip(run["ops"], times, strict=True):
        if op["flops"] <= 0 or op["bytes"] <= 0 or t <= 0:
            skipped += 1
            continue
        points.append({"op": op["op"], "kind": op["kind"], "unit": op["unit"],
                       "intensity_flop_per_B": op["flops"] / op["bytes"],
                       "attained_TFLOPs": op["flops"] / (t * 1e-6) / 1e12, "time_us": t})
    roofs = dict(run["roofs"])
    roofs["ridge_flop_per_B"] = roofs["tensor_TFLOPs"]["bf16"] * 1e12 / (roofs["hbm_spec_GBps"] * 1e9)
    return {"mode": mode, "gpu": run["gpu"], "workload": run["workload"], "points": points, "skipped": skipped,
            "roofs": roofs}


def whatif_data(model: str, gpu: str, whatif: WhatIf, batch: int = 1, kv_len: int = 1024,
                phase: str = "decode") -> dict[str, Any]:
    """The comparison on ``gpu`` as specified (``base``) and with ``whatif`` applied (``whatif``), and
    the numbers the what-if changed (``changes``: ``key unit base new``)."""
    spec = gpu_spec(check_gpu(gpu))
    check_model(model)
    changes = whatif_changes(spec, whatif.apply(spec))
    return {"base": compare_run(model, gpu, batch, kv_len, phase),
            "whatif": compare_run(model, gpu, batch, kv_len, phase, whatif=whatif), "changes": changes}

"""The answer, published: what a megakernel would buy over the stacks users run.

    python -m validation stacks answer [--json validation/results/h200-stacks/answer.json] [--docs docs/stacks.md]

For five models x batch 1, 8, 64 (KV 1024) on the H200 (``h200-calibrated``), and as transfers on
the H100 and B200 (``h100``, ``b200``: the H200's profiles with their fixed costs scaled by the clock,
never measured there), mksim predicts

- the stacks: ``torch_graph`` (``<gpu>+torch``) and ``inductor_graph`` (``<gpu>+inductor``) in
  graph mode (their kernels in one CUDA graph);
- two megakernels: mksim's generated kernels (``<gpu>+mksim``) and the best kernels the chip
  allows (``<gpu>``, no profile), in megakernel mode with default options;

and the megakernel's speed-up over each stack, with the 90 % interval of
:func:`mksim.compare.speedup_interval` (none for the best kernels: never measured). Where both
sides ran on our H200 — the stack's whole step in ``validation/results/h200-stacks/run2`` and our
generated megakernel (default schedule) in ``validation/results/h200/summary.json`` or
``validation/results/evidence/h200-b8/`` at the same model, batch and KV — the measured speed-up
stands beside the predicted one. A case mksim refuses is shown as "—" with its one-line reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hwmodels
import mksim
from mksim.compare import interval_basis, latency_interval, parallel_map, speedup_interval, verdict
from mksim.errors import MksimError
from validation.stacks import records
from validation.stacks.predict import load_steps

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "mistral-7b", "qwen3-8b")
BATCHES = (1, 8, 64)
KV_LEN = 1024
GPUS = ("h200-calibrated", "h100", "b200")
MEASURED_ON = "h200-calibrated"
STACKS = (("torch_graph", "torch"), ("inductor_graph", "inductor"))
# (column, profile): None is the chip's best kernels
MEGAKERNELS: tuple[tuple[str, str | None], ...] = (("mksim", "mksim"), ("best", None))
RUN = "validation/results/h200-stacks/run2"
# the validation suite (batch 1, 4 and 8); an earlier batch-8 run of older
# kernels (validation/results/evidence/h200-b8) no longer stands for mksim's megakernel
MK_MEASURED = ("validation/results/h200/summary.json",)
START, END = "<!-- stacks-answer:start -->", "<!-- stacks-answer:end -->"
JSON = "validation/results/h200-stacks/answer.json"


def predict_one(job: tuple[str, int, str, str | None, str]) -> dict[str, Any]:
    """``(model, batch, gpu, profile, mode)`` simulated: ``{"us", "interval_us", "basis"}`` or
    ``{"refused": reason}`` (mksim's one-line error)."""
    model, batch, gpu, profile, mode = job
    try:
        g = hwmodels.load(gpu, profile=profile)
        wl = mksim.models.workload(model, batch=batch, kv_len=KV_LEN, n_sms=g.sm.count)
        us = float(mksim.simulate(mksim.build_schedule(wl, g, mode), timeline=False).latency_us)
    except MksimError as e:
        return {"refused": str(e).splitlines()[0]}
    # the best kernels the chip allows (no profile) are a bound, not a prediction of a measured step: the answer
    # gives them no interval (mksim compare carries the datasheet's over to them, and says so)
    basis = interval_basis(g) if profile else {"half_width_pct": None, "transfer": False}
    return {"us": round(us, 1), "interval_us": latency_interval(us, basis["half_width_pct"]),
            "half_width_pct": basis["half_width_pct"], "transfer": basis["transfer"]}


def measured(root: Path = ROOT) -> tuple[dict[tuple[str, str, int, int], float], dict[tuple[str, int, int], float]]:
    """The measured steps of the stacks ``{(stack, model, batch, kv): µs}`` and of our generated
    megakernel, default schedule ``{(model, batch, kv): µs}``, on our H200."""
    stacks = {(s.stack, s.model, s.batch, s.kv_len): s.median_us for s in load_steps(root / RUN)}
    mk: dict[tuple[str, int, int], float] = {}
    suite = json.loads((root / MK_MEASURED[0]).read_text())
    for c in suite["cases"]:
        if c["mode"] == "megakernel" and c["schedule"] == "default" and c.get("measured_us"):
            mk[(c["model"], int(c["batch"]), int(c["kv_len"]))] = float(c["measured_us"])
    return stacks, mk


def answer(root: Path = ROOT, gpus: tuple[str, ...] = GPUS, models: tuple[str, ...] = MODELS,
           batches: tuple[int, ...] = BATCHES) -> dict[str, Any]:
    """Every case predicted (and measured where it was): the data behind docs/stacks.md's table."""
    jobs: list[tuple[str, int, str, str | None, str]] = []
    for gpu in gpus:
        for m in models:
            for b in batches:
                jobs += [(m, b, gpu, prof, "graph") for _, prof in STACKS]
                jobs += [(m, b, gpu, prof, "megakernel") for _, prof in MEGAKERNELS]
    done = dict(zip(jobs, parallel_map(predict_one, jobs), strict=True))
    stacks_meas, mk_meas = measured(root)
    rows = []
    for gpu in gpus:
        for m in models:
            for b in batches:
                row: dict[str, Any] = {"gpu": gpu, "model": m, "batch": b, "kv_len": KV_LEN}
                for stack, sprof in STACKS:
                    row[stack] = done[(m, b, gpu, sprof, "graph")]
                for col, mprof in MEGAKERNELS:
                    mk = done[(m, b, gpu, mprof, "megakernel")]
                    row[f"megakernel_{col}"] = mk
                    for stack, _ in STACKS:
                        st = row[stack]
                        if "us" not in st or "us" not in mk:
                            continue
                        s = st["us"] / mk["us"]
                        iv = speedup_interval(st["interval_us"], mk["interval_us"])
                        row[f"speedup_{col}_vs_{stack}"] = {"x": round(s, 2), "interval": iv,
                                                            "verdict": verdict(s, iv)}
                if gpu == MEASURED_ON:
                    got = mk_meas.get((m, b, KV_LEN))
                    for stack, _ in STACKS:
                        st_us = stacks_meas.get((stack, m, b, KV_LEN))
                        if got and st_us:
                            row[f"measured_vs_{stack}"] = {"x": round(st_us / got, 2), "stack_us": st_us,
                                                           "megakernel_us": round(got, 1)}
                rows.append(row)
    return {"command": f"python -m validation stacks answer --json {JSON} --docs docs/stacks.md",
            "kv_len": KV_LEN, "measured_on": MEASURED_ON, "gpus": list(gpus), "models": list(models),
            "batches": list(batches), "measured_from": [RUN, *MK_MEASURED],
            "interval": "90 %: each latency / (1 ± the p90 |error| of its profile's validation record); "
                        "a speed-up from the two latencies' far ends; on a GPU the profile was not measured on "
                        "twice as wide (a transfer, unvalidated); none for the best kernels (no profile, never "
                        "measured)",
            "rows": rows}


def to_json(a: dict[str, Any]) -> str:
    """:func:`answer`'s result as JSON text, a row a line (small and easy to diff)."""
    head = {k: v for k, v in a.items() if k != "rows"}
    rows = ",\n  ".join(json.dumps(r, separators=(",", ":")) for r in a["rows"])
    return json.dumps(head, indent=1)[:-2] + f',\n "rows": [\n  {rows}\n ]\n}}\n'


def _cell(sp: dict[str, Any] | None) -> str:
    if sp is None:
        return "—"
    iv = sp["interval"]
    if iv is None:
        return f"{sp['x']:.2f}×"
    hi = "∞" if iv[1] is None else f"{iv[1]:.2f}"
    tie = " tie" if sp["verdict"] == "tie" else ""
    return f"{sp['x']:.2f}× ({iv[0]:.2f}-{hi}){tie}"


def _us(p: dict[str, Any]) -> str:
    return f"{p['us']:.0f}" if "us" in p else "—"


def table(a: dict[str, Any], gpu: str) -> str:
    """One GPU's rows as a Markdown table, then the refusals with their reasons."""
    transfer = "" if gpu == a["measured_on"] else " (transfer of the H200 profiles, unvalidated)"
    lines = [f"**{gpu}**{transfer}, KV {a['kv_len']}:", "",
             "| model | B | torch µs | inductor µs | megakernel µs, mksim's kernels | × torch | × inductor | "
             "measured × torch / × inductor | megakernel µs, best kernels | × torch | × inductor |",
             "|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|"]
    refused = []
    for r in (r for r in a["rows"] if r["gpu"] == gpu):
        meas = " / ".join(f"{r[k]['x']:.2f}×" if k in r else "—"
                          for k in ("measured_vs_torch_graph", "measured_vs_inductor_graph"))
        if meas == "— / —":
            meas = ""
        lines.append(f"| {r['model']} | {r['batch']} | {_us(r['torch_graph'])} | {_us(r['inductor_graph'])} | "
                     f"{_us(r['megakernel_mksim'])} | {_cell(r.get('speedup_mksim_vs_torch_graph'))} | "
                     f"{_cell(r.get('speedup_mksim_vs_inductor_graph'))} | {meas} | {_us(r['megakernel_best'])} | "
                     f"{_cell(r.get('speedup_best_vs_torch_graph'))} | "
                     f"{_cell(r.get('speedup_best_vs_inductor_graph'))} |")
        for k in ("torch_graph", "inductor_graph", "megakernel_mksim", "megakernel_best"):
            if "refused" in r[k]:
                refused.append(f"- — {r['model']} B{r['batch']} {k}: {r[k]['refused']}")
    return "\n".join(lines + ([""] + refused if refused else []))


def tables(a: dict[str, Any]) -> str:
    """Every GPU's table."""
    return "\n\n".join(table(a, g) for g in a["gpus"])


def check_markers(path: Path) -> str:
    """``path``'s text; raises :class:`mksim.errors.MksimError` where the tables' markers are missing."""
    text = path.read_text()
    for start, end in ((START, END), (records.DOCS_START, records.DOCS_END)):
        if start not in text or end not in text:
            raise MksimError(f"{path}: markers {start} ... {end} missing")
    return text


def update_docs(path: Path, a: dict[str, Any]) -> None:
    """Rewrite the generated table of ``path`` between its markers (which must be there)."""
    text = check_markers(path)
    for (start, end), body in {(START, END): tables(a),
                               (records.DOCS_START, records.DOCS_END): records.table_rows(records.records())}.items():
        i, j = text.index(start), text.index(end)
        text = text[:i] + f"{start}\n{body}\n" + text[j:]
    path.write_text(text)

"""Each implementation profile's validation record: how its predictions held against measurements.

    python -m validation stacks records [--check]

writes the ``[validation]`` table at the end of each profile (``hwmodels/profiles/<name>.toml``) from
the committed summaries, never by hand (``--check`` only says whether they are current):

- ``torch``, ``inductor``: the whole steps of their stack in ``validation/results/h200-stacks/summary.json``
  (the profiles were fitted to single ops only); held out: the steps of models never used to fit;
- ``mksim``: the whole megakernel steps of today's kernels (tensor-core attention, no division on
  the matmul's per-page path) in ``validation/results/h200-mk-steps-fd/predicted.json``; held out:
  llama-3.2-3b, a model the single ops never ran;
- ``mksim-fd0``: the same steps of session 8's kernels (MK_MM_FASTDIV=0) in
  ``validation/results/h200-mk-steps/predicted.json``;
- ``mksim-attn1``: the whole steps of the suite of session 7, run on the kernels this profile
  describes, in ``validation/results/h200-suite7/summary.json`` (every mode; predicted with
  ``h200-mk-kernels`` as it then was, which is this profile);
- ``mksim-mm1``: the chains of our kernels of commit 5a201e2 in
  ``validation/results/h200-mechanisms/summary.json`` (fitted to single kernels, never to chains);
- ``cublas``: the chains of cuBLAS kernels in ``validation/results/h200-mechanisms/summary.json``.

A record may hold a sub-table per family of modes (``[validation.chain]``: stream, graph, graph_pdl;
``[validation.persistent]``: persistent_barrier and the megakernel's schedules), which
``mksim.compare.interval_basis`` takes for that family's rows:

- ``mksim``: the validation suite on our H200 (``validation/results/h200/summary.json``: 40 whole
  steps of llama-3.2-1b and llama-3.1-8b in every mode, predicted with ``h200-mk-kernels``, today's
  ``h200``); the profile was fitted to single ops only (``validation.kernel_costs`` reads a run's
  ``single_ops`` and nothing else), so no step of the suite was used to fit. Held out: the same run's
  llama-3.2-3b steps (``validation/results/h200-heldout``), inside each family's p90;
- the hardware file ``h200-datasheet`` (no profile: the datasheet's numbers alone): the same 40 steps
  predicted with it (``validation/results/h200-datasheet/summary.json``): how far a GPU described by
  its datasheet alone is from what it measures. ``mksim.compare`` states it as the interval of every
  GPU never measured (``datasheet, unvalidated``).

An error is (predicted - measured) / measured in %. ``p90_abs_pct`` is the 90th percentile of |error|
by nearest rank (the ceil(0.9 n)-th smallest): the half-width of mksim's 90 % intervals
(``mksim.compare.interval_basis``). ``held_out_inside_pct`` is the share of the held-out cases whose
|error| is within the p90 of the other cases: the coverage of that interval on cases it never saw.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hwmodels

ROOT = Path(__file__).resolve().parents[2]
STACKS_SUMMARY = "validation/results/h200-stacks/summary.json"
SUITE_SUMMARY = "validation/results/h200-suite7/summary.json"  # the suite that ran mksim-attn1's kernels
CHAINS_SUMMARY = "validation/results/h200-mechanisms/summary.json"
# the megakernel steps of each version of our kernels: {profile: (folder, the kernel in words)}; each
# folder's README.md says the day they ran (2026-12-01 both)
MK_STEPS = {"mksim": ("validation/results/h200-mk-steps-fd", "the tensor-core attention and no division on the "
                      "matmul's per-page path"),
            "mksim-fd0": ("validation/results/h200-mk-steps", "the tensor-core attention (session 8, "
                          "MK_MM_FASTDIV=0)")}
MK_STEPS_DATE = "2026-12-01"
MK_FIT_MODELS = ("llama-3.2-1b", "llama-3.1-8b")  # the models whose single ops the mksim profile was fitted to
DENSE_SUITE = "validation/results/h200/summary.json"  # the suite on our H200, predicted with h200-mk-kernels
HELDOUT_SUITE = "validation/results/h200-heldout/summary.json"  # the same run's llama-3.2-3b steps
DATASHEET_SUITE = "validation/results/h200-datasheet/summary.json"  # those 40 steps predicted with h200-datasheet
DATASHEET = "h200-datasheet"
#: the mode families of a record's sub-tables (hwmodels.VALIDATION_FAMILIES), by mode
CHAIN_MODES = ("stream", "graph", "graph_pdl")
#: how the transformers stacks' profiles were fitted, without and with hf_host.py's rounds (the summary's ``hf_host``)
HF_FIT_WORDS = {False: "was fitted to single ops only (single modules of transformers' models)",
                True: "was fitted to single modules of transformers' models and, for the host's costs, to the modules "
                      "and small models of hf_host.py's rounds, never to a whole step"}
MARKER = "# -- validation record (written by python -m validation stacks records; do not edit by hand)"
GPU = "h200-calibrated"


def p90_abs(errors: Sequence[float]) -> float:
    """The 90th percentile of |error| by nearest rank: the ceil(0.9 n)-th smallest.

    >>> p90_abs([1, -2, 3, 4, 5, 6, 7, 8, 9, -10])
    9.0
    """
    a = sorted(abs(e) for e in errors)
    return float(a[max(0, math.ceil(0.9 * len(a)) - 1)])


def stats(errors: Sequence[float]) -> dict[str, Any]:
    """``cases``, ``mape_pct``, ``bias_pct`` (mean signed error), ``p90_abs_pct``, ``max_abs_pct``."""
    n = len(errors)
    return {"cases": n, "mape_pct": round(sum(abs(e) for e in errors) / n, 2),
            "bias_pct": round(sum(errors) / n, 2), "p90_abs_pct": round(p90_abs(errors), 2),
            "max_abs_pct": round(max(abs(e) for e in errors), 2)}


def inside_pct(held: Sequence[float], others: Sequence[float]) -> float:
    """The share (%) of ``held`` errors within the p90 |error| of ``others``."""
    h = p90_abs(others)
    return round(100.0 * sum(1 for e in held if abs(e) <= h) / len(held), 1)


def _load(root: Path, rel: str) -> Any:
    return json.loads((root / rel).read_text())


def family_of(mode: str) -> str:
    """``"chain"`` for a chain mode, ``"persistent"`` for the others (the megakernel's schedules too)."""
    return "chain" if mode in CHAIN_MODES else "persistent"


def _suite_errors(summary: dict[str, Any]) -> dict[str, list[float]]:
    """A suite summary's signed errors (%) by family, over the cases predicted and measured."""
    out: dict[str, list[float]] = {"chain": [], "persistent": []}
    for c in summary["cases"]:
        if c.get("error_pct") is not None and not c.get("error"):
            out[family_of(c["mode"])].append(float(c["error_pct"]))
    return out


def _families(src: str, errs: dict[str, list[float]], held: dict[str, list[float]] | None,
              what: str) -> dict[str, dict[str, Any]]:
    out = {}
    for fam, e in errs.items():
        modes = ("the chain modes (stream, graph, graph_pdl)" if fam == "chain" else
                 "the persistent modes (persistent_barrier, the megakernel's schedules)")
        rec = {**stats(e), "source": src, "what": f"{modes} of {what}"}
        if held and held.get(fam):
            rec.update(held_out=f"the same run's steps of llama-3.2-3b ({HELDOUT_SUITE}), a model never fitted, "
                                "inside this family's p90",
                       held_out_cases=len(held[fam]), held_out_inside_pct=inside_pct(held[fam], e))
        out[fam] = rec
    return out


def hardware_records(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """``{hardware file: its [validation] table}``: the datasheet H200's predictions (no profile) against
    the suite's measured steps."""
    ds = _load(root, DATASHEET_SUITE)
    errs = _suite_errors(ds)
    every = errs["chain"] + errs["persistent"]
    what = ("whole decode steps of the validation suite on our H200 (llama-3.2-1b, llama-3.1-8b; batch 1/4/8, kv "
            "1024; mksim's generated kernels), predicted with the datasheet's numbers alone and no implementation "
            "profile")
    rec = {**stats(every), "gpu": GPU, "date": str(ds["date"])[:10], "what": what, "source": DATASHEET_SUITE,
           "command": f"mksim validate report validation/results/h200 --gpu {DATASHEET} --out "
                      f"{DATASHEET_SUITE.rsplit('/', 1)[0]}",
           **_families(DATASHEET_SUITE, errs, None, "the same steps, predicted with the datasheet's numbers alone")}
    return {DATASHEET: rec}


def records(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """``{profile: its [validation] table}`` from the committed summaries under ``root``."""
    out: dict[str, dict[str, Any]] = {}
    st = _load(root, STACKS_SUMMARY)
    for stack, prof in (("torch_graph", "torch"), ("inductor_graph", "inductor"), ("hf", "hf"),
                        ("hf_compiled", "hf-compiled")):
        cases = [c for c in st["cases"] if c["stack"] == stack]
        if not cases:
            continue
        held_names = sorted({c["model"] for c in cases if c["held_out"]})
        errs = [float(c["error_pct"]) for c in cases]
        held = [float(c["error_pct"]) for c in cases if c["held_out"]]
        fitted = [float(c["error_pct"]) for c in cases if not c["held_out"]]
        ours = stack in ("torch_graph", "inductor_graph")
        out[prof] = {**stats(errs), "gpu": GPU, "date": st["date"] if ours else st.get("hf_date") or st["date"],
                     "what": f"whole decode steps of {stack} ({len({c['model'] for c in cases})} models, batch "
                             f"{'/'.join(str(b) for b in sorted({c['batch'] for c in cases}))}, kv "
                             f"{'/'.join(str(k) for k in sorted({c['kv_len'] for c in cases}))}); the profile "
                             + ("was fitted to single ops only" if ours else HF_FIT_WORDS[bool(st.get("hf_host"))]),
                     "source": STACKS_SUMMARY,
                     "command": st["command"].replace("SUMMARY", STACKS_SUMMARY),
                     "held_out": f"the steps of {', '.join(held_names)} (never used to fit), inside "
                                 "the p90 of the fitted models' steps",
                     "held_out_cases": len(held), "held_out_inside_pct": inside_pct(held, fitted)}
    suite = _load(root, SUITE_SUMMARY)
    chains = _load(root, CHAINS_SUMMARY)
    steps = [float(c["error_pct"]) for c in suite["cases"] if c.get("error_pct") is not None]
    mk_chains = [float(c["error_pct"]) for c in chains["cases"] if c["implementation"] == "mksim"]
    for prof, (folder, kernel) in MK_STEPS.items():
        src = f"{folder}/predicted.json"
        mk = _load(root, src)  # a row per step
        held_rows = [r for r in mk if r["model"] not in MK_FIT_MODELS]
        held_models = {r["model"] for r in held_rows}
        mk_all = [float(r["error_pct"]) for r in mk]
        mk_held = [float(r["error_pct"]) for r in held_rows]
        mk_fit = [float(r["error_pct"]) for r in mk if r["model"] not in held_models]
        gpu_arg = "" if prof == "mksim" else f" --gpu {GPU}+{prof}"
        out[prof] = {**stats(mk_all), "gpu": GPU, "date": MK_STEPS_DATE,
                     "what": f"whole megakernel steps of our generated kernels with {kernel} "
                             f"({', '.join(sorted({r['model'] for r in mk}))}; batch "
                             f"{'/'.join(str(b) for b in sorted({r['batch'] for r in mk}))}, kv 1024, fused "
                             f"epilogues), predicted with {GPU}+{prof}",
                     "source": src,
                     "command": f"python -m validation megakernel-predict {folder}/llama-*.json{gpu_arg} --json {src}",
                     "held_out": f"the steps of models never used to fit ({', '.join(sorted(held_models))}), "
                                 "inside the p90 of the fitted models' steps",
                     "held_out_cases": len(mk_held), "held_out_inside_pct": inside_pct(mk_held, mk_fit)}
    dense = _load(root, DENSE_SUITE)
    out["mksim"].update(_families(DENSE_SUITE, _suite_errors(dense), _suite_errors(_load(root, HELDOUT_SUITE)),
                                  "the validation suite's whole steps on our H200 (llama-3.2-1b, llama-3.1-8b; batch "
                                  f"1/4/8, kv 1024), predicted with {dense['predicted_with']} (this profile on "
                                  f"{GPU}); the profile was fitted to single ops only"))
    out["mksim-attn1"] = {**stats(steps), "gpu": GPU, "date": str(suite["date"])[:10],
                          "what": "whole decode steps of our generated kernels in every mode (llama-3.2-1b, "
                                  "llama-3.1-8b at batch 1, 4 and 8, kv 1024), predicted with "
                                  f"{suite['predicted_with']} as it then was (this profile)",
                          "source": SUITE_SUMMARY,
                          "command": "git show fe37d15:validation/results/h200/measured.json > DIR/measured.json; "
                                     "mksim validate report DIR --gpu h200-calibrated+mksim-attn1"}
    # the chains ran the kernels of an earlier commit: they validate that kernel's profile, not today's
    out["mksim-mm1"] = {**stats(mk_chains), "gpu": GPU, "date": str(chains["raw_date"])[:10],
                        "what": "chains of LLM projections as our generated kernels of commit "
                                f"{str(chains['raw_commit'])[:7]} (MK_MM=1) in every mode; the profile was "
                                "fitted to single kernels, never to chains",
                        "source": CHAINS_SUMMARY,
                        "command": chains["command"].replace("<this file>", CHAINS_SUMMARY)}
    cb = [float(c["error_pct"]) for c in chains["cases"] if c["implementation"] == "cublas"]
    out["cublas"] = {**stats(cb), "gpu": GPU, "date": str(chains["raw_date"])[:10],
                     "what": "chains of LLM projections as cuBLAS kernels (torch F.linear) in every chain mode; "
                             "the profile was fitted to single kernels, never to chains",
                     "source": CHAINS_SUMMARY, "command": chains["command"].replace("<this file>", CHAINS_SUMMARY)}
    return out


def toml_block(rec: dict[str, Any]) -> str:
    """The ``[validation]`` table's text, after :data:`MARKER`."""
    lines = [MARKER, "[validation]"]
    subs = {k: v for k, v in rec.items() if isinstance(v, dict)}
    for k, v in rec.items():
        if k not in subs:
            lines.append(f"{k} = {json.dumps(v) if isinstance(v, str) else v}")
    for name, sub in subs.items():
        lines.append(f"\n[validation.{name}]")
        lines += [f"{k} = {json.dumps(v) if isinstance(v, str) else v}" for k, v in sub.items()]
    return "\n".join(lines) + "\n"


def without_record(text: str) -> str:
    """A profile file's text without its validation record (what the fit writes)."""
    return text.split("\n" + MARKER + "\n", 1)[0]  # with_record puts a blank line before the marker


def with_record(text: str, rec: dict[str, Any]) -> str:
    """A profile file's text with ``rec`` as its validation record, at the end (replacing an old one)."""
    base = without_record(text).rstrip("\n") + "\n"
    return base + "\n" + toml_block(rec)


def write(root: Path = ROOT, check: bool = False) -> list[str]:
    """Write (or, with ``check``, only compare) each profile's record; returns the profiles that were
    (or would be) changed."""
    changed = []
    files = [(prof, rec,
              hwmodels.resolve_profile(prof) if root == ROOT else root / "hwmodels/profiles" / f"{prof}.toml")
             for prof, rec in records(root).items()]
    files += [(gpu, rec, hwmodels.resolve(gpu) if root == ROOT else root / "hwmodels/data" / f"{gpu}.toml")
              for gpu, rec in hardware_records(root).items()]
    for prof, rec, path in files:
        text = path.read_text()
        new = with_record(text, rec)
        if new != text:
            changed.append(prof)
            if not check:
                path.write_text(new)
    return changed


DOCS_START, DOCS_END = "<!-- stacks-records:start -->", "<!-- stacks-records:end -->"


def table_rows(recs: dict[str, dict[str, Any]]) -> str:
    """The profiles' records as docs/stacks.md's table ("How sure we are")."""
    rows = ["| profile | measured cases | MAPE | bias | p90 \\|error\\| | max \\|error\\| | held-out coverage |",
            "|---|---|---|---|---|---|---|"]
    for prof, r in sorted(recs.items()):
        cover = (f"{r['held_out_inside_pct']:.0f} % of {r['held_out_cases']}" if "held_out_cases" in r else "—")
        rows.append(f"| {prof} | {r['cases']} ({r['what'].split(';')[0].split(' (')[0]}; `{r['source']}`) | "
                    f"{r['mape_pct']:.1f} % | {r['bias_pct']:+.1f} % | {r['p90_abs_pct']:.1f} % | "
                    f"{r['max_abs_pct']:.1f} % | {cover} |")
    return "\n".join(rows)

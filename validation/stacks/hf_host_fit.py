"""The transformers stacks' host costs fitted to the fit part of an ``hf_host.py`` run, and its whole steps
written out for the check. The rules, fixed before any such run was made:

- **Only the fit part is fitted**: the single modules and the small models (1, 2, 4 layers eager; 1, 2, 4,
  8 layers compiled) of the fitted models (``fit_models`` of the raw file). The whole steps (of every model,
  the fitted ones too) are never read by a fit: :func:`extract_steps` writes them as ``step-*.json`` for
  ``predict.py``, which holds the profile's predictions against them.
- **Each number is the median over the rounds** of a round's value (a module's median of its calls), so
  a slow stretch of the host weighs on the fit as it weighs on the steps measured in the same rounds.
- ``hf`` (eager): each op kind's host time from the modules as ``hf_fit.eager_host`` splits them
  (:func:`hf_fit.kinds_of`), then scaled by one factor so that a layer's ops add up to what a layer costs
  **inside a model**: the slope of the small models' forward time over their layers (least squares over
  1, 2, 4 layers), the mean over the fitted cases of slope / the layer's kinds summed. ``host_step_us``:
  the small models' intercept (their forward less their layers) less what mksim charges outside the
  layers (the final norm and the LM head as ``rmsnorm`` and ``matmul``, the embedding), the mean over the
  cases. ``host_qk_norm_us``: two norm module calls (Qwen3's q and k norms, which a Llama layer does not
  make), the mean of the two norm modules' times, scaled as the kinds are.
- ``hf-compiled``: the host's part before the graph's launch (``pre_us``, measured directly at the
  replay) of the compiled small models, least squares over their layers at every batch: the intercept is
  ``host_step_us``, the slope the host's part per layer, spread over mksim's ops of a layer
  (``hf_fit.LAYER_KINDS``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from validation.stacks import fit

RAW_GLOB = "hf-host-*.json"
SMALL = "model"   # the eager small models' keys: model1, model2, model4


#: the part of a run each stack's fit reads
STACK_PART = {"hf": "eager", "hf_compiled": "compiled"}


def raw_files(folder: Path) -> list[Path]:
    """The runs of ``folder``, oldest first (by the date each run wrote, then by name)."""
    files = list(folder.glob(RAW_GLOB))
    if not files:
        raise fit.FitError(f"{folder}: no {RAW_GLOB} files (hf_host.py's runs)")
    return sorted(files, key=lambda f: (str(json.loads(f.read_text()).get("env", {}).get("date_utc", "")), f.name))


def holds(raw: dict[str, Any], part: str) -> bool:
    """Whether a run holds the fit part of ``part`` (``"eager"``: rounds of the single modules;
    ``"compiled"``: a compiled small model with a call measured in its rounds)."""
    if part == "eager":
        e = raw.get("eager", {})
        return bool(e.get("rounds")) and any(any(v for v in m.values()) for m in e.get("modules", {}).values())
    if part == "compiled":
        calls = raw.get("compiled", {}).get("calls", {})
        return any(c.get("kind") == "small" and any(calls.get(k, [])) for k, c in raw.get("compiled_cases", {}).items())
    raise ValueError(f"part must be one of {', '.join(STACK_PART.values())}, not {part!r}")


def newest(folder: Path, part: str) -> tuple[Path, dict[str, Any]]:
    """The newest run of ``folder`` that holds ``part`` (:func:`holds`), and its contents."""
    for f in reversed(raw_files(folder)):
        raw = json.loads(f.read_text())
        if holds(raw, part):
            return f, raw
    raise fit.FitError(f"{folder}: no {RAW_GLOB} run holds the {part} part (hf_host.py's fit rounds)")


def _med(xs: list[float]) -> float:
    return float(statistics.median(xs))


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x``: (a, b)."""
    (a, b), *_ = np.linalg.lstsq(np.array([[1.0, x] for x in xs]), np.array(ys), rcond=None)
    return float(a), float(b)


def kinds_of(h: dict[str, float]) -> dict[str, float]:
    """mksim's op kinds' host times (µs) from a case's module times ``h`` (``hf_fit.eager_host``'s split):
    the two norms each with half of what the decoder layer spends beyond its four modules; a quarter of the
    seven projections (mksim has four matmul ops a layer); RoPE and the cache's update; the attention module
    less its projections, RoPE and cache update; the MLP module less its projections; the embedding."""
    proj = h["q"] + h["k"] + h["v"] + h["o"]
    rest = h["layer"] - h["attn_norm"] - h["attn"] - h["mlp_norm"] - h["mlp"]
    rope_kv = h["rope"] + h["cache_update"]
    return {"rmsnorm": (h["attn_norm"] + h["mlp_norm"]) / 2 + rest / 2,
            "matmul": (proj + h["gate"] + h["up"] + h["down"]) / 4,
            "rope_kv": rope_kv, "attn_partial": max(h["attn"] - proj - rope_kv, 0.0),
            "silu_mul": max(h["mlp"] - h["gate"] - h["up"] - h["down"], 0.0), "embed": h["embed"]}


#: mksim's ops of a dense layer by kind, with a host time from the modules (attn_reduce: none, the eager
#: stack's attention is one kernel)
EAGER_LAYER = {"rmsnorm": 2, "matmul": 4, "rope_kv": 1, "attn_partial": 1, "silu_mul": 1}


def eager_fit(raw: dict[str, Any]) -> dict[str, Any]:
    """The eager profile's host numbers from the fit part of one raw file (module docstring)."""
    mods = raw["eager"]["modules"]
    factors, steps, qk, notes = [], [], [], []
    per: dict[str, list[float]] = {}
    for case, series in sorted(mods.items()):
        h = {k: _med(v) for k, v in series.items() if v}
        kinds = kinds_of(h)
        layer_sum = sum(n * kinds[k] for k, n in EAGER_LAYER.items())
        small = sorted((int(k[len(SMALL):]), v) for k, v in h.items()
                       if k.startswith(SMALL) and k[len(SMALL):].isdigit())
        if len(small) < 2:
            raise fit.FitError(f"{case}: fewer than two small models (model1, model2, ...) in the raw file")
        icpt, slope = _line([n for n, _ in small], [v for _, v in small])
        f = slope / layer_sum
        factors.append(f)
        for k, v in kinds.items():
            per.setdefault(k, []).append(v)
        steps.append((case, icpt, kinds))
        qk.append(h["attn_norm"] + h["mlp_norm"])
        notes.append(f"{case} {slope:.0f} / {layer_sum:.0f}")
    scale = float(np.mean(factors))
    host = {k: round(float(np.mean(v)) * scale, 2) for k, v in per.items()}
    step = float(np.mean([icpt - host["rmsnorm"] - host["matmul"] - host["embed"] for _, icpt, _ in steps]))
    return {"per_kind": host, "host_step_us": round(step, 1), "host_qk_norm_us": round(float(np.mean(qk)) * scale, 1),
            "scale": round(scale, 4),
            "note": f"{len(mods)} cases ({', '.join(sorted(mods))}), {len(raw['eager']['rounds'])} rounds: each "
                    "module's median over the rounds, split into mksim's kinds, times "
                    f"{scale:.3f} (a layer inside a model, the small models' slope over 1-2-4 layers, over the "
                    f"layer's kinds summed: {', '.join(notes)} us)"}


def compiled_fit(raw: dict[str, Any]) -> dict[str, Any]:
    """The compiled profile's host numbers from the compiled small models of one raw file."""
    cases = raw.get("compiled_cases", {})
    calls = raw.get("compiled", {}).get("calls", {})
    pts = []
    for key, c in sorted(cases.items()):
        if c["kind"] != "small":
            continue
        pre = [x["pre_us"] for x in calls.get(key, []) if x]
        if pre:
            pts.append((key, int(c["layers"]), _med(pre)))
    if len({n for _, n, _ in pts}) < 2:
        raise fit.FitError("fewer than two layer counts of compiled small models with a measured pre_us")
    a, b = _line([n for _, n, _ in pts], [v for _, _, v in pts])
    return {"host_step_us": round(a, 1), "per_layer_us": round(b, 2),
            "note": f"the host's part before the graph's launch (CUDA event before the call to one before the "
                    f"replay, median over the rounds) of {len(pts)} compiled small models ("
                    + ", ".join(f"{k} {v:.0f}" for k, _, v in pts) + f" us): least squares {a:.1f} + {b:.2f} us "
                    "x layers"}


def _stats(xs: list[float]) -> dict[str, float]:
    ys = sorted(xs)

    def q(p: float) -> float:
        k = (len(ys) - 1) * p
        lo, hi = int(np.floor(k)), int(np.ceil(k))
        return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)
    return {"median": round(q(0.5), 2), "p10": round(q(0.1), 2), "p90": round(q(0.9), 2), "min": round(ys[0], 2),
            "n": len(ys)}


def extract_steps(raw_path: Path, dest: Path, counts: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """``step-<stack>-<case>.json`` (``hf.py``'s record, read by ``predict.load_hf_steps``) of every whole
    step of a raw file, with each round's time (``rounds_us``) for the interval. ``counts``: the eager
    steps' kernels by case (:func:`eager_counts`), else the file's own. Returns the names."""
    raw = json.loads(raw_path.read_text())
    kv = int(raw["kv_len"])
    counts = raw.get("eager_kernels", {}) if counts is None else counts
    names = []
    rows: list[tuple[str, str, list[float], dict[str, Any]]] = []
    for case, xs in raw.get("eager", {}).get("steps", {}).items():
        c = counts.get(case, {})
        rows.append(("hf", case, [x["step_us"] for x in xs],
                     {"kernels_per_step": c.get("kernels", 0), "gpu_busy_us_one_step": c.get("gpu_busy_us", 0.0),
                      "kernels_source": c.get("source", raw_path.name) if c else None,
                      "host_us": _stats([x["host_us"] for x in xs])}))
    for key, c in raw.get("compiled_cases", {}).items():
        if c["kind"] != "whole":
            continue
        xs = [x for x in raw.get("compiled", {}).get("calls", {}).get(key, []) if x]
        if xs:
            rows.append(("hf_compiled", key, [x["step_us"] for x in xs],
                         {"kernels_per_step": c.get("kernels", 0), "gpu_busy_us_one_step": c.get("gpu_busy_us", 0.0),
                          "pre_us": _stats([x["pre_us"] for x in xs]),
                          "graph_us": _stats([x["graph_us"] for x in xs])}))
    for stack, case, xs, extra in rows:
        model, rest = case.rsplit("-b", 1)
        batch = int(rest.split("-")[0])
        rec = {"stack": stack, "model": model, "batch": batch, "kv_len": kv, "step_us": _stats(xs),
               "rounds_us": xs, **extra, "source": raw_path.name,
               "notes": "hf_host.py: one step a round, interleaved with the fit's modules and small models"}
        name = f"step-{stack}-{model}-b{batch}-kv{kv}.json"
        (dest / name).write_text(json.dumps(rec, separators=(",", ":")) + "\n")
        names.append(name)
    return sorted(names)


def eager_counts(files: list[Path]) -> dict[str, dict[str, Any]]:
    """The eager steps' kernels and GPU busy time by case over ``files`` (oldest first): the newest file
    that profiled a case (a run's profiler comes last and may miss its budget; the count is the step's,
    the same in any run of the same torch and transformers), with that file's name as ``source``."""
    out: dict[str, dict[str, Any]] = {}
    for f in files:
        for case, c in json.loads(f.read_text()).get("eager_kernels", {}).items():
            out[case] = {**c, "source": f.name}
    return out


def extract_all(folder: Path, dest: Path | None = None) -> list[str]:
    """:func:`extract_steps` of every run of ``folder``, oldest first, into ``dest`` (``folder``): a later
    run's case replaces an earlier one's; the eager steps' kernels from :func:`eager_counts`. Returns the
    names written."""
    files = raw_files(folder)
    counts = eager_counts(files)
    names: set[str] = set()
    for f in files:
        names.update(extract_steps(f, folder if dest is None else dest, counts))
    return sorted(names)


def fit_models(folder: Path) -> dict[str, list[str]]:
    """Per stack, the models whose fit part built its host costs: the ``fit_models`` of the run
    :func:`newest` picks for the stack's part (no entry where no run holds it)."""
    out = {}
    for stack, part in STACK_PART.items():
        try:
            out[stack] = sorted(newest(folder, part)[1].get("fit_models", []))
        except fit.FitError:
            continue
    return out


def host_spread(raw: dict[str, Any]) -> dict[str, Any]:
    """How much the host's speed moved over the run's rounds: the probe's p10, median and p90 (µs), and
    the share of rounds whose probe is more than 20 % off its median."""
    out = {}
    for part in ("eager", "compiled"):
        rounds = raw.get(part, {}).get("rounds", [])
        for k in ("python_us", "torch_us"):
            xs = [r["probe"][k] for r in rounds]
            if xs:
                s = _stats(xs)
                med = s["median"]
                out[f"{part}_{k}"] = {**s, "off_20_pct": round(100 * sum(1 for x in xs if abs(x / med - 1) > 0.2)
                                                              / len(xs), 1)}
    return out

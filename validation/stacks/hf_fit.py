"""Implementation profiles of the transformers stacks (``hwmodels/profiles/hf.toml``, ``hf-compiled.toml``),
fitted to the single modules of ``hf_ops.py`` (``validation/results/h200-stacks/hf/singles/``) and never to a
whole step:

    python -m validation.stacks.hf_fit validation/results/h200-stacks/hf/singles --stack hf \\
        --out hwmodels/profiles/hf.toml

- **The GPU**: the modules' kernels (``ops-<stack>-*.json``, written from the raw file by ``extract``) are
  fitted as ``fit.py`` fits our stacks' single ops (kernels per op, fixed kinds, continuation kernels,
  streaming kinds; an op of several GEMMs, transformers' separate q, k, v and gate, up projections, streams
  its bytes through all of them).
- **The host** (``hf``): each op kind's ``host_us`` from the modules' call times (median of each), mean over
  the files, of layer 0: the two norms each with half of what the decoder layer spends beyond its four
  modules (its residual adds and its own Python); the projections' calls (a quarter of the seven: mksim
  has four matmul ops a layer); RoPE and the cache's update (``rope_kv``); the attention module less its
  projections, RoPE and cache update (``attn_partial``: the attention function, views, the module's
  Python); the MLP module less its projections (``silu_mul``). ``host_step_us``: the one-layer model's
  forward less its layer, its final norm and LM head as mksim charges them (``rmsnorm`` and ``matmul``
  ``host_us``) and the embedding's call: the model's code outside its layers (the mask, the RoPE table,
  the output). The step runs in ``stream`` mode: a kernel is issued once the host has done its share
  (:func:`mksim.costs.host_issue_times`), the GPU running behind.
- **The host** (``hf-compiled``): one CUDA graph a step (``graph`` mode), its first kernel after the
  call's host part and the graph's launch. ``host_graph_node_us``: the graph-launch microbenchmark's
  launch part (``2 one - two``) over its nodes, least squares; ``host_step_us``: the compiled models of
  one, two and more layers: CUDA-event time of a call less the GPU span of its replay less the launch
  of its kernels less ``launch_latency_us``, the mean over the files and models.
- **The host, from ``hf_host.py``'s runs** (``--host DIR``, what the committed profiles use): the host's
  numbers above are replaced by ``hf_host_fit.py``'s fit of the fit part of the newest run in ``DIR`` that
  holds the stack's part (``hf_host_fit.newest``); ``host_graph_node_us`` stays the microbenchmark's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

import hwmodels
from mksim.costs import rates
from validation.stacks import fit, hf_host_fit

RAW_GLOB = "hf-ops-*.json"
PROFILE = {"hf": "hf", "hf_compiled": "hf-compiled"}
FULL = {"hf": "transformers, eager with the dynamic cache (host-bound: the host issues each kernel)",
        "hf_compiled": "transformers, static cache + torch.compile(mode=reduce-overhead, fullgraph): one CUDA "
                       "graph a step, launched by the host"}
MODE = {"hf": "stream", "hf_compiled": "graph"}


def raw_files(run: Path) -> list[Path]:
    files = sorted(run.glob(RAW_GLOB))
    if not files:
        raise fit.FitError(f"{run}: no {RAW_GLOB} files (hf_ops.py's single modules)")
    return files


def extract(run: Path) -> list[str]:
    """Write ``ops-<stack>-<case>.json`` (the ``ops`` schema ``fit.py`` reads) from the raw files of
    ``run``; a later raw file's case replaces an earlier one's. Returns the files written."""
    out = []
    for f in raw_files(run):
        d = json.loads(f.read_text())
        for stack in ("hf", "hf_compiled"):
            for case, rec in d.get(stack, {}).items():
                ops = rec if stack == "hf" else rec.get("ops")
                if not ops:
                    continue
                keep = {k: v for k, v in ops.items() if k not in ("host_us", "sequence")}
                name = f"ops-{stack}-{case}.json"
                (run / name).write_text(json.dumps(keep, separators=(",", ":")) + "\n")
                out.append(name)
    return sorted(set(out))


def _cases(run: Path, stack: str) -> dict[str, dict[str, Any]]:
    """The raw records of ``stack`` by case (a later file's replaces an earlier one's), with their file."""
    got: dict[str, dict[str, Any]] = {}
    for f in raw_files(run):
        d = json.loads(f.read_text())
        for case, rec in d.get(stack, {}).items():
            got[case] = {**rec, "_raw": f.name, "_env": d.get("env", {})}
        if stack == "hf_compiled" and "graph_launch" in d:
            got.setdefault("_graph_launch", {"graph_launch": d["graph_launch"], "_raw": f.name})
    return got


def eager_host(run: Path) -> tuple[dict[str, float], float, float, str]:
    """``{kind: host_us}``, ``host_step_us``, ``host_qk_norm_us`` (two norm module calls: Qwen3's q and k
    norms, which the fitted models do not make) and a note (module docstring)."""
    per: dict[str, list[float]] = {}
    step: list[float] = []
    qk: list[float] = []
    cases = _cases(run, "hf")
    if not cases:
        raise fit.FitError(f"{run}: no eager (hf) records")
    for rec in cases.values():
        h = {k: v["median"] for k, v in rec["host_us"].items()}
        kinds = hf_host_fit.kinds_of(h)
        for k, v in kinds.items():
            per.setdefault(k, []).append(v)
        step.append(h["model1"] - h["layer1"] - kinds["rmsnorm"] - kinds["matmul"] - h["embed"])
        qk.append(h["attn_norm"] + h["mlp_norm"])
    host = {k: round(float(np.mean(v)), 2) for k, v in per.items()}
    spread = ", ".join(f"{k} {min(v):.0f}-{max(v):.0f}" for k, v in per.items())
    note = (f"{len(cases)} files ({', '.join(sorted(cases))}): median wall time of each module's call, mean over "
            f"the files (range over them: {spread} us; step {min(step):.0f}-{max(step):.0f} us)")
    return host, round(float(np.mean(step)), 1), round(float(np.mean(qk)), 1), note


#: mksim's ops of a dense layer (attn_norm, qkv, rope_kv, attn_partial, attn_reduce, o_proj, mlp_norm, gate_up,
#: silu_mul, down): a compiled call's host cost per layer is spread over them
LAYER_KINDS = {"rmsnorm": 2, "matmul": 4, "rope_kv": 1, "attn_partial": 1, "attn_reduce": 1, "silu_mul": 1}


def compiled_host(run: Path, gpu: str = "h200-calibrated") -> tuple[float, float, float, str]:
    """``host_graph_node_us``, ``host_step_us``, the host's cost per layer and a note (module docstring)."""
    cases = _cases(run, "hf_compiled")
    gl = cases.pop("_graph_launch", None)
    if gl is None:
        raise fit.FitError(f"{run}: no graph-launch microbenchmark (hf_ops.py --graph-launch)")
    pts = [(int(n), v["launch_us"]) for n, v in gl["graph_launch"].items()]
    x = np.array([[1.0, n] for n, _ in pts])
    y = np.array([v for _, v in pts])
    (a, node), *_ = np.linalg.lstsq(x, y, rcond=None)
    node = max(float(node), 0.0)
    lat = rates(hwmodels.load(gpu)).launch_latency_us
    step: list[tuple[str, int, float]] = []
    for case, rec in cases.items():
        for n, r in rec["layers"].items():
            k = float(np.median(r["activities_per_call"]))
            step.append((case, int(n), r["event_us"]["median"] - r["span_us"] - k * node - lat))
    sweep = [(n, v) for c, n, v in step if sum(1 for c2, _, _ in step if c2 == c) > 1]
    if len(sweep) < 2:
        raise fit.FitError(f"{run}: no compiled models of several layers (hf_ops.py --compiled-layers 1,2,4)")
    xs = np.array([[1.0, n] for n, _ in sweep])
    (_, per_layer), *_ = np.linalg.lstsq(xs, np.array([v for _, v in sweep]), rcond=None)
    ones = [v for _, n, v in step if n == 1]
    fixed = float(np.mean(ones)) - float(per_layer)
    note = (f"graph launch of {', '.join(str(n) for n, _ in pts)} nodes ({gl['_raw']}): launch = {a:.1f} + "
            f"{node:.4f} us x nodes; a call's host part, event - span - nodes x node - launch latency {lat:.2f} "
            f"us, of {len(step)} compiled models (" + ", ".join(f"{c} {n}L {v:.0f}" for c, n, v in step) +
            f" us): per layer {float(per_layer):.1f} us (least squares over the layer sweep), the rest the mean "
            "of the one-layer models less one layer")
    return round(node, 4), round(fixed, 1), round(float(per_layer), 2), note


def to_toml(stack: str, f: fit.Fit, run: Path, host: dict[str, Any], date: str, env: dict[str, Any]) -> str:
    name = PROFILE[stack]
    host_dir = host.get("dir")
    lines = [f"# Implementation profile: {FULL[stack]}, fitted to the single modules of",
             f"# {run}/{RAW_GLOB} (validation/stacks/hf_ops.py)"
             + (f" and, for the host's costs, to the fit part of {host['raw']}"
                " (validation/stacks/hf_host.py)" if host_dir else "") + " by",
             f"#   python -m validation.stacks.hf_fit {run} --stack {stack}"
             + (f" --host {host_dir}" if host_dir else "") + f" --out hwmodels/profiles/{name}.toml",
             "# never to whole steps. How: validation/stacks/hf_fit.py and docs/stacks.md",
             "# (\"The transformers stacks\").",
             "schema_version = 1", f'profile = "{name}"', f'full_name = "{FULL[stack]}"',
             'measured_on = "h200-calibrated"', 'kind = "stack"', f'mode = "{MODE[stack]}"', "",
             "[runtime.kernels]"]
    hsrc = host.get("source", "singlemodules")
    for key, (v, note) in host.get("numbers", {}).items():
        src = "singlemodules" if key == "host_graph_node_us" else hsrc
        lines.append(f"{key} = {{ value = {fit._num(v)}, source = \"{src}\", note = {json.dumps(note)} }}")
    lines.append("")
    order = ["embed", "rmsnorm", "matmul", "rope_kv", "attn_partial", "attn_reduce", "silu_mul", "elementwise"]
    for kind in sorted(f.tables, key=lambda k: order.index(k) if k in order else 99):
        lines.append(f"[runtime.kernels.{kind}]")
        for key, val in f.tables[kind].items():
            lines.append(f"{key} = {{ value = {fit._num(val.value)}, source = \"singlemodules\", "
                         f"note = {json.dumps(val.note)} }}")
        if kind in host.get("per_kind", {}):
            lines.append(f"host_us = {{ value = {fit._num(host['per_kind'][kind])}, source = \"{hsrc}\", "
                         f"note = {json.dumps(host['note'])} }}")
        lines.append("")
    lines += ["[sources.singlemodules]", 'kind = "measured"',
              f'title = "single modules of the {stack} stack on NVIDIA H200 (torch {env.get("torch", "?")}, '
              f'transformers {env.get("transformers", "?")}, host {env.get("cpu", "?")}, {env.get("cpus", "?")} '
              f'cores, kernel {env.get("kernel", "?")})"',
              f'date = "{date}"',
              f'note = "raw results: {run}/{RAW_GLOB} (hf_ops.py: each module alone, called again and again on '
              f'the inputs it had in a decode step, host wall time per call; its kernels after a 256 MiB L2 '
              f'eviction, 5 reps, torch.profiler); the ops files beside them are extracted from those"', ""]
    if hsrc != "singlemodules":
        h_env = host["env"]
        lines += [f"[sources.{hsrc}]", 'kind = "measured"',
                  f'title = "host rounds of the transformers stacks on NVIDIA H200 (torch {h_env.get("torch", "?")}, '
                  f'transformers {h_env.get("transformers", "?")}, host {h_env.get("cpu", "?")})"',
                  f'date = "{str(h_env.get("date_utc", ""))[:10]}"',
                  f'note = "raw results: {host["raw"]} (hf_host.py: single modules, small models and whole steps '
                  'in one process, interleaved in rounds; the fit reads the modules and small models only)"', ""]
    return "\n".join(lines)


def profile_text(run: Path, stack: str, host_run: Path | None = None) -> str:
    """The profile's text: the GPU tables from the single modules of ``run``; the host's costs from them
    too, or, with ``host_run``, from the fit part of the newest ``hf_host.py`` run there that holds the stack's
    part (``hf_host_fit.newest``: eager rounds for ``hf``, compiled rounds for ``hf_compiled``)."""
    extract(run)
    f = fit.fit_profile(run, stack)
    cases = _cases(run, stack)
    cases.pop("_graph_launch", None)
    env = next(iter(cases.values()))["_env"]
    date = str(env.get("date_utc", ""))[:10]
    if stack == "hf" and host_run is not None:
        path, raw = hf_host_fit.newest(host_run, hf_host_fit.STACK_PART[stack])
        e = hf_host_fit.eager_fit(raw)
        src = f"{host_run}/{path.name} (hf_host.py, its fit part only): "
        host = {"per_kind": e["per_kind"], "note": src + e["note"], "source": "hostrounds", "env": raw["env"],
                "raw": str(path), "dir": str(host_run),
                "numbers": {"host_step_us": (max(e["host_step_us"], 0.0),
                                             "the small models' intercept less the final norm, LM head and "
                                             "embedding as mksim charges them; " + src + e["note"]),
                            "host_qk_norm_us": (e["host_qk_norm_us"], "two norm module calls (Qwen3's q and k "
                                                "norms), scaled as the kinds; " + src + e["note"])}}
    elif stack == "hf":
        per_kind, step, qk, note = eager_host(run)
        host = {"per_kind": per_kind, "note": note,
                "numbers": {"host_step_us": (step, "the one-layer model's forward less its layer, its final norm "
                                                   "and LM head (rmsnorm and matmul host_us) and the embedding's "
                                                   "call: the model's code outside its layers; " + note),
                            "host_qk_norm_us": (qk, "two norm module calls (the attention's and the MLP's norm "
                                                    "modules, each alone): what a layer of a model with q and k "
                                                    "norms (Qwen3) calls beyond a Llama layer; " + note)}}
    elif host_run is not None:
        node, _, _, gl_note = compiled_host(run)
        path, raw = hf_host_fit.newest(host_run, hf_host_fit.STACK_PART[stack])
        c = hf_host_fit.compiled_fit(raw)
        note = f"{host_run}/{path.name} (hf_host.py, its fit part only): " + c["note"]
        n_ops = sum(LAYER_KINDS.values())
        host = {"source": "hostrounds", "env": raw["env"], "raw": str(path), "dir": str(host_run),
                "numbers": {"host_graph_node_us": (node, gl_note),
                            "host_step_us": (max(c["host_step_us"], 0.0), note)},
                "per_kind": {k: round(c["per_layer_us"] / n_ops, 2) for k in LAYER_KINDS},
                "note": f"the host's part before the graph's launch per layer ({c['per_layer_us']:.1f} us) over "
                        f"mksim's {n_ops} ops of a layer; " + note}
    else:
        node, step, per_layer, note = compiled_host(run)
        n_ops = sum(LAYER_KINDS.values())
        host = {"numbers": {"host_graph_node_us": (node, note), "host_step_us": (step, "same: " + note)},
                "per_kind": {k: round(per_layer / n_ops, 2) for k in LAYER_KINDS},
                "note": f"a compiled call's host part per layer ({per_layer:.1f} us: its guards and checks of the "
                        f"layer's inputs, before the graph's launch) over mksim's {n_ops} ops of a layer; " + note}
    return to_toml(stack, f, run, host, date, env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.stacks.hf_fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--stack", choices=tuple(PROFILE), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--host", type=Path, default=None,
                    help="a folder of hf_host.py runs: the host's costs from the fit part of the newest run "
                         "that holds the stack's part")
    a = ap.parse_args(argv)
    try:
        text = profile_text(a.run, a.stack, a.host)
    except (fit.FitError, KeyError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.out.write_text(text)
    hwmodels.load("h200-calibrated", profile=str(a.out))   # it loads
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

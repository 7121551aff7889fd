"""The device-side run: one subprocess per model (``worker``), a budget over all of them (``run``).

Each worker builds the model's random weights once, then for each (batch, kv_len) case: the eager step
and its float32 reference (``measure.eager_baseline``), then each stack captured, timed and checked
(``measure.measure_case``; ``inductor_graph`` compiled first, ``compile_s`` measured), then, where asked,
the single-op profiles (``ops``). Files under ``out``: ``step-<stack>-<model>-b<B>-kv<kv>.json``,
``ops-<stack>-<model>-b<B>-kv<kv>.json``, ``environment.json``, ``status.json``; the Inductor/Triton
compile cache under ``out/inductor-cache`` (delete it before keeping the results).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STACKS = ("torch_graph", "inductor_graph")
#: transformers' own models (``hf.py``): measured in a process of their own, after ours
HF_STACKS = ("hf", "hf_compiled")
ALL_STACKS = STACKS + HF_STACKS


@dataclass(frozen=True)
class ModelPlan:
    model: str
    cases: tuple[tuple[int, int], ...]   # (batch, kv_len)
    ops: bool                            # single-op profiles for every case


# The full run, in priority order (what the budget cannot reach is skipped and said so): every model at
# kv 1024 first, llama-3.1-8b's kv 4096 cases last (a second process for that model).
FULL_PLAN = (
    ModelPlan("llama-3.2-1b", ((1, 1024), (8, 1024), (1, 4096), (8, 4096)), ops=True),
    ModelPlan("llama-3.1-8b", ((1, 1024), (8, 1024)), ops=True),
    ModelPlan("qwen3-8b", ((1, 1024), (8, 1024)), ops=False),
    ModelPlan("mistral-7b", ((1, 1024), (8, 1024)), ops=False),
    ModelPlan("llama-3.2-3b", ((1, 1024), (8, 1024)), ops=False),
    ModelPlan("llama-3.1-8b", ((1, 4096), (8, 4096)), ops=True),
)
QUICK_PLAN = (ModelPlan("llama-3.2-1b", ((1, 1024),), ops=True),)
CACHE_DIR = "inductor-cache"
MARGIN_S = 5.0        # the run ends this long before its timeout
START_MIN_S = 20.0    # no model process starts with less time left


def case_name(stack: str, model: str, batch: int, kv_len: int) -> str:
    return f"{stack}-{model}-b{batch}-kv{kv_len}"


def count_files(d: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(d)) if d.exists() else 0


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")


def worker(model: str, cases: list[tuple[int, int]], stacks: list[str], ops: bool, out: Path, replays: int,
           reps: int, deadline: float, trace: bool, device: str = "cuda") -> int:
    """All cases of one model in this process; skips a case that would start after ``deadline``."""
    import torch

    from validation.stacks import inductor_graph as ig
    from validation.stacks import measure
    from validation.stacks import torch_graph as tg

    dev, dt = torch.device(device), torch.bfloat16
    ig.configure()
    s = tg.load_shape(model)
    t0 = time.time()
    w = tg.make_weights(s, dev, dt)
    print(f"{model}: weights {time.time() - t0:.1f} s", flush=True)
    cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", out / CACHE_DIR))
    reserve = 25.0 if "inductor_graph" in stacks else 5.0
    for batch, kv in cases:
        if time.time() > deadline - reserve:
            print(f"{model} b{batch} kv{kv}: skipped (budget)", flush=True)
            continue
        k_cache, v_cache = tg.new_cache(s, batch, kv, dev, dt)
        tokens = torch.randint(0, s.vocab, (batch,), device=dev, generator=torch.Generator(dev).manual_seed(2))
        pos = torch.full((batch,), kv, device=dev, dtype=torch.long)
        with torch.inference_mode():
            base = measure.eager_baseline(s, w, tokens, pos, k_cache, v_cache, kv)
            eager: Callable[[], torch.Tensor] = functools.partial(tg.decode_step, s, w, tokens, pos, k_cache,
                                                                  v_cache, kv)
            for stack in stacks:
                name = case_name(stack, model, batch, kv)
                try:
                    tpath = out / f"trace-{name}.json.gz" if trace and (batch, kv) == cases[0] else None
                    run_stack(stack, name, s, w, tokens, pos, k_cache, v_cache, kv, eager, base, out, replays,
                              reps, deadline - 5.0 if ops else 0.0, tpath, cache)
                except Exception as e:   # one failed stack or case must not lose the others
                    write_json(out / f"error-{name}.json", {"error": f"{type(e).__name__}: {e}",
                                                           "traceback": traceback.format_exc()[-4000:]})
                    print(f"{name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        del k_cache, v_cache, base, eager
        torch.cuda.empty_cache()
    return 0


def run_stack(stack: str, name: str, s: Any, w: dict[str, Any], tokens: Any, pos: Any, k_cache: Any,
              v_cache: Any, kv: int, eager: Callable[[], Any], base: dict[str, Any], out: Path, replays: int,
              reps: int, ops_until: float, trace_path: Path | None, cache: Path) -> None:
    """Measure one stack at one case (``step-<name>.json``), then, if the clock is before ``ops_until``,
    profile its single ops (``ops-<name>.json``)."""
    from validation.stacks import inductor_graph as ig
    from validation.stacks import measure
    from validation.stacks import ops as sops

    t1 = time.time()
    extra: dict[str, Any] = {}
    parts = None
    step = eager
    if stack == "inductor_graph":
        before = count_files(cache)
        parts = ig.compiled_parts(s, kv)
        step = ig.make_step(s, w, tokens, pos, k_cache, v_cache, kv, parts)
        extra = {"compile_s": round(ig.compile_step(step), 2), "compile_mode": "default",
                 "compile_kwargs": ig.COMPILE_KW, "cache_files_before": before, "cache_files_after": count_files(cache)}
    row = measure.measure_case(stack, s, w, step, eager, base["ref"], base["logits"], base["err"],
                               tokens.shape[0], kv, replays, trace_path, base["side_stream_logits"],
                               base.get("routing"))
    row.update(extra)
    row["check"]["eager_repeat_max_abs_diff"] = base["eager_repeat_max_abs_diff"]
    row["check"]["eager_side_stream_max_abs_diff"] = base["eager_side_stream_max_abs_diff"]
    row["shape"] = asdict(s)
    row["case_wall_s"] = round(time.time() - t1, 1)
    write_json(out / f"step-{name}.json", row)
    print(f"{name}: {row['step_us']['median']:.1f} us, {row['kernels_per_step_graph']} kernels, "
          f"ok={row['check']['ok']} {extra.get('compile_s', '')}", flush=True)
    if time.time() < ops_until:
        t2 = time.time()
        rec = profile_stack(stack, s, w, tokens, pos, k_cache, v_cache, kv, parts, reps, out)
        sops.validate_record(rec)
        rec["wall_s"] = round(time.time() - t2, 1)
        rec["kernels_per_step_in_graph"] = row["kernels_per_step_graph"]   # should equal kernels_per_step
        write_json(out / f"ops-{name}.json", rec)
        print(f"ops-{name}: {len(rec['ops'])} ops, {rec['kernels_per_step']} kernels, "
              f"sum {rec['sum_us_cold_per_step']:.0f} us cold", flush=True)


def profile_stack(stack: str, s: Any, w: dict[str, Any], tokens: Any, pos: Any, k_cache: Any, v_cache: Any,
                  kv: int, parts: dict[str, Any] | None, reps: int, out: Path) -> dict[str, Any]:
    """The single-op profile record of one stack at one case."""
    import torch

    from validation.stacks import ops as sops

    if stack == "torch_graph":
        units = sops.eager_ops(s, w, tokens, pos, k_cache, v_cache, kv)
        return sops.ops_record(stack, s, tokens.shape[0], kv, reps, sops.profile_units(units, reps, out))
    assert parts is not None
    x, cos, sin = parts["prologue"](w["embed"], tokens, pos)
    dres = torch.randn_like(x)
    lw = w["layers"][0]
    units = [sops.Unit("prologue", lambda: parts["prologue"](w["embed"], tokens, pos), 1),
             sops.Unit("block", lambda: parts["block"](lw, x, dres, cos, sin, k_cache[0], v_cache[0]), s.layers),
             sops.Unit("tail", lambda: parts["tail"](x, dres, w["final_norm"], w["lm_head"]), 1)]
    profiled = sops.profile_units(units, reps, out)
    if s.moe:  # the kernel -> op map knows the dense block's GEMM order only: keep the compiled functions whole
        return sops.ops_record(stack, s, tokens.shape[0], kv, reps, profiled)
    labels = {p["unit"]: sops.map_inductor_kernels(p["unit"], [k["name"] for k in p["kernels"]], s.qk_norm)
              for p in profiled}
    return sops.ops_record(stack, s, tokens.shape[0], kv, reps, profiled, labels)


def environment() -> dict[str, Any]:
    import torch
    props = torch.cuda.get_device_properties(0)
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": props.name,
           "sms": props.multi_processor_count, "python": sys.version.split()[0],
           "cudnn": torch.backends.cudnn.version(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        env["triton"] = importlib.import_module("triton").__version__
    except ImportError:
        env["triton"] = None
    return env


def run(plan: list[ModelPlan], stacks: list[str], out: Path, timeout_s: float, replays: int, reps: int,
        trace: bool) -> dict[str, str]:
    """Run each model's worker in its own process group, in order, until ``timeout_s`` is spent."""
    start = time.time()
    deadline = start + timeout_s - MARGIN_S
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str((out / CACHE_DIR).resolve()))
    env.setdefault("TRITON_CACHE_DIR", str((out / CACHE_DIR / "triton").resolve()))
    env["PYTHONUNBUFFERED"] = "1"
    write_json(out / "environment.json", environment())
    status: dict[str, str] = {}
    families = [f for f in ([s for s in stacks if s in STACKS], [s for s in stacks if s in HF_STACKS]) if f]
    for i, (p, family) in enumerate((p, f) for p in plan for f in families):
        left = deadline - time.time()
        hf = f" {','.join(family)}" if family[0] in HF_STACKS else ""
        key = f"{p.model}{hf} {' '.join(f'b{b}/kv{k}' for b, k in p.cases)}"
        if left < START_MIN_S:
            status[key] = "skipped: budget"
            print(f"{key}: skipped (budget)", flush=True)
            continue
        cmd = [sys.executable, "-m", "validation", "stacks", "worker", "--model", p.model, "--out", str(out),
               "--stacks", ",".join(family), "--replays", str(replays), "--reps", str(reps),
               "--deadline", f"{deadline:.1f}", "--cases", ";".join(f"{b},{k}" for b, k in p.cases)]
        if p.ops:
            cmd.append("--ops")
        if trace and i == 0:
            cmd.append("--trace")
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(left, 1.0))
            status[key] = f"rc={rc} ({time.time() - t0:.0f} s)"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the worker and its compile workers
            proc.wait()
            status[key] = f"killed at the deadline after {time.time() - t0:.0f} s"
        print(f"{key}: {status[key]}", flush=True)
    cache = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) if cache.exists() else 0
    status["inductor_cache"] = f"{cache}: {count_files(cache)} files, {size / 1e6:.1f} MB"
    status["wall_s"] = f"{time.time() - start:.0f}"
    write_json(out / "status.json", status)
    return status


def table(out: Path) -> str:
    """One line per measured step file under ``out``."""
    lines = [f"{'stack':15} {'model':13} {'B':>2} {'kv':>5} {'median':>8} {'p10':>8} {'p90':>8} {'kern':>5} "
             f"{'GB/s':>7} {'compile':>7} ok"]
    for p in sorted(out.glob("step-*.json")):
        r = json.loads(p.read_text())
        st = r["step_us"]
        comp = f"{r['compile_s']:.1f}" if "compile_s" in r else f"{r['warmup_s']:.1f}" if "warmup_s" in r else "-"
        kernels = r.get("kernels_per_step_graph", r.get("kernels_per_step"))
        gbps = f"{r['implied_GBps']:>7.1f}" if "implied_GBps" in r else f"{'-':>7}"
        check = r.get("check") or {}
        ok = check.get("ok", f"top1 {check['top1_agree_vs_hf']:.2f}" if "top1_agree_vs_hf" in check else "-")
        lines.append(f"{r['stack']:15} {r['model']:13} {r['batch']:>2} {r['kv_len']:>5} {st['median']:>8.1f} "
                     f"{st['p10']:>8.1f} {st['p90']:>8.1f} {kernels:>5} {gbps} {comp:>7} {ok}")
    return "\n".join(lines)

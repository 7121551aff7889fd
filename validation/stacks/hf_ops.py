"""Single modules of the transformers stacks (``hf``, ``hf_compiled``): what their profiles are fitted to.

Never a whole step of a model: for each fitted model (llama-3.2-1b, llama-3.1-8b) and batch,

- ``hf`` (eager, ``DynamicCache``): the model is built with transformers' own classes (``hf.build``), its
  cache filled by a prefill of ``kv_len`` tokens and one decode call run with forward pre-hooks that keep
  the inputs of layer 0's modules (and of the embedding, the rotary embedding, the final norm, the LM
  head). Then each module is called alone, again and again, on those inputs (the cache cropped back to
  ``kv_len`` before each call, so every call appends one position as the step does):

  * **host**: the wall time of each call (``time.perf_counter`` around it, no synchronisation: the call
    returns once its kernels are queued; the GPU is never the limit, the host takes 10-100x longer), the
    median over ``host_calls`` calls, taken in rounds that cycle over the modules so that a drift of the
    host's speed falls on all of them alike. Timed: the decoder layer, its two norms, the attention and the
    MLP modules, each projection, the activation, ``apply_rotary_pos_emb``, the cache's ``update`` and a
    model of the same config with one layer (its whole forward: what a step does outside its layers);
  * **GPU** (``ops`` schema of ``ops.py``): each module once after a 256 MiB L2 eviction, ``reps`` times,
    under torch.profiler, its kernels labelled with the ops of ``fit.py`` (the attention module's GEMMs
    are q, k, v and o; its attention kernels; between them RoPE and the cache write; the MLP's first two
    GEMMs gate/up, the third down, the rest SiLU*mul).

- ``hf_compiled`` (``StaticCache`` + ``torch.compile(mode="reduce-overhead", fullgraph=True)``): a model of
  the same config with **one layer** (and, for the host, two), compiled as the stack compiles the whole
  model; its replays profiled after an L2 eviction give each kernel (labelled as above: before the first
  GEMM the embedding and layer 0's norm, after ``down`` the residual add with the next norm, the LM head
  last); the host's part of a call is the CUDA-event time of a call (as ``hf.py`` times a step) less the
  GPU span of the replay (first kernel's start to last kernel's end, profiled).

Writes one JSON (``--out``): ``{"env", "hf": {case: {...}}, "hf_compiled": {case: {...}}}``.
Run on the device: ``python3 -m validation.stacks.hf_ops --out $OUT/hf-ops.json``.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from validation.stacks import hf
from validation.stacks import ops as so
from validation.stacks import torch_graph as tg

FIT_MODELS = ("llama-3.2-1b", "llama-3.1-8b")


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def host_times(calls: dict[str, Callable[[], Any]], before: dict[str, Callable[[], Any]], n: int,
               rounds: int = 10) -> dict[str, dict[str, float]]:
    """Per name: the wall time (µs) of a call of ``calls[name]`` (``before[name]`` runs untimed before
    each), median, p10, p90 over ``n`` calls taken in ``rounds`` rounds over the names."""
    per: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            pre = before.get(name)
            for _ in range(max(n // rounds, 1)):
                if pre is not None:
                    pre()
                t0 = time.perf_counter()
                fn()
                per[name].append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
    return {k: {"median": _median(v), "p10": round(tg.percentile(v, 0.1), 2), "p90": round(tg.percentile(v, 0.9), 2),
                "n": len(v)} for k, v in per.items()}


def capture(model: Any, mods: dict[str, Any], run: Callable[[], Any]) -> dict[str, tuple[tuple, dict]]:
    """The (args, kwargs) of the first call of each module of ``mods`` during ``run()``."""
    got: dict[str, tuple[tuple, dict]] = {}
    hooks = []
    for name, m in mods.items():
        def pre(mod: Any, args: tuple, kwargs: dict, name: str = name) -> None:
            got.setdefault(name, (args, dict(kwargs)))
        hooks.append(m.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return got


def gemm(name: str) -> bool:
    """A GEMM kernel of a projection (not a split-K reduction: that one joins the GEMM before it; not the
    float32 CUDA-core GEMM of the RoPE table, ``cutlass_80_simt_sgemm``)."""
    low = name.lower()
    return so.is_gemm(name) and "reduce" not in low and "simt_sgemm" not in low


def crop(cache: Any, n: int) -> None:
    """The cache back to ``n`` positions (each layer's keys and values), as before a step."""
    if hasattr(cache, "crop"):
        cache.crop(n)
        return
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[..., :n, :], layer.values[..., :n, :]


def label_attention(names: list[str]) -> list[str]:
    """The eager attention module's kernels: GEMMs q, k, v (``qkv``) and o (``o_proj``), attention kernels
    (and whatever follows them before o_proj) ``attention``, the rest (RoPE, the cache's cat) ``rope``."""
    out: list[str] = []
    n_gemm, seen_attn = 0, False
    for n in names:
        if so.is_gemm(n) and not gemm(n) and out:   # a split-K reduction: its GEMM's
            out.append(out[-1])
        elif gemm(n):
            n_gemm += 1
            out.append("qkv" if n_gemm <= 3 else "o_proj")
        elif so.is_attention(n) or (seen_attn and n_gemm == 3):
            seen_attn = True
            out.append("attention")
        elif n_gemm >= 4:
            out.append("o_proj")
        else:
            out.append("rope")
    return out


def label_mlp(names: list[str]) -> list[str]:
    out: list[str] = []
    n_gemm = 0
    for n in names:
        if so.is_gemm(n) and not gemm(n) and out:
            out.append(out[-1])
        elif gemm(n):
            n_gemm += 1
            out.append("gate_up" if n_gemm <= 2 else "down")
        else:
            out.append("silu_mul")
    return out


def label_compiled(names: list[str]) -> tuple[list[str], list[str]]:
    """Labels and per-label count class (``"step"``: once a step, ``"layer"``: once a layer) of the
    kernels of one replay of a one-layer compiled model (module docstring)."""
    gemms = [i for i, n in enumerate(names) if gemm(n)]
    labels: list[str] = []
    per: list[str] = []
    order = ["qkv", "qkv", "qkv", "o_proj", "gate_up", "gate_up", "down", "lm_head"]
    # non-GEMM kernels by the GEMMs before them: after q, k, v RoPE and the cache write; after o the
    # residual add and the MLP's norm; between gate, up and down SiLU*mul; after down the residual add
    # and the next norm; after the LM head its casts
    between = {1: "rope", 2: "rope", 3: "rope", 4: "mlp_norm", 5: "silu_mul", 6: "silu_mul", 7: "after_down",
               8: "lm_head"}
    seen_attn = False
    for i, n in enumerate(names):
        k = sum(1 for g in gemms if g < i)    # GEMMs before this kernel
        low = n.lower()
        if "simt_sgemm" in low or ("bmm" in low and not any(w in low for w in ("cos", "sin", "index_copy",
                                                                             "attention"))):
            labels.append("embed")   # the RoPE table, once a step (layer 0 computes it)
        elif so.is_gemm(n) and not gemm(n) and labels:
            labels.append(labels[-1])
        elif gemm(n):
            j = min(k, len(order) - 1)
            labels.append(order[j] if len(gemms) == len(order) else
                          ("lm_head" if i == gemms[-1] else "unmapped_gemm"))
        elif so.is_attention(n) or (seen_attn and k == 3):
            seen_attn = True
            labels.append("attention")
        elif k == 0:   # the embedding (with layer 0's norm, where fused), the step's positions and mask
            low = n.lower()
            labels.append("attn_norm" if "embedding" not in low and "rsqrt" in low else "embed")
        elif k >= 8 and "add_copy" in low:
            labels.append("kv_write")   # the static cache's per-layer bookkeeping, after the LM head
        else:
            labels.append(between.get(k, "lm_head"))
        per.append("step" if labels[-1] in ("embed", "attn_norm", "lm_head") else "layer")
    return labels, per


def profile(calls: list[tuple[str, Callable[[], Any]]], reps: int) -> list[list[list[dict[str, Any]]]]:
    """Each call after an L2 eviction, ``reps`` times, under the profiler: per call, per rep, its kernels
    (name, grid, block, dur µs, ts)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile
    evict = torch.empty(so.EVICT_BYTES // 4, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for _, fn in calls:
                evict.bitwise_not_()
                fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    ks = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and e.get("ph") == "X"]
    ks.sort(key=lambda e: float(e["ts"]))
    kernels = [{"name": e["name"], "grid": list(e.get("args", {}).get("grid", [])),
                "block": list(e.get("args", {}).get("block", [])), "dur": float(e.get("dur", 0.0)),
                "ts": float(e["ts"])} for e in ks]
    per_rep = so.split_units(kernels, len(calls), reps)
    return [[per_rep[r][j] for r in range(reps)] for j in range(len(calls))]


def summarise(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    s = so.summarise_unit(runs)
    spans = [r[-1]["ts"] + r[-1]["dur"] - r[0]["ts"] for r in runs if r]
    s["span_us"] = _median(spans) if spans else 0.0
    return s


def record_ops(stack: str, s: tg.Shape, batch: int, kv_len: int, reps: int,
               units: list[tuple[str, int | list[int], list[str] | None, dict[str, Any]]]) -> dict[str, Any]:
    """An ``ops``-schema record (``ops.ops_record``'s) from profiled units: (unit, count per step or a list
    of per-kernel counts, labels or None (the unit is its own op), summary)."""
    nbytes = so.op_bytes(s, batch, kv_len)
    ops: dict[str, dict[str, Any]] = {}
    for unit, count, labels, summ in units:
        ks = summ["kernels"]
        lab = labels if labels is not None else [unit] * len(ks)
        counts = count if isinstance(count, list) else [count] * len(ks)
        for label, c, k in zip(lab, counts, ks, strict=True):
            op = ops.setdefault(label, {"unit": unit, "count_per_step": int(c), "bytes": nbytes.get(label),
                                        "deterministic": None, "kernels": []})
            op["kernels"].append({"name": k["name"], "grid": k["grid"], "block": k["block"],
                                  "us_cold": k["us_cold"], "bytes": None})
    for op in ops.values():
        op["us_cold"] = round(sum(k["us_cold"] for k in op["kernels"]), 2)
        if len(op["kernels"]) == 1:
            op["kernels"][0]["bytes"] = op["bytes"]
    total = sum(op["us_cold"] * op["count_per_step"] for op in ops.values())
    return {"schema": so.SCHEMA, "stack": stack, "model": s.name, "batch": batch, "kv_len": kv_len,
            "evict_bytes": so.EVICT_BYTES, "reps": reps, "unit": "module call",
            "kernels_per_step": sum(len(op["kernels"]) * op["count_per_step"] for op in ops.values()),
            "sum_us_cold_per_step": round(total, 1), "ops": ops}


def with_layers(config: Any, n: int) -> Any:
    c = copy.deepcopy(config)
    c.num_hidden_layers = n
    if hasattr(c, "layer_types") and c.layer_types is not None:
        c.layer_types = c.layer_types[:n]
    return c


def timed_modules(model: Any) -> dict[str, Any]:
    """The modules of a transformers causal LM that the eager profile is fitted to, by name: layer 0 (whole,
    its norms, attention and MLP, each projection) and what a step runs outside its layers."""
    inner = model.model
    layer = inner.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    return {"layer": layer, "attn_norm": layer.input_layernorm, "attn": attn,
            "mlp_norm": layer.post_attention_layernorm, "mlp": mlp,
            "q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj, "o": attn.o_proj,
            "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj,
            "embed": inner.embed_tokens, "rotary": inner.rotary_emb, "final_norm": inner.norm,
            "lm_head": model.lm_head}


def eager_case(name: str, batch: int, kv_len: int, host_calls: int, reps: int) -> dict[str, Any]:
    """The eager stack's single modules at one batch (module docstring)."""
    config = hf.hf_config(name)
    s = tg.load_shape(name)
    model = hf.build(config, "cuda")
    inner = model.model
    mods = timed_modules(model)
    attn, mlp = mods["attn"], mods["mlp"]
    cache = hf.new_cache("hf", config, 0)
    with torch.inference_mode():
        first = hf.prefill(model, cache, batch, kv_len, config.vocab_size)
        got = capture(model, mods, lambda: model(input_ids=first, past_key_values=cache, use_cache=True))
        torch.cuda.synchronize()
        mod_py = sys.modules[type(attn).__module__]
        args = dict(got)
        q_in = args["q"][0][0]
        b = q_in.shape[0]
        hd = s.head_dim
        q = attn.q_proj(q_in).view(b, 1, -1, hd).transpose(1, 2)
        k = attn.k_proj(q_in).view(b, 1, -1, hd).transpose(1, 2)
        v = attn.v_proj(q_in).view(b, 1, -1, hd).transpose(1, 2)
        cos, sin = inner.rotary_emb(*args["rotary"][0], **args["rotary"][1])

        def back() -> None:
            crop(cache, kv_len)

        def call(key: str) -> Callable[[], Any]:
            a, kw = args[key]
            m = mods[key]
            return lambda: m(*a, **kw)

        gate_out = attn.q_proj(q_in)  # any activation of the right dtype; SiLU*mul on the MLP's widths below
        gu = torch.randn(b, 1, s.intermediate, device=q_in.device, dtype=gate_out.dtype)
        calls: dict[str, Callable[[], Any]] = {key: call(key) for key in args}
        calls["act"] = lambda: mlp.act_fn(gu)
        calls["silu_mul"] = lambda: mlp.act_fn(gu) * gu
        calls["rope"] = lambda: mod_py.apply_rotary_pos_emb(q, k, cos, sin)
        calls["cache_update"] = lambda: cache.update(k, v, 0)
        h_in = args["attn_norm"][0][0]
        calls["residual_add"] = lambda: h_in + h_in
        before = {key: back for key in ("layer", "attn", "cache_update")}
        # a model of one layer: what a step does outside its layers
        one = hf.build(with_layers(config, 1), "cuda")
        one_cache = hf.new_cache("hf", one.config, 0)
        first1 = hf.prefill(one, one_cache, batch, kv_len, config.vocab_size)
        one(input_ids=first1, past_key_values=one_cache, use_cache=True)
        crop(one_cache, kv_len)
        calls["model1"] = lambda: one(input_ids=first1, past_key_values=one_cache, use_cache=True)
        before["model1"] = lambda: crop(one_cache, kv_len)
        one_layer = one.model.layers[0]
        got1 = capture(one, {"layer1": one_layer}, lambda: one(input_ids=first1, past_key_values=one_cache,
                                                                use_cache=True))
        crop(one_cache, kv_len)
        a1, kw1 = got1["layer1"]
        calls["layer1"] = lambda: one_layer(*a1, **kw1)
        before["layer1"] = lambda: crop(one_cache, kv_len)
        for _ in range(3):   # warm
            for key, fn in calls.items():
                if key in before:
                    before[key]()
                fn()
        torch.cuda.synchronize()
        host = host_times(calls, before, host_calls)
        # kernels per module and their GPU time, each after an L2 eviction
        def after_back(fn: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                back()
                return fn()
            return run

        units = [("embed", calls["embed"]), ("rope_table", calls["rotary"]), ("attn_norm", calls["attn_norm"]),
                 ("attn", after_back(calls["attn"])), ("residual_add", calls["residual_add"]),
                 ("mlp_norm", calls["mlp_norm"]), ("mlp", calls["mlp"]), ("final_norm", calls["final_norm"]),
                 ("lm_head", calls["lm_head"]), ("layer", after_back(calls["layer"]))]
        prof = profile(units, reps)
        summ = {u: summarise(r) for (u, _), r in zip(units, prof, strict=True)}
    L = s.layers
    attn_names = [kk["name"] for kk in summ["attn"]["kernels"]]
    mlp_names = [kk["name"] for kk in summ["mlp"]["kernels"]]
    rec = record_ops("hf", s, batch, kv_len, reps, [
        ("embed", 1, None, summ["embed"]), ("rope_table", 1, None, summ["rope_table"]),
        ("attn_norm", L, None, summ["attn_norm"]), ("attn", L, label_attention(attn_names), summ["attn"]),
        ("residual_add", 2 * L, None, summ["residual_add"]), ("mlp_norm", L, None, summ["mlp_norm"]),
        ("mlp", L, label_mlp(mlp_names), summ["mlp"]), ("final_norm", 1, None, summ["final_norm"]),
        ("lm_head", 1, None, summ["lm_head"])])
    rec["host_us"] = host
    rec["layer_kernels"] = len(summ["layer"]["kernels"])
    rec["layer_kernel_us_cold"] = round(sum(kk["us_cold"] for kk in summ["layer"]["kernels"]), 2)
    rec["transformers"] = __import__("transformers").__version__
    rec["model_class"] = type(model).__name__
    return rec


def compiled_case(name: str, batch: int, kv_len: int, layers: tuple[int, ...], reps: int,
                  calls_n: int = 30) -> dict[str, Any]:
    """The compiled stack's one-layer (and more-layer) models at one batch (module docstring)."""
    config = hf.hf_config(name)
    s = tg.load_shape(name)
    out: dict[str, Any] = {"layers": {}}
    for n in layers:
        torch._dynamo.reset()
        model = hf.build(with_layers(config, n), "cuda")
        max_len = kv_len + 56   # as hf.py: kv_len + warm-up 5 + steps 50 + 1 (this makes at most 52 calls)
        cache = hf.new_cache("hf_compiled", model.config, max_len)
        fwd = torch.compile(model.forward, **hf.COMPILE_KW)
        t0 = time.time()
        with torch.inference_mode():
            first = hf.prefill(model, cache, batch, kv_len, config.vocab_size)

            def step(fwd: Any = fwd, first: Any = first, cache: Any = cache) -> Any:
                return fwd(input_ids=first, past_key_values=cache, use_cache=True)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            warm = time.time() - t0
            ev = []
            for _ in range(calls_n):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step()
                b.record()
                b.synchronize()
                ev.append(a.elapsed_time(b) * 1000.0)
            # GPU span of a replay without an eviction: profiled calls, a sync between them
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as tprofile
            with tprofile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(12):
                    step()
                    torch.cuda.synchronize()
            with tempfile.TemporaryDirectory() as d:
                path = Path(d) / "t.json"
                p.export_chrome_trace(str(path))
                tr = json.loads(path.read_text())
            ks = sorted((e for e in tr["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                         and e.get("ph") == "X"), key=lambda e: float(e["ts"]))
            groups: list[list[dict[str, Any]]] = []
            for e in ks:   # a call's activities: separated from the next call's by > 50 µs of idle GPU
                if groups and float(e["ts"]) - (float(groups[-1][-1]["ts"]) + float(groups[-1][-1]["dur"])) < 50:
                    groups[-1].append(e)
                else:
                    groups.append([e])
            most = max(len(g) for g in groups)
            groups = [g for g in groups if len(g) >= most // 2]   # a call's graph (an input copy alone is not)
            spans = [g[-1]["ts"] + g[-1]["dur"] - g[0]["ts"] for g in groups]
            rec: dict[str, Any] = {"warmup_s": round(warm, 1), "event_us": {"median": _median(ev),
                                                                             "p10": round(tg.percentile(ev, .1), 2),
                                                                             "p90": round(tg.percentile(ev, .9), 2)},
                                   "span_us": _median(spans), "activities_per_call": [len(g) for g in groups],
                                   "kernel_us_per_call": _median([sum(float(e["dur"]) for e in g) for g in groups])}
            if n == 1:
                prof = profile([("model1", step)], reps)
                summ = summarise(prof[0])
                names = [kk["name"] for kk in summ["kernels"]]
                labels, per = label_compiled(names)
                counts = [1 if c == "step" else s.layers for c in per]
                r = record_ops("hf_compiled", s, batch, kv_len, reps, [("model1", counts, labels, summ)])
                r["labels_ok"] = sum(1 for n_ in names if gemm(n_)) == 8
                r["sequence"] = [[lab, c, kk["name"], kk["us_cold"]] for lab, c, kk in
                                 zip(labels, counts, summ["kernels"], strict=True)]
                out["ops"] = r
        out["layers"][str(n)] = rec
        torch.cuda.empty_cache()
    out["transformers"] = __import__("transformers").__version__
    return out


def trace_step(name: str, batch: int, kv_len: int, dest: Path) -> dict[str, Any]:
    """A torch.profiler Chrome trace of three decode steps of the whole compiled model (``prof.step()``
    between them), gzipped to ``dest``; the steps' CUDA-event times beside it."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile
    torch._dynamo.reset()
    config = hf.hf_config(name)
    model = hf.build(config, "cuda")
    cache = hf.new_cache("hf_compiled", config, kv_len + 56)
    fwd = torch.compile(model.forward, **hf.COMPILE_KW)
    with torch.inference_mode():
        first = hf.prefill(model, cache, batch, kv_len, config.vocab_size)
        step = lambda: fwd(input_ids=first, past_key_values=cache, use_cache=True)  # noqa: E731
        for _ in range(5):
            step()
        ev = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            ev.append(a.elapsed_time(b) * 1000.0)
        with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
                torch.cuda.synchronize()
                prof.step()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.json"
        prof.export_chrome_trace(str(path))
        dest.write_bytes(gzip.compress(path.read_bytes(), 9))
    return {"model": name, "batch": batch, "kv_len": kv_len,
            "event_us": {"median": _median(ev), "min": round(min(ev), 2)}, "trace": dest.name,
            "bytes": dest.stat().st_size}


def graph_launch(nodes: tuple[int, ...] = (25, 50, 100, 200, 400), calls: int = 30) -> dict[str, Any]:
    """What launching a CUDA graph of N small kernels costs before its first kernel runs, the GPU idle:
    per N, the CUDA-event time of one replay from idle (``one``), of two replays back to back
    (``two``: the second launch overlaps the first's run), and ``launch = 2 one - two`` (the part of a
    replay that is not the GPU running its kernels), medians over ``calls``."""
    x = torch.zeros(1024, device="cuda")
    out: dict[str, Any] = {}
    for n in nodes:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x.add_(1.0)
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=s):
                for _ in range(n):
                    x.add_(1.0)
        torch.cuda.synchronize()

        def timed(reps: int, g: Any = g) -> float:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            for _ in range(reps):
                g.replay()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) * 1000.0
        for _ in range(3):
            timed(1)
        one = [timed(1) for _ in range(calls)]
        two = [timed(2) for _ in range(calls)]
        o, w = statistics.median(one), statistics.median(two)
        out[str(n)] = {"one_us": round(o, 2), "two_us": round(w, 2), "launch_us": round(2 * o - w, 2)}
    return out


def eager_steps(models: list[str], batches: list[int], kv_len: int, steps: int = 50) -> dict[str, Any]:
    """Whole eager steps (``hf.run_case``), timed as ``hf.py`` times them: the check of the predictions
    (committed before this runs), never fitted."""
    out: dict[str, Any] = {}
    for m in models:
        config = hf.hf_config(m)
        model = hf.build(config, "cuda")
        for b in batches:
            row = hf.run_case("hf", model, config, b, kv_len, 5, steps)
            row.pop("first_logits")
            row.pop("kernels_by_name")
            out[f"{m}-b{b}-kv{kv_len}"] = row
            print(f"hf step {m} b{b}: {row['step_us']['median']} us", flush=True)
        del model
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(FIT_MODELS))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--kv", type=int, default=1024)
    ap.add_argument("--host-calls", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds; parts not started in time are skipped")
    ap.add_argument("--trace", default="", help="MODEL:BATCH of a whole compiled step to trace (item 4), last")
    ap.add_argument("--compiled-layers", default="1,2", help="layers of the first compiled case's models")
    ap.add_argument("--graph-launch", action="store_true", help="the graph-launch microbenchmark, first")
    ap.add_argument("--steps", default="", help="MODEL,... whose whole eager steps to measure (a check), last")
    a = ap.parse_args(argv)
    t_end = time.time() + a.budget
    out = Path(a.out)
    import transformers
    res: dict[str, Any] = {"env": {"torch": torch.__version__, "transformers": transformers.__version__,
                                   "gpu": torch.cuda.get_device_name(), "python": platform.python_version(),
                                   "kernel": platform.release(), "cpus": os.cpu_count(),
                                   "cpu": next((ln.split(":", 1)[1].strip() for ln in
                                                Path("/proc/cpuinfo").read_text().splitlines()
                                                if ln.startswith("model name")), ""),
                                   "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                   "command": "python3 -m validation.stacks.hf_ops " + " ".join(argv or sys.argv[1:])},
                           "hf": {}, "hf_compiled": {}, "errors": {}}

    def save() -> None:
        out.write_text(json.dumps(res, separators=(",", ":")) + "\n")

    models = [m for m in a.models.split(",") if m]
    batches = [int(b) for b in a.batches.split(",") if b]
    if a.graph_launch:
        res["graph_launch"] = graph_launch()
        print(f"graph launch: {res['graph_launch']}", flush=True)
    jobs: list[tuple[str, str, int]] = [("hf", m, b) for m in models for b in batches]
    jobs += [("hf_compiled", m, b) for m in models for b in batches]
    for stack, m, b in jobs:
        key = f"{m}-b{b}-kv{a.kv}"
        if time.time() > t_end - (40 if stack == "hf_compiled" else 15):
            res["errors"][f"{stack}-{key}"] = "skipped (budget)"
            print(f"{stack} {key}: skipped (budget)", flush=True)
            continue
        t0 = time.time()
        try:
            if stack == "hf":
                res["hf"][key] = eager_case(m, b, a.kv, a.host_calls, a.reps)
                h = res["hf"][key]["host_us"]
                print(f"hf {key}: layer {h['layer']['median']} us host, model1 {h['model1']['median']} us, "
                      f"{res['hf'][key]['layer_kernels']} kernels a layer ({time.time() - t0:.0f} s)", flush=True)
            else:
                first_case = m == models[0] and b == batches[0]
                layers = tuple(int(x) for x in a.compiled_layers.split(",")) if first_case else (1,)
                res["hf_compiled"][key] = compiled_case(m, b, a.kv, layers, a.reps)
                c = res["hf_compiled"][key]
                print(f"hf_compiled {key}: " + ", ".join(f"{n} layer(s) event {r['event_us']['median']} us span "
                                                         f"{r['span_us']} us" for n, r in c["layers"].items())
                      + f", labels_ok {c.get('ops', {}).get('labels_ok')} ({time.time() - t0:.0f} s)", flush=True)
        except Exception as e:  # one failed case must not lose the others
            res["errors"][f"{stack}-{key}"] = f"{type(e).__name__}: {e}"[:1500] + "\n" + traceback.format_exc()[-2500:]
            print(f"{stack} {key}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        save()
        torch.cuda.empty_cache()
    if a.trace and time.time() < t_end - 45:
        m, b = a.trace.split(":")
        try:
            res["trace"] = trace_step(m, int(b), a.kv, out.parent / f"trace-hf_compiled-{m}-b{b}.json.gz")
            print(f"trace: {res['trace']}", flush=True)
        except Exception as e:
            res["errors"]["trace"] = f"{type(e).__name__}: {e}"[:1500] + "\n" + traceback.format_exc()[-2500:]
            print(f"trace failed: {e}", flush=True)
    if a.steps and time.time() < t_end - 20:
        try:
            res["hf_steps"] = eager_steps([m for m in a.steps.split(",") if m], batches, a.kv)
        except Exception as e:
            res["errors"]["hf_steps"] = f"{type(e).__name__}: {e}"[:1500] + "\n" + traceback.format_exc()[-2500:]
            print(f"steps failed: {e}", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

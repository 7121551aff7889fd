"""The host's costs of the transformers stacks (``hf``, ``hf_compiled``), measured so that a drift of the
host's speed falls on the fit's inputs and on the check alike: one process, interleaved rounds.

The device host's speed moves: the same eager step measured 2.5-3x apart on two days and within one
process minutes apart (``validation/results/h200-stacks/hf/README.md``, "Why the first predictions
missed"), so single modules timed at one moment and whole steps at another compare two hosts. Here,
in one process, each **round** runs, in this order:

1. a **host probe**: a fixed pure-Python loop and a fixed loop of small torch dispatches (µs each);
2. the **fit's inputs**: for each fitted model (``--fit-models``) and batch, each single module of
   layer 0 called ``--calls`` times (median kept; the modules of ``hf_ops.py``: the decoder layer, its
   norms, attention and MLP, each projection, RoPE, the cache's update, the embedding), and models of
   the same config with 1, 2 and 4 layers (their whole forward: what a step does outside its layers
   and what a layer costs inside a model);
3. the **check**: one whole eager step of every model (``--fit-models`` and ``--held-out``) at every
   batch, the dynamic cache cropped back to ``kv`` positions before it (so every round times the same
   step), a CUDA event pair around the forward call, synchronised, and the host's own time of the call;
4. the compiled stack's rounds (after all of its compiles): each compiled small model (1, 2, 4, 8
   layers of the fitted models) and each compiled whole model, one call each, with the host's part
   before the graph's launch measured directly: ``CUDAGraphNode.run_graph`` (cudagraph trees' replay)
   is wrapped to record a CUDA event and the host clock just before the replay, so a call splits into
   ``pre_us`` (CUDA event before the call to the one before the replay: Dynamo's guards, the
   pre-graph bytecode, AOT's prologue, cudagraph trees' input checks and copies, on an idle GPU) and
   ``graph_us`` (the replay to the end of the step), plus the host's own launch and post-launch time.

With each round: the main thread's CPU time, the process's involuntary context switches, the machine's
steal time (``/proc/stat``), the time the garbage collector paused the process. The host's state is
then in the data: a slow round shows in the probe, in the modules and in the steps together.

Each compiled (model, batch) gets a copy of the forward's code object: Dynamo keeps its compiled
entries per code object, and all of transformers' models share one decorated ``forward`` wrapper, so
without the copy every call would first evaluate the guards of the other models' entries (and hit the
recompile limit). A copy compiles one static graph for its one batch, as a user who decodes at one
batch size gets.

Writes one JSON (``--out``); ``hf_host_fit.py`` fits the profiles' host costs to its fit part only (the
modules and small models of ``--fit-models``) and holds them against its whole steps. Run on the device:

    python3 -m validation.stacks.hf_host --out $OUT/hf-host.json --budget 500
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from validation.stacks import hf
from validation.stacks.hf_ops import capture, crop, timed_modules, with_layers

FIT_MODELS = ("llama-3.2-1b", "llama-3.1-8b")
HELD_OUT = ("mistral-7b", "qwen3-8b", "llama-3.2-3b", "qwen2.5-7b")
EAGER_SMALL = (1, 2, 4)
COMPILED_SMALL = (1, 2, 4, 8)
COMPILED_WHOLE = ("llama-3.2-1b", "mistral-7b", "llama-3.1-8b", "qwen3-8b")
#: seconds a whole model's compile took, batch 1 and 8 (``hf/step-hf_compiled-*.json`` warmup_s, raised to
#: hf-host-r1's where that took longer): what the budget guard expects before it starts one
COMPILE_S = {"llama-3.2-1b": (29, 83), "llama-3.1-8b": (53, 61), "qwen3-8b": (51, 85), "mistral-7b": (81, 90)}
PROBE_PY, PROBE_TORCH = 20000, 200


# -- the host's state --------------------------------------------------------------------------------
class GCPause:
    """The time the cyclic garbage collector held the process, accumulated (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.total_s, self.count, self._t = 0.0, 0, 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.total_s += time.perf_counter() - self._t
            self.count += 1


def steal_ticks() -> tuple[int, int]:
    """(steal, all) jiffies of the machine's CPUs from ``/proc/stat`` ((0, 0) where unreadable)."""
    try:
        f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        xs = [int(x) for x in f]
        return (xs[7] if len(xs) > 7 else 0), sum(xs)
    except (OSError, ValueError, IndexError):
        return 0, 0


def state(gcp: GCPause) -> dict[str, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    steal, total = steal_ticks()
    return {"wall": time.perf_counter(), "thread_cpu": time.thread_time(), "nivcsw": ru.ru_nivcsw,
            "steal": steal, "ticks": total, "gc_s": gcp.total_s, "gc_n": gcp.count}


def state_delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    wall = b["wall"] - a["wall"]
    ticks = b["ticks"] - a["ticks"]
    return {"wall_s": round(wall, 4), "thread_cpu_share": round((b["thread_cpu"] - a["thread_cpu"]) / wall, 3)
            if wall > 0 else 0.0, "nivcsw": int(b["nivcsw"] - a["nivcsw"]),
            "steal_share": round((b["steal"] - a["steal"]) / ticks, 4) if ticks > 0 else 0.0,
            "gc_ms": round((b["gc_s"] - a["gc_s"]) * 1e3, 2), "gc_n": int(b["gc_n"] - a["gc_n"])}


def probe(x: torch.Tensor) -> dict[str, float]:
    """The host probe: a fixed pure-Python loop and ``PROBE_TORCH`` in-place adds on a small tensor of
    the device (dispatch and launch, no synchronisation inside), µs each."""
    t0 = time.perf_counter()
    s = 0
    for i in range(PROBE_PY):
        s += (i * i) % 7
    t1 = time.perf_counter()
    for _ in range(PROBE_TORCH):
        x.add_(1.0)
    t2 = time.perf_counter()
    if x.is_cuda:
        torch.cuda.synchronize()
    return {"python_us": round((t1 - t0) * 1e6, 1), "torch_us": round((t2 - t1) * 1e6, 1)}


# -- the eager stack -----------------------------------------------------------------------------------
def eager_modules(model: Any, config: Any, batch: int, kv_len: int,
                  small: dict[int, Any]) -> tuple[dict[str, Callable[[], Any]], dict[str, Callable[[], Any]]]:
    """The calls of the fit's inputs at one batch (module docstring, item 2) and what runs untimed before
    each (the caches cropped back). ``small``: models of the same config with 1, 2, 4 layers."""
    inner = model.model
    mods = timed_modules(model)
    attn = mods["attn"]
    cache = hf.new_cache("hf", config, 0)
    first = hf.prefill(model, cache, batch, kv_len, config.vocab_size)
    got = capture(model, mods, lambda: model(input_ids=first, past_key_values=cache, use_cache=True))
    crop(cache, kv_len)
    mod_py = sys.modules[type(attn).__module__]
    q_in = got["q"][0][0]
    b, hd = q_in.shape[0], attn.head_dim
    q = attn.q_proj(q_in).view(b, 1, -1, hd).transpose(1, 2)
    k = attn.k_proj(q_in).view(b, 1, -1, hd).transpose(1, 2)
    v = attn.v_proj(q_in).view(b, 1, -1, hd).transpose(1, 2)
    cos, sin = inner.rotary_emb(*got["rotary"][0], **got["rotary"][1])

    def call(key: str) -> Callable[[], Any]:
        a, kw = got[key]
        m = mods[key]
        return lambda: m(*a, **kw)

    calls: dict[str, Callable[[], Any]] = {key: call(key) for key in got}
    calls["rope"] = lambda: mod_py.apply_rotary_pos_emb(q, k, cos, sin)
    calls["cache_update"] = lambda: cache.update(k, v, 0)
    back = lambda: crop(cache, kv_len)  # noqa: E731
    before: dict[str, Callable[[], Any]] = {key: back for key in ("layer", "attn", "cache_update")}
    for n, m in small.items():
        c = hf.new_cache("hf", m.config, 0)
        ids = hf.prefill(m, c, batch, kv_len, config.vocab_size)
        crop(c, kv_len)
        calls[f"model{n}"] = _forward(m, c, ids)
        before[f"model{n}"] = _crop(c, kv_len)
    return calls, before


def _forward(model: Any, cache: Any, ids: torch.Tensor) -> Callable[[], Any]:
    return lambda: model(input_ids=ids, past_key_values=cache, use_cache=True)


def _crop(cache: Any, n: int) -> Callable[[], None]:
    return lambda: crop(cache, n)


def eager_step(model: Any, config: Any, batch: int, kv_len: int) -> Callable[[], dict[str, float]]:
    """One whole eager step at ``kv_len`` (the cache cropped back before it): its CUDA-event time and
    the host's time of the forward call, µs."""
    cache = hf.new_cache("hf", config, 0)
    ids = hf.prefill(model, cache, batch, kv_len, config.vocab_size)
    cuda = ids.is_cuda

    def run() -> dict[str, float]:
        crop(cache, kv_len)
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        t1 = time.perf_counter()
        if cuda:
            b.record()
            b.synchronize()
            step = a.elapsed_time(b) * 1000.0
        else:
            step = (time.perf_counter() - t0) * 1e6
        return {"step_us": round(step, 1), "host_us": round((t1 - t0) * 1e6, 1)}
    return run


# -- the compiled stack --------------------------------------------------------------------------------
class ReplayClock:
    """Wraps cudagraph trees' replay (``CUDAGraphNode.run_graph``): the host clock and a CUDA event just
    before it, the host clock just after it, for the latest replay."""

    def __init__(self) -> None:
        from torch._inductor import cudagraph_trees as ct
        self.cls = ct.CUDAGraphNode
        self.orig = self.cls.run_graph
        self.last: dict[str, Any] = {}
        clock = self

        def run_graph(node: Any) -> None:
            ev = torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            ev.record()
            clock.orig(node)
            clock.last = {"t_pre": t0, "t_post": time.perf_counter(), "event": ev}
        setattr(self.cls, "run_graph", run_graph)  # noqa: B010 (a method replaced: mypy refuses the plain form)

    def restore(self) -> None:
        setattr(self.cls, "run_graph", self.orig)  # noqa: B010


def own_forward(model: Any) -> Callable[..., Any]:
    """``model.forward`` bound to a copy of its code object (module docstring: one Dynamo cache per
    compiled case)."""
    f = type(model).forward
    g = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    g.__kwdefaults__ = f.__kwdefaults__
    g.__dict__.update(f.__dict__)
    g.__wrapped__ = getattr(f, "__wrapped__", f)  # type: ignore[attr-defined]
    return types.MethodType(g, model)


def guard_count(fn: Any) -> int | None:
    """Dynamo's guards on the compiled entries of ``fn``'s code (None where this torch hides them)."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
        code = fn.__func__.__code__ if hasattr(fn, "__func__") else fn.__code__

        def count(m: Any) -> int:
            return len(m.get_leaf_guards()) + sum(count(c) for c in m.get_child_managers())
        return sum(count(e.guard_manager.root) for e in _debug_get_cache_entry_list(code))
    except Exception:
        return None


def compiled_case(model: Any, config: Any, batch: int, kv_len: int, calls_max: int) -> dict[str, Any]:
    """A compiled (model, batch): its own compiled forward, a static cache for ``calls_max`` more calls,
    the prefill and five warm-up calls (the compile). Returns ``{"call": ..., facts}``."""
    own = own_forward(model)
    fwd = torch.compile(own, **hf.COMPILE_KW)
    cache = hf.new_cache("hf_compiled", config, kv_len + 8 + calls_max)
    t0 = time.time()
    ids = hf.prefill(model, cache, batch, kv_len, config.vocab_size)
    for _ in range(5):
        torch.compiler.cudagraph_mark_step_begin()
        fwd(input_ids=ids, past_key_values=cache, use_cache=True)
    torch.cuda.synchronize()
    tensors = sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers())
    facts = {"layers": int(config.num_hidden_layers), "batch": batch, "compile_s": round(time.time() - t0, 1),
             "param_tensors": tensors, "cache_tensors": 2 * int(config.num_hidden_layers),
             "guards": guard_count(own)}
    return {"call": lambda: fwd(input_ids=ids, past_key_values=cache, use_cache=True), **facts}


def compiled_call(call: Callable[[], Any], clock: ReplayClock) -> dict[str, float] | None:
    """One compiled call, split at its graph's replay (module docstring, item 4); None if no replay ran
    (cudagraphs skipped)."""
    torch.compiler.cudagraph_mark_step_begin()
    clock.last = {}
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    t0 = time.perf_counter()
    call()
    t1 = time.perf_counter()
    b.record()
    b.synchronize()
    got = clock.last
    if not got:
        return None
    return {"step_us": round(a.elapsed_time(b) * 1000.0, 1), "pre_us": round(a.elapsed_time(got["event"]) * 1000.0, 1),
            "graph_us": round(got["event"].elapsed_time(b) * 1000.0, 1),
            "host_pre_us": round((got["t_pre"] - t0) * 1e6, 1),
            "host_launch_us": round((got["t_post"] - got["t_pre"]) * 1e6, 1),
            "host_post_us": round((t1 - got["t_post"]) * 1e6, 1)}


# -- the run -------------------------------------------------------------------------------------------
def _med(xs: list[float]) -> float:
    return round(statistics.median(xs), 1)


def env(argv: list[str]) -> dict[str, Any]:
    import transformers
    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name() if cuda else "cpu", "python": platform.python_version(),
            "kernel": platform.release(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                         if ln.startswith("model name")), ""),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "python3 -m validation.stacks.hf_host " + " ".join(argv)}


def eager_rounds(models: dict[str, tuple[Any, Any]], fit: list[str], batches: list[int], kv_len: int,
                 calls_n: int, seconds: float, t_end: float, max_rounds: int, gcp: GCPause,
                 small: dict[str, dict[int, Any]], log: Callable[[str], None]) -> dict[str, Any]:
    """Rounds of (probe, the fit's modules and small models, every model's whole step) for ``seconds``
    after the warm-up (not past ``t_end``); per round and case the median of each module's ``calls_n``
    calls and the step's times (module docstring)."""
    dev = next(iter(models.values()))[0].lm_head.weight.device
    x = torch.zeros(256, device=dev)
    mods = {}
    for m in fit:
        model, config = models[m]
        for b in batches:
            mods[f"{m}-b{b}-kv{kv_len}"] = eager_modules(model, config, b, kv_len, small[m])
    steps = {f"{m}-b{b}-kv{kv_len}": eager_step(*models[m], b, kv_len) for m in models for b in batches}
    for calls, before in mods.values():   # warm
        for key, fn in calls.items():
            if key in before:
                before[key]()
            fn()
    for fn in steps.values():
        fn()
    out: dict[str, Any] = {"rounds": [], "modules": {c: {k: [] for k in calls} for c, (calls, _) in mods.items()},
                           "steps": {c: [] for c in steps}}
    order = list(steps)
    deadline = min(time.time() + seconds, t_end)
    r = 0
    while r < max_rounds and time.time() < deadline:
        s0 = state(gcp)
        rec: dict[str, Any] = {"probe": probe(x)}
        t_mod = time.perf_counter()
        for case, (calls, before) in mods.items():
            for key, fn in calls.items():
                pre, ts = before.get(key), []
                for _ in range(calls_n):
                    if pre is not None:
                        pre()
                    t0 = time.perf_counter()
                    fn()
                    ts.append((time.perf_counter() - t0) * 1e6)
                out["modules"][case][key].append(_med(ts))
            if dev.type == "cuda":
                torch.cuda.synchronize()
        rec["modules_s"] = round(time.perf_counter() - t_mod, 3)
        for case in order[r % len(order):] + order[:r % len(order)]:   # a rotating start
            out["steps"][case].append(steps[case]())
        rec["state"] = state_delta(s0, state(gcp))
        out["rounds"].append(rec)
        r += 1
        if r % 10 == 0:
            log(f"eager round {r}: probe {rec['probe']}, state {rec['state']}")
    return out


def compiled_rounds(cases: dict[str, dict[str, Any]], deadline: float, max_rounds: int, gcp: GCPause,
                    clock: ReplayClock, log: Callable[[str], None]) -> dict[str, Any]:
    x = torch.zeros(256, device="cuda")
    out: dict[str, Any] = {"rounds": [], "calls": {c: [] for c in cases}}
    order = list(cases)
    r = 0
    while r < max_rounds and time.time() < deadline:
        s0 = state(gcp)
        rec: dict[str, Any] = {"probe": probe(x)}
        for case in order[r % len(order):] + order[:r % len(order)]:
            out["calls"][case].append(compiled_call(cases[case]["call"], clock))
        rec["state"] = state_delta(s0, state(gcp))
        out["rounds"].append(rec)
        r += 1
        if r % 10 == 0:
            log(f"compiled round {r}: probe {rec['probe']}, state {rec['state']}")
    return out


def count_steps(models: dict[str, tuple[Any, Any]], batches: list[int], kv_len: int) -> dict[str, Any]:
    """Kernels and GPU busy time of one eager step of each case (torch.profiler: run last, after every
    timing, so that the profiler's state cannot touch them)."""
    from validation.stacks import torch_graph as tg
    out = {}
    for m, (model, config) in models.items():
        for b in batches:
            cache = hf.new_cache("hf", config, 0)
            ids = hf.prefill(model, cache, b, kv_len, config.vocab_size)
            p = tg.count_kernels(lambda model=model, ids=ids, cache=cache: model(input_ids=ids, past_key_values=cache,
                                                                                 use_cache=True))
            out[f"{m}-b{b}-kv{kv_len}"] = {"kernels": p["kernels"], "gpu_busy_us": p["gpu_busy_us"]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--fit-models", default=",".join(FIT_MODELS))
    ap.add_argument("--held-out", default=",".join(HELD_OUT))
    ap.add_argument("--compiled-whole", default=",".join(COMPILED_WHOLE), help="'' for none")
    ap.add_argument("--compiled-small", default=",".join(str(n) for n in COMPILED_SMALL), help="'' for none")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--kv", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=3, help="calls of each module a round (median kept)")
    ap.add_argument("--eager-s", type=float, default=90.0, help="seconds of eager rounds")
    ap.add_argument("--rounds", type=int, default=200, help="at most this many rounds of each stack")
    ap.add_argument("--budget", type=float, default=500.0, help="seconds; compiles not begun in time are skipped")
    ap.add_argument("--reserve-s", type=float, default=120.0,
                    help="seconds of the budget kept for the compiled rounds: no compile begins in them")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    t_start = time.time()
    t_end = t_start + a.budget
    out = Path(a.out)
    res: dict[str, Any] = {"env": env(sys.argv[1:] if argv is None else argv), "kv_len": a.kv, "errors": {},
                           "skipped": []}
    fit = [m for m in a.fit_models.split(",") if m]
    held = [m for m in a.held_out.split(",") if m]
    batches = [int(b) for b in a.batches.split(",") if b]
    res["fit_models"], res["held_out"], res["batches"] = fit, held, batches

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:6.1f} s] {msg}", flush=True)

    def save() -> None:
        out.write_text(json.dumps(res, separators=(",", ":")) + "\n")

    gcp = GCPause()
    torch._dynamo.config.cache_size_limit = 64   # small models and whole models: many compiled cases
    models: dict[str, tuple[Any, Any]] = {}
    with torch.inference_mode():
        whole = [m for m in a.compiled_whole.split(",") if m] if a.device == "cuda" else []
        for m in dict.fromkeys(fit + held + whole):   # a compiled whole model need not be an eager one
            config = hf.hf_config(m)
            models[m] = (hf.build(config, a.device), config)
            log(f"built {m}")
        if a.eager_s <= 0:
            small: dict[str, dict[int, Any]] = {}
            res["skipped"].append("eager (--eager-s 0)")
        else:
            small = {m: {n: hf.build(with_layers(models[m][1], n), a.device) for n in EAGER_SMALL} for m in fit}
            try:
                eager_models = {m: models[m] for m in fit + held}
                res["eager"] = eager_rounds(eager_models, fit, batches, a.kv, a.calls, a.eager_s, t_end, a.rounds, gcp,
                                            small, log)
                log(f"eager: {len(res['eager']['rounds'])} rounds")
            except Exception as e:
                res["errors"]["eager"] = f"{type(e).__name__}: {e}"[:1500] + "\n" + traceback.format_exc()[-2500:]
                log(f"eager failed: {e}")
        save()
        del small
        if a.device == "cuda":
            clock = ReplayClock()
            cases: dict[str, dict[str, Any]] = {}
            sizes = [int(n) for n in a.compiled_small.split(",") if n]
            plan: list[tuple[str, str, int, int | None]] = [("small", m, b, n) for m in fit for n in sizes
                                                            for b in batches]
            plan += [("whole", m, b, None) for b in batches for m in whole]   # every model's b1 before any b8
            calls_max = a.rounds + 8
            for kind, m, b, n in plan:
                key = f"{m}-{n}L-b{b}-kv{a.kv}" if n else f"{m}-b{b}-kv{a.kv}"
                need = 8.0 if n else 1.3 * COMPILE_S.get(m, (60, 90))[batches.index(b) if b in batches else 0]
                if time.time() + need + a.reserve_s > t_end:
                    res["skipped"].append(f"compiled {key} (budget)")
                    log(f"compiled {key}: skipped (budget)")
                    continue
                try:
                    if n is not None:
                        mod = hf.build(with_layers(models[m][1], n), "cuda")
                        cfg = mod.config
                    else:
                        mod, cfg = models[m]
                    c = compiled_case(mod, cfg, b, a.kv, calls_max)
                    c["kind"], c["model"] = kind, m
                    cases[key] = c
                    log(f"compiled {key}: {c['compile_s']} s, guards {c['guards']}")
                except Exception as e:
                    res["errors"][f"compiled {key}"] = (f"{type(e).__name__}: {e}"[:1500]
                                                        + traceback.format_exc()[-2000:])
                    log(f"compiled {key} failed: {e}")
            res["compiled_cases"] = {k: {f: v for f, v in c.items() if f != "call"} for k, c in cases.items()}
            save()
            if cases:
                try:
                    res["compiled"] = compiled_rounds(cases, t_end - 25, a.rounds, gcp, clock, log)
                    log(f"compiled: {len(res['compiled']['rounds'])} rounds")
                except Exception as e:
                    res["errors"]["compiled"] = f"{type(e).__name__}: {e}"[:1500] + traceback.format_exc()[-2000:]
            clock.restore()
            save()
            if time.time() < t_end - 15:   # the profiler last: its state cannot touch a timing
                try:
                    res["eager_kernels"] = count_steps(models, batches, a.kv)
                    from validation.stacks import torch_graph as tg
                    for key, c in cases.items():
                        if c["kind"] == "whole":
                            torch.compiler.cudagraph_mark_step_begin()
                            p = tg.count_kernels(c["call"])
                            res["compiled_cases"][key].update(kernels=p["kernels"], gpu_busy_us=p["gpu_busy_us"])
                except Exception as e:
                    res["errors"]["kernels"] = f"{type(e).__name__}: {e}"[:1500]
    res["wall_s"] = round(time.time() - t_start, 1)
    save()
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

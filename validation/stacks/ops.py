"""Single-op profiles of each stack: implementation profiles are fitted to single ops only.

Each *unit* runs alone after a 256 MiB write that evicts L2 (``EVICT_BYTES``; an ``int32`` buffer's
``bitwise_not_``, whose kernel also marks the unit boundaries in the trace), ``reps`` times, under
``torch.profiler``; the Chrome trace gives every kernel's name, grid, block and duration, and a kernel's
``us_cold`` is the median of its durations over the reps.

- ``torch_graph``: a unit is one op of the eager step (``eager_ops``), at the shapes it meets in the step
  (layer 0's weights and caches): each op is timed alone, cold.
- ``inductor_graph``: a unit is one compiled function of the step (prologue, block, tail: the same
  compiled code the step replays, no recompiling of single ops, so the fusion is the step's). L2 is
  evicted before each function; inside it a kernel finds in L2 what its predecessors left, as inside a
  step. Its kernels are mapped to ops by ``map_inductor_kernels``: cuBLAS GEMMs by their order in the
  block (qkv, o_proj, gate_up, down; lm_head in the tail), attention kernels by name, and each fused
  Triton kernel to the ops of the segment between GEMMs it sits in (its name lists the fused aten ops).

``bytes`` is an op's essential traffic (weights, KV cache, the activations at the op's boundary, bf16);
a kernel carries it only when it is its op's only kernel, else null. The whole-step time is never used.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from validation.stacks import torch_graph as tg

EVICT_BYTES = 256 << 20
SENTINEL = "bitwise_not"
SCHEMA = "mksim.stacks.ops/1"
GEMM_KEYS = ("gemm", "nvjet", "splitkreduce", "cublas", "cutlass", "xmma", "gemv")
ATTENTION_KEYS = ("sdpa", "flash", "fmha", "attention", "lean_reduction", "cudnn")


@dataclass(frozen=True)
class Unit:
    """Something run alone between two evictions: an op (eager) or a compiled function (inductor)."""
    name: str
    fn: Callable[[], Any]
    count: int                    # times per step
    nbytes: int | None = None     # its essential bytes where the shape alone does not say (the experts read)


def op_bytes(s: tg.Shape, batch: int, kv_len: int, es: int = 2) -> dict[str, int]:
    """Essential bytes of each eager op (read + written, ``es`` bytes per element)."""
    b, h, i, hd = batch, s.hidden, s.intermediate, s.head_dim
    nqkv = s.q_size + 2 * s.kv_size
    norm = (2 * b * h + h) * es
    return {
        "embed": 2 * b * h * es, "rope_table": 4 * b * hd * es, "residual_add": 3 * b * h * es,
        "attn_norm": norm, "qkv": (nqkv * h + b * h + b * nqkv + (nqkv if s.attention_bias else 0)) * es,
        "qk_norm": (2 * b * (s.q_size + s.kv_size) + 2 * hd) * es,
        "rope": (2 * b * (s.q_size + s.kv_size) + 2 * b * hd) * es, "kv_write": 4 * b * s.kv_size * es,
        "attention": (2 * b * s.kv_size * (kv_len + 1) + 2 * b * s.q_size) * es,
        "o_proj": (h * s.q_size + b * s.q_size + 2 * b * h) * es, "mlp_norm": norm,
        "gate_up": (2 * i * h + b * h + 2 * b * i) * es, "silu_mul": 3 * b * i * es,
        "down": (h * i + b * i + b * h) * es, "final_norm": norm,
        "lm_head": (s.vocab * h + b * h + b * s.vocab) * es}


def eager_ops(s: tg.Shape, w: dict[str, Any], tokens: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, kv_len: int) -> list[Unit]:
    """The ops of ``torch_graph.decode_step`` as separate calls, each on inputs of its step shape."""
    b, dev, dt = tokens.shape[0], tokens.device, w["embed"].dtype
    g = torch.Generator(device=dev).manual_seed(5)

    def act(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g, device=dev, dtype=torch.float32).to(dt)

    lw, n = w["layers"][0], s.layers
    x, dres = act(b, s.hidden), act(b, s.hidden)
    # q, k, v as the step has them: strided views of the fused qkv output; rotated q, k contiguous
    qs, ks, vs = act(b, s.q_size + 2 * s.kv_size).split([s.q_size, s.kv_size, s.kv_size], dim=-1)
    q, k, v = (qs.view(b, s.heads, 1, s.head_dim), ks.view(b, s.kv_heads, 1, s.head_dim),
               vs.view(b, s.kv_heads, 1, s.head_dim))
    q_rot, k_rot, a = act(b, s.heads, 1, s.head_dim), act(b, s.kv_heads, 1, s.head_dim), act(b, s.intermediate)
    _, cos, sin = tg.embed_and_rope(s, w["embed"], tokens, pos)
    attn, gu = act(b, s.q_size), act(b, 2 * s.intermediate)
    kc, vc, gqa = k_cache[0], v_cache[0], s.kv_heads != s.heads

    def kv_write() -> None:
        kc[:, :, kv_len: kv_len + 1] = k_rot
        vc[:, :, kv_len: kv_len + 1] = v

    def silu_mul() -> torch.Tensor:
        gate, up = gu.chunk(2, dim=-1)
        return F.silu(gate) * up

    units = [
        Unit("embed", lambda: F.embedding(tokens, w["embed"]), 1),
        Unit("rope_table", lambda: tg.rope_cos_sin(pos, s.head_dim, s.rope_theta, dt), 1),
        Unit("residual_add", lambda: x + dres, n),
        Unit("attn_norm", lambda: tg.rms_norm(x, lw["in_norm"], s.eps), n),
        Unit("qkv", lambda: F.linear(x, lw["wqkv"], lw["bqkv"]), n)]
    if s.qk_norm:
        if s.qk_norm_full:  # OLMoE: one norm over all heads
            units.append(Unit("qk_norm", lambda: (tg.rms_norm(qs.reshape(b, -1), lw["q_norm"], s.eps),
                                                  tg.rms_norm(ks.reshape(b, -1), lw["k_norm"], s.eps)), n))
        else:
            units.append(Unit("qk_norm", lambda: (tg.rms_norm(q, lw["q_norm"], s.eps),
                                                  tg.rms_norm(k, lw["k_norm"], s.eps)), n))
    units += [
        Unit("rope", lambda: (tg.rope(q, cos, sin), tg.rope(k, cos, sin)), n),
        Unit("kv_write", kv_write, n),
        Unit("attention", lambda: F.scaled_dot_product_attention(q_rot, kc, vc, enable_gqa=gqa), n),
        Unit("o_proj", lambda: x + F.linear(attn, lw["wo"]), n),
        Unit("mlp_norm", lambda: tg.rms_norm(x, lw["post_norm"], s.eps), n)]
    dense = [i for i in range(n) if not s.sparse(i)]
    if dense:
        dw = w["layers"][dense[0]]
        units += [Unit("gate_up", lambda: F.linear(x, dw["wgu"]).chunk(2, dim=-1), len(dense)),
                  Unit("silu_mul", silu_mul, len(dense)),
                  Unit("down", lambda: F.linear(a, dw["wdown"]), len(dense))]
    if len(dense) < n:
        units += moe_units(s, w["layers"][next(i for i in range(n) if s.sparse(i))], x, n - len(dense))
    units += [
        Unit("final_norm", lambda: tg.rms_norm(x, w["final_norm"], s.eps), 1),
        Unit("lm_head", lambda: F.linear(x, w["lm_head"]), 1)]
    return units


def moe_units(s: tg.Shape, lw: dict[str, Any], h: torch.Tensor, count: int, es: int = 2) -> list[Unit]:
    """A sparse layer's FFN as the eager step runs it (``torch_graph.moe_ffn``), op by op, on ``h`` (the
    normed activations) with the experts its tokens choose: the router linear, softmax + top-k, the sort of
    the (token, slot) rows by expert, the two grouped GEMMs and SiLU*mul between them, the unsort and
    weighted sum, and the shared expert. Each carries its bytes (the grouped GEMMs read the experts chosen)."""
    t, k, hid, ei = h.shape[0], s.top_k, s.hidden, s.expert_intermediate
    topw, topi = tg.route(s, lw, h)
    order, counts, xs = tg.sort_by_expert(s, h, topi)
    offs = counts.cumsum(0).to(torch.int32)
    distinct = int((counts > 0).sum().item())
    gu = torch._grouped_mm(xs, lw["wgu_e"].transpose(1, 2), offs=offs)
    act = F.silu(gu[:, :ei]) * gu[:, ei:]
    ys = torch._grouped_mm(act, lw["wdown_e"].transpose(1, 2), offs=offs)
    rows = t * k

    logits = F.linear(h, lw["router"])

    def topk() -> Any:
        return tg.select(s, lw, logits)

    def permute() -> Any:
        _, c, rows_sorted = tg.sort_by_expert(s, h, topi)
        return c.cumsum(0).to(torch.int32), rows_sorted

    def silu_mul() -> torch.Tensor:
        return F.silu(gu[:, :ei]) * gu[:, ei:]

    def combine() -> torch.Tensor:
        y = torch.empty_like(ys).index_copy_(0, order, ys).view(t, k, hid)
        return (y.float() * topw[..., None]).sum(1).to(h.dtype)

    units = [
        Unit("router", lambda: F.linear(h, lw["router"]), count, (s.experts * hid + t * hid + t * s.experts) * es),
        Unit("topk", topk, count, t * s.experts * es + t * k * 12),
        Unit("permute", permute, count, 2 * rows * hid * es + rows * 8),
        Unit("experts_gate_up", lambda: torch._grouped_mm(xs, lw["wgu_e"].transpose(1, 2), offs=offs), count,
             (distinct * 2 * ei * hid + rows * hid + rows * 2 * ei) * es),
        Unit("experts_silu_mul", silu_mul, count, 3 * rows * ei * es),
        Unit("experts_down", lambda: torch._grouped_mm(act, lw["wdown_e"].transpose(1, 2), offs=offs), count,
             (distinct * hid * ei + rows * ei + rows * hid) * es),
        Unit("combine", combine, count, (2 * rows * hid + t * hid) * es + rows * 12)]
    if lw["wgu_s"] is not None:
        si = s.shared_intermediate
        sgu = F.linear(h, lw["wgu_s"])
        sact = F.silu(sgu[:, :si]) * sgu[:, si:]
        units += [Unit("shared_gate_up", lambda: F.linear(h, lw["wgu_s"]), count,
                       (2 * si * hid + t * hid + 2 * t * si) * es),
                  Unit("shared_down", lambda: F.linear(sact, lw["wdown_s"]), count,
                       (si * hid + t * si + t * hid) * es)]
        if lw["wsg"] is not None:
            units.append(Unit("shared_gate", lambda: torch.sigmoid(F.linear(h, lw["wsg"])), count,
                              (hid + t * hid) * es))
    return units


def is_gemm(name: str) -> bool:
    n = name.lower()
    return not n.startswith("triton") and not is_attention(name) and any(k in n for k in GEMM_KEYS)


def is_attention(name: str) -> bool:
    n = name.lower()
    return not n.startswith("triton") and any(k in n for k in ATTENTION_KEYS)


BLOCK_GEMMS = ("qkv", "o_proj", "gate_up", "down")


def map_inductor_kernels(unit: str, names: list[str], qk_norm: bool) -> list[str]:
    """The op label of each kernel of one compiled function (``prologue``, ``block`` or ``tail``), in
    launch order. A GEMM kernel followed by its split-K reduction kernel is one GEMM."""
    labels: list[str] = []
    if unit == "prologue":
        for n in names:
            parts = [op for op, keys in (("embed", ("embedding",)), ("rope_table", ("cos", "sin")))
                     if any(k in n.lower() for k in keys)]
            labels.append("+".join(parts) or "prologue")
        return labels
    if unit == "tail":
        return ["lm_head" if is_gemm(n) else "residual_add+final_norm" for n in names]
    if unit != "block":
        raise ValueError(f"unknown compiled unit {unit!r}")
    group_of: list[int | None] = []
    groups, prev_gemm = 0, False
    for n in names:
        gemm = is_gemm(n)
        if gemm and not (prev_gemm and "reduce" in n.lower()):   # a split-K reduction joins its GEMM
            groups += 1
        group_of.append(groups - 1 if gemm else None)
        prev_gemm = gemm
    # SDPA lowered to matmuls (the math backend) adds GEMMs between qkv and o_proj: they are attention.
    extra = max(groups - len(BLOCK_GEMMS), 0)
    gemm_labels = ["qkv", *["attention"] * extra, "o_proj", "gate_up", "down"][:max(groups, 0)]
    pre = "qk_norm+rope+kv_write" if qk_norm else "rope+kv_write"
    after = ["residual_add+attn_norm", pre, *["attention"] * extra, "mlp_norm", "silu_mul", "after_down"]
    last, seen_attention = -1, False
    for n, g in zip(names, group_of, strict=True):
        if g is not None:
            last = g
            labels.append(gemm_labels[g] if g < len(gemm_labels) else "unmapped_gemm")
        elif is_attention(n):
            seen_attention = True
            labels.append("attention")
        elif last == 0 and seen_attention:
            labels.append("attention")
        else:
            labels.append(after[min(last + 1, len(after) - 1)])
    return labels


def trace_kernels(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """GPU kernels of a Chrome trace from torch.profiler, in start order: name, grid, block, dur (µs)."""
    ks = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and e.get("ph") == "X"]
    ks.sort(key=lambda e: float(e["ts"]))
    return [{"name": e["name"], "grid": list(e.get("args", {}).get("grid", [])),
             "block": list(e.get("args", {}).get("block", [])), "dur": float(e.get("dur", 0.0))} for e in ks]


def split_units(kernels: list[dict[str, Any]], n_units: int, reps: int) -> list[list[list[dict[str, Any]]]]:
    """Kernels between sentinel (eviction) kernels: [rep][unit] -> kernels. Kernels before the first
    sentinel are dropped; the sentinel count must be ``n_units * reps``."""
    groups: list[list[dict[str, Any]]] = []
    for k in kernels:
        if SENTINEL in k["name"]:
            groups.append([])
        elif groups:
            groups[-1].append(k)
    if len(groups) != n_units * reps:
        raise RuntimeError(f"expected {n_units * reps} eviction kernels in the trace, found {len(groups)}")
    return [groups[r * n_units:(r + 1) * n_units] for r in range(reps)]


def summarise_unit(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per kernel position: name/grid/block of the first run and the median duration over the runs
    that launched the same kernel sequence."""
    names = [k["name"] for k in runs[0]]
    same = [r for r in runs if [k["name"] for k in r] == names]
    out = [{"name": k["name"], "grid": k["grid"], "block": k["block"],
            "us_cold": round(statistics.median(r[i]["dur"] for r in same), 2)} for i, k in enumerate(runs[0])]
    return {"kernels": out, "runs_agreeing": len(same), "runs": len(runs)}


def outputs_equal(a: Any, b: Any) -> bool | None:
    """Bitwise equality of two op outputs (tensor or tuple of tensors); None when there is no output."""
    ta = [a] if isinstance(a, torch.Tensor) else [t for t in (a or ()) if isinstance(t, torch.Tensor)]
    tb = [b] if isinstance(b, torch.Tensor) else [t for t in (b or ()) if isinstance(t, torch.Tensor)]
    if not ta:
        return None
    return all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))


def profile_units(units: list[Unit], reps: int, trace_dir: Path | None = None) -> list[dict[str, Any]]:
    """Run each unit twice (warm-up, determinism), then ``reps`` times each after an L2 eviction under
    the profiler; per unit: kernels (name, grid, block, us_cold) and ``deterministic``."""
    from torch.profiler import ProfilerActivity, profile
    det = []
    for u in units:
        a = u.fn()
        a = [t.clone() for t in a] if isinstance(a, tuple) else (a.clone() if isinstance(a, torch.Tensor) else a)
        det.append(outputs_equal(a, u.fn()))
    evict = torch.empty(EVICT_BYTES // 4, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for u in units:
                evict.bitwise_not_()
                u.fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(dir=trace_dir) as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    per_rep = split_units(trace_kernels(trace), len(units), reps)
    return [{"unit": u.name, "count": u.count, "deterministic": det[j],
             **({"bytes": u.nbytes} if u.nbytes is not None else {}),
             **summarise_unit([per_rep[r][j] for r in range(reps)])} for j, u in enumerate(units)]


def ops_record(stack: str, s: tg.Shape, batch: int, kv_len: int, reps: int, profiled: list[dict[str, Any]],
               labels: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The JSON of one (model, batch, kv_len, stack): ops -> kernels. ``labels`` maps a compiled unit to
    its kernels' op labels (inductor); without it each unit is one op (eager)."""
    nbytes = op_bytes(s, batch, kv_len)
    ops: dict[str, dict[str, Any]] = {}
    for p in profiled:
        kl = labels[p["unit"]] if labels else [p["unit"]] * len(p["kernels"])
        if len(kl) != len(p["kernels"]):
            raise ValueError(f"{p['unit']}: {len(kl)} labels for {len(p['kernels'])} kernels")
        for label, k in zip(kl, p["kernels"], strict=True):
            op = ops.setdefault(label, {"unit": p["unit"], "count_per_step": p["count"],
                                        "bytes": p.get("bytes", nbytes.get(label)),
                                        "deterministic": p["deterministic"], "kernels": []})
            op["kernels"].append({"name": k["name"], "grid": k["grid"], "block": k["block"],
                                  "us_cold": k["us_cold"], "bytes": None})
        if not p["kernels"] and not labels:
            ops[p["unit"]] = {"unit": p["unit"], "count_per_step": p["count"],
                              "bytes": p.get("bytes", nbytes.get(p["unit"])),
                              "deterministic": p["deterministic"], "kernels": []}
    for op in ops.values():
        op["us_cold"] = round(sum(k["us_cold"] for k in op["kernels"]), 2)
        if len(op["kernels"]) == 1:
            op["kernels"][0]["bytes"] = op["bytes"]
    total = sum(op["us_cold"] * op["count_per_step"] for op in ops.values())
    return {"schema": SCHEMA, "stack": stack, "model": s.name, "batch": batch, "kv_len": kv_len,
            "evict_bytes": EVICT_BYTES, "reps": reps,
            "unit": "compiled function (prologue, block, tail)" if labels else "op",
            "kernels_per_step": sum(len(op["kernels"]) * op["count_per_step"] for op in ops.values()),
            "sum_us_cold_per_step": round(total, 1), "ops": ops}


def validate_record(d: dict[str, Any]) -> None:
    """Raise ValueError unless ``d`` has the ops schema (``ops_record``'s output)."""
    for key, typ in (("schema", str), ("stack", str), ("model", str), ("batch", int), ("kv_len", int),
                     ("evict_bytes", int), ("reps", int), ("ops", dict), ("kernels_per_step", int)):
        if not isinstance(d.get(key), typ):
            raise ValueError(f"ops record: {key!r} missing or not {typ.__name__}")
    if d["schema"] != SCHEMA:
        raise ValueError(f"ops record: schema {d['schema']!r}, expected {SCHEMA!r}")
    if d["stack"] not in ("torch_graph", "inductor_graph"):
        raise ValueError(f"ops record: unknown stack {d['stack']!r}")
    for name, op in d["ops"].items():
        if not isinstance(op.get("count_per_step"), int) or op["count_per_step"] < 1:
            raise ValueError(f"ops record: op {name!r} has no count_per_step >= 1")
        if not isinstance(op.get("kernels"), list):
            raise ValueError(f"ops record: op {name!r} has no kernel list")
        for k in op["kernels"]:
            if not isinstance(k.get("name"), str) or not isinstance(k.get("us_cold"), int | float) or k["us_cold"] < 0:
                raise ValueError(f"ops record: a kernel of {name!r} lacks name or us_cold >= 0")
            if not (isinstance(k.get("grid"), list) and isinstance(k.get("block"), list)):
                raise ValueError(f"ops record: a kernel of {name!r} lacks grid/block lists")
            if k.get("bytes") is not None and not isinstance(k["bytes"], int):
                raise ValueError(f"ops record: a kernel of {name!r} has non-integer bytes")

"""The ``torch_graph`` stack: a plain torch (eager) decode step captured in one CUDA graph.

A Llama-style decoder (HF layout: RMSNorm, fused q/k/v linear, RoPE, static KV cache, SDPA with GQA,
o proj, RMSNorm, fused gate/up, SiLU*mul, down; final norm; lm_head) with random bf16 weights. One decode
step = one new token for each of B sequences that already hold ``kv_len`` cached positions. Needs only
torch (+ the standard library); the shapes come from mksim's model configs (JSON read directly, so no
mksim import is needed on the device machine).

Run on a GPU::

    python -m validation.stacks.torch_graph --out DIR            # all cases, one subprocess per model
    python -m validation.stacks.torch_graph --model llama-3.2-1b --case 1,1024 --out DIR
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

CONFIGS = Path(__file__).resolve().parents[2] / "mksim" / "models" / "configs"

# (model, [(batch, kv_len), ...]) in the order they are run.
CASES: list[tuple[str, list[tuple[int, int]]]] = [
    ("llama-3.2-1b", [(1, 1024), (8, 1024), (1, 4096), (8, 4096)]),
    ("llama-3.1-8b", [(1, 1024), (8, 1024)]),
    ("qwen3-8b", [(1, 1024), (8, 1024)]),
    ("mistral-7b", [(1, 1024), (8, 1024)]),
    ("llama-3.2-3b", [(1, 1024), (8, 1024)]),
]


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float = 1e-5
    rope_theta: float = 10000.0
    qk_norm: bool = False
    attention_bias: bool = False
    tie_word_embeddings: bool = False

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


def shape_from_config(raw: dict[str, Any], name: str) -> Shape:
    """The fields of a Hugging Face config.json that the step needs (qwen3 adds q/k RMSNorm)."""
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    return Shape(
        name=name, hidden=hidden, intermediate=int(raw["intermediate_size"]),
        layers=int(raw["num_hidden_layers"]), heads=heads,
        kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads), vocab=int(raw["vocab_size"]),
        eps=float(raw.get("rms_norm_eps", 1e-5)), rope_theta=float(raw.get("rope_theta", 10000.0)),
        qk_norm=raw.get("model_type") == "qwen3", attention_bias=bool(raw.get("attention_bias", False)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)))


def load_shape(name: str) -> Shape:
    return shape_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name)


def make_weights(s: Shape, device: str | torch.device, dtype: torch.dtype, seed: int = 0) -> dict[str, Any]:
    """Random weights (std 0.02, norms near 1), HF layout with q/k/v and gate/up fused."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*size: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*size, generator=g, device=device, dtype=torch.float32) * std).to(dtype)

    def norm(n: int) -> torch.Tensor:
        return (1.0 + rnd(n, std=0.1).float()).to(dtype)

    layers = []
    for _ in range(s.layers):
        layer = {
            "in_norm": norm(s.hidden), "wqkv": rnd(s.q_size + 2 * s.kv_size, s.hidden),
            "bqkv": rnd(s.q_size + 2 * s.kv_size) if s.attention_bias else None,
            "q_norm": norm(s.head_dim) if s.qk_norm else None, "k_norm": norm(s.head_dim) if s.qk_norm else None,
            "wo": rnd(s.hidden, s.q_size), "post_norm": norm(s.hidden),
            "wgu": rnd(2 * s.intermediate, s.hidden), "wdown": rnd(s.hidden, s.intermediate)}
        layers.append(layer)
    embed = rnd(s.vocab, s.hidden)
    return {"embed": embed, "layers": layers, "final_norm": norm(s.hidden),
            "lm_head": embed if s.tie_word_embeddings else rnd(s.vocab, s.hidden)}


def weight_bytes(w: dict[str, Any]) -> int:
    """Bytes of all distinct weight tensors (a tied lm_head counted once)."""
    seen: dict[int, int] = {}
    tensors = [w["embed"], w["final_norm"], w["lm_head"]]
    tensors += [t for layer in w["layers"] for t in layer.values() if t is not None]
    for t in tensors:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: normalise in float32, cast back, scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [B, head_dim] for integer positions ``pos`` [B] (HF rotary, computed in float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim))
    freqs = pos.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def new_cache(s: Shape, batch: int, kv_len: int, device: str | torch.device, dtype: torch.dtype,
              seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V caches [layers, B, kv_heads, kv_len + 1, head_dim]; the first kv_len positions random."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (s.layers, batch, s.kv_heads, kv_len + 1, s.head_dim)
    k = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    v = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    k[:, :, :, kv_len:] = 0
    v[:, :, :, kv_len:] = 0
    return k, v


def decode_step(s: Shape, w: dict[str, Any], tokens: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, kv_len: int) -> torch.Tensor:
    """One decode step: tokens [B] at positions pos [B] (all = kv_len); writes slot kv_len of the caches,
    attends over kv_len + 1 positions; returns logits [B, vocab]."""
    b = tokens.shape[0]
    x = F.embedding(tokens, w["embed"])                                  # [B, H]
    cos, sin = rope_cos_sin(pos, s.head_dim, s.rope_theta, x.dtype)
    cos, sin = cos[:, None, None, :], sin[:, None, None, :]               # [B, 1, 1, hd]
    for i, lw in enumerate(w["layers"]):
        h = rms_norm(x, lw["in_norm"], s.eps)
        qkv = F.linear(h, lw["wqkv"], lw["bqkv"])
        q, k, v = qkv.split([s.q_size, s.kv_size, s.kv_size], dim=-1)
        q = q.view(b, s.heads, 1, s.head_dim)
        k = k.view(b, s.kv_heads, 1, s.head_dim)
        v = v.view(b, s.kv_heads, 1, s.head_dim)
        if s.qk_norm:
            q, k = rms_norm(q, lw["q_norm"], s.eps), rms_norm(k, lw["k_norm"], s.eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k_cache[i, :, :, kv_len: kv_len + 1] = k
        v_cache[i, :, :, kv_len: kv_len + 1] = v
        attn = F.scaled_dot_product_attention(q, k_cache[i], v_cache[i], enable_gqa=s.kv_heads != s.heads)
        x = x + F.linear(attn.reshape(b, s.q_size), lw["wo"])
        h = rms_norm(x, lw["post_norm"], s.eps)
        gate, up = F.linear(h, lw["wgu"]).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, lw["wdown"])
    return F.linear(rms_norm(x, w["final_norm"], s.eps), w["lm_head"])


def reference_step(s: Shape, w: dict[str, Any], tokens: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, kv_len: int) -> torch.Tensor:
    """A straightforward float64 loop version of ``decode_step`` for tests (tiny shapes, CPU)."""
    def f(t: torch.Tensor) -> torch.Tensor:
        return t.double()

    def norm(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        return f(wt) * x / torch.sqrt((x * x).mean(-1, keepdim=True) + s.eps)

    kc, vc = f(k_cache).clone(), f(v_cache).clone()
    half = s.head_dim // 2
    freqs = [kv_len / s.rope_theta ** (2 * j / s.head_dim) for j in range(half)]
    cos = torch.tensor([math.cos(a) for a in freqs * 2], dtype=torch.float64)
    sin = torch.tensor([math.sin(a) for a in freqs * 2], dtype=torch.float64)

    def rope(v: torch.Tensor) -> torch.Tensor:
        rot = torch.cat((-v[half:], v[:half]))
        return v * cos + rot * sin

    out = []
    group = s.heads // s.kv_heads
    for bi, tok in enumerate(tokens.tolist()):
        x = f(w["embed"][tok])
        for i, lw in enumerate(w["layers"]):
            h = norm(x, lw["in_norm"])
            qkv = f(lw["wqkv"]) @ h + (f(lw["bqkv"]) if lw["bqkv"] is not None else 0)
            q = qkv[: s.q_size].view(s.heads, s.head_dim)
            k = qkv[s.q_size: s.q_size + s.kv_size].view(s.kv_heads, s.head_dim)
            v = qkv[s.q_size + s.kv_size:].view(s.kv_heads, s.head_dim)
            heads_out = []
            for kh in range(s.kv_heads):
                kk = norm(k[kh], lw["k_norm"]) if s.qk_norm else k[kh]
                kc[i, bi, kh, kv_len] = rope(kk)
                vc[i, bi, kh, kv_len] = v[kh]
            for qh in range(s.heads):
                qq = norm(q[qh], lw["q_norm"]) if s.qk_norm else q[qh]
                qq = rope(qq)
                kh = qh // group
                scores = kc[i, bi, kh, : kv_len + 1] @ qq / math.sqrt(s.head_dim)
                p = torch.softmax(scores, dim=0)
                heads_out.append(p @ vc[i, bi, kh, : kv_len + 1])
            x = x + f(lw["wo"]) @ torch.cat(heads_out)
            h = norm(x, lw["post_norm"])
            gu = f(lw["wgu"]) @ h
            gate, up = gu[: s.intermediate], gu[s.intermediate:]
            x = x + f(lw["wdown"]) @ (gate * torch.sigmoid(gate) * up)
        out.append(f(w["lm_head"]) @ norm(x, w["final_norm"]))
    return torch.stack(out)


def percentile(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    k = (len(ys) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)


def count_kernels(run: Any) -> dict[str, Any]:
    """GPU activities seen by torch.profiler during ``run()``: kernels, memcpy/memset, by name."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    names: dict[str, int] = {}
    gpu_us = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name] = names.get(e.name, 0) + 1
            gpu_us += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    kernels = {n: c for n, c in names.items() if not n.lower().startswith(("memcpy", "memset"))}
    return {"kernels": sum(kernels.values()), "other_gpu_ops": sum(names.values()) - sum(kernels.values()),
            "gpu_busy_us": round(gpu_us, 1),
            "by_name": dict(sorted(names.items(), key=lambda kv: -kv[1]))}


def run_model(name: str, cases: list[tuple[int, int]], out: Path, replays: int, trace: bool) -> list[dict[str, Any]]:
    """All cases of one model in this process (weights made once); one JSON per case under ``out``."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    s = load_shape(name)
    w = make_weights(s, dev, dt)
    wbytes = weight_bytes(w)
    rows = []
    for batch, kv in cases:
        t0 = time.time()
        k_cache, v_cache = new_cache(s, batch, kv, dev, dt)
        tokens = torch.randint(0, s.vocab, (batch,), device=dev, generator=torch.Generator(dev).manual_seed(2))
        pos = torch.full((batch,), kv, device=dev, dtype=torch.long)
        with torch.inference_mode():
            eager = decode_step(s, w, tokens, pos, k_cache, v_cache, kv).clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    decode_step(s, w, tokens, pos, k_cache, v_cache, kv)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits = decode_step(s, w, tokens, pos, k_cache, v_cache, kv)
            graph.replay()
            torch.cuda.synchronize()
            diff = (logits.float() - eager.float()).abs().max().item()
            scale = eager.float().abs().max().item()
            same_argmax = bool((logits.argmax(-1) == eager.argmax(-1)).all().item())
            ok = diff <= 2e-2 * max(scale, 1.0) and same_argmax
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
            times = []
            for _ in range(replays):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1000.0)
            eager_times = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                decode_step(s, w, tokens, pos, k_cache, v_cache, kv)
                b.record()
                b.synchronize()
                eager_times.append(a.elapsed_time(b) * 1000.0)
            prof_graph = count_kernels(graph.replay)
            prof_eager = count_kernels(functools.partial(decode_step, s, w, tokens, pos, k_cache, v_cache, kv))
            trace_file = None
            if trace:
                from torch.profiler import ProfilerActivity, profile
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        graph.replay()
                    torch.cuda.synchronize()
                raw = out / f"trace-{name}-b{batch}.json"
                prof.export_chrome_trace(str(raw))
                with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                raw.unlink()
                trace_file = raw.name + ".gz"
                trace = False
        kv_bytes = 2 * s.layers * batch * s.kv_heads * (kv + 1) * s.head_dim * 2
        med = percentile(times, 0.5)
        row = {
            "stack": "torch_graph", "model": name, "batch": batch, "kv_len": kv,
            "step_us": {"median": round(med, 2), "p10": round(percentile(times, 0.1), 2),
                        "p90": round(percentile(times, 0.9), 2), "min": round(min(times), 2), "n": len(times)},
            "eager_step_us_median": round(percentile(eager_times, 0.5), 2),
            "kernels_per_step_graph": prof_graph["kernels"], "kernels_per_step_eager": prof_eager["kernels"],
            "graph_profile": prof_graph, "eager_profile": prof_eager,
            "weight_bytes": wbytes, "kv_bytes": kv_bytes,
            "implied_GBps": round((wbytes + kv_bytes) / (med * 1e-6) / 1e9, 1),
            "check": {"graph_vs_eager_max_abs_diff": diff, "logit_abs_max": scale, "same_argmax": same_argmax,
                      "ok": ok},
            "trace": trace_file, "shape": asdict(s),
            "notes": "random bf16 weights; L2 not flushed between replays; one event pair per replay, "
                     "synchronised after each; fused qkv and gate/up weights",
            "case_wall_s": round(time.time() - t0, 1)}
        (out / f"{name}-b{batch}-kv{kv}.json").write_text(json.dumps(row, indent=1) + "\n")
        rows.append(row)
        print(f"{name} b{batch} kv{kv}: {med:.1f} us ok={ok}", flush=True)
        del k_cache, v_cache, graph, logits, eager
        torch.cuda.empty_cache()
    return rows


def environment() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": props.name,
            "sms": props.multi_processor_count, "python": sys.version.split()[0],
            "cudnn": torch.backends.cudnn.version(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model")
    ap.add_argument("--case", action="append", metavar="B,KV", help="batch,kv_len (repeatable; default 1,1024)")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--budget-s", type=float, default=240.0, help="start no new model after this many seconds")
    ap.add_argument("--per-model-timeout-s", type=float, default=120.0)
    ap.add_argument("--trace", action="store_true", help="export a Chrome trace of the first case")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.model:   # one model in this process
        cases = [(int(c.split(",")[0]), int(c.split(",")[1])) for c in (a.case or ["1,1024"])]
        run_model(a.model, cases, a.out, a.replays, a.trace)
        return 0
    (a.out / "environment.json").write_text(json.dumps(environment(), indent=1) + "\n")
    start, status = time.time(), {}
    for name, cases in CASES:
        if time.time() - start > a.budget_s:
            status[name] = "skipped: budget"
            continue
        cmd = [sys.executable, "-m", "validation.stacks.torch_graph", "--model", name, "--out", str(a.out),
               "--replays", str(a.replays)]
        for b, k in cases:
            cmd += ["--case", f"{b},{k}"]
        if name == "llama-3.2-1b" and a.trace:
            cmd.append("--trace")
        try:
            r = subprocess.run(cmd, timeout=a.per_model_timeout_s)
            status[name] = f"rc={r.returncode}"
        except subprocess.TimeoutExpired:
            status[name] = f"timeout after {a.per_model_timeout_s} s"
    (a.out / "status.json").write_text(json.dumps(status, indent=1) + "\n")
    print_table(a.out)
    return 0


def print_table(out: Path) -> None:
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*-kv*.json"))]
    print(f"{'model':14} {'B':>2} {'kv':>5} {'median':>8} {'p10':>8} {'p90':>8} {'eager':>8} {'kern':>5} "
          f"{'GB/s':>7} ok")
    for r in rows:
        st = r["step_us"]
        print(f"{r['model']:14} {r['batch']:>2} {r['kv_len']:>5} {st['median']:>8.1f} {st['p10']:>8.1f} "
              f"{st['p90']:>8.1f} {r['eager_step_us_median']:>8.1f} {r['kernels_per_step_graph']:>5} "
              f"{r['implied_GBps']:>7.1f} {r['check']['ok']}")


if __name__ == "__main__":
    raise SystemExit(main())

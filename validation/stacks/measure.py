"""Whole-step measurement shared by every stack: capture a step callable in one CUDA graph, time its
replays, count its kernels, and check its logits against the eager step and a float32 reference.

The check (one rule for every stack): the stack's logits are compared with the float32 step (the same
bf16 weights and caches, upcast; ``fp32_logits``). A stack is ``ok`` when its max |error| against that
reference is at most 1.5 x the eager bf16 step's own max |error| plus 1 % of max |logit|: it is as close
to the exact answer as plain eager torch is. Reported beside it: the max |difference| to the eager step,
the top-token agreement with the eager step and with the reference, and whether the eager step and the
graph replay are bit-reproducible (two runs each: a non-zero ``*_repeat_max_abs_diff`` means a kernel
with a run-to-run varying reduction order, the explanation of a graph-vs-eager difference that is not
a bug).

Mixture-of-experts models: the float32 reference keeps the experts the bf16 eager step chose
(``fp32_logits(..., chosen)``): with random weights a near-tie in the router flips between bf16 and
float32, and after one flipped expert every later layer differs, which says nothing about the stack.
A stack whose own run chooses other experts than the eager step (a kernel with a varying reduction order
can tip a near-tie) then fails the rule, and its ``*_repeat_max_abs_diff`` shows why.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from validation.stacks import torch_graph as tg


class _Float32(Mapping[str, Any]):
    """A layer's weight dict whose tensors are upcast to float32 when read (one layer at a time)."""

    def __init__(self, d: dict[str, Any]) -> None:
        self._d = d

    def __getitem__(self, key: str) -> Any:
        v = self._d[key]
        return v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


def fp32_logits(s: tg.Shape, w: dict[str, Any], tokens: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, kv_len: int, chosen: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The decode step in float32 from the same bf16 weights and caches (copies; nothing is modified).
    ``chosen`` (per sparse layer, the expert ids of the bf16 step: ``tg.routing_choices``) fixes the
    experts, so the reference differs from the step in arithmetic only: with random weights a top-k choice
    flips between bf16 and float32 and then every later layer differs."""
    forced = iter(chosen or ())
    w32 = {"embed": w["embed"].float(), "final_norm": w["final_norm"].float(), "lm_head": w["lm_head"].float(),
           "layers": [_Float32({**lw, "topi": next(forced)} if chosen is not None and "router" in lw else lw)
                      for lw in w["layers"]]}
    out = tg.decode_step(s, w32, tokens, pos, k_cache.float(), v_cache.float(), kv_len)  # type: ignore[arg-type]
    del w32
    return out


def weight_bytes_read(s: tg.Shape, w: dict[str, Any], batch: int, routing: list[list[int]] | None = None) -> int:
    """Weight bytes one step reads: every weight once, but of an untied embedding table only the
    ``batch`` rows looked up (a tied table is read whole by the LM head), and of a sparse layer's experts
    only those its tokens chose (``routing``: per sparse layer, tokens per expert; None: every expert)."""
    total = tg.weight_bytes(w)
    sparse = [lw for lw in w["layers"] if "router" in lw]
    if routing is not None:
        if len(routing) != len(sparse):
            raise ValueError(f"routing has {len(routing)} layers; the model has {len(sparse)} sparse layers")
        for lw, counts in zip(sparse, routing, strict=True):
            one = (lw["wgu_e"][0].numel() + lw["wdown_e"][0].numel()) * lw["wgu_e"].element_size()
            total -= one * sum(1 for c in counts if c == 0)
    if s.tie_word_embeddings:
        return total
    row = s.hidden * w["embed"].element_size()
    return total - s.vocab * row + min(batch, s.vocab) * row


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max().item())


def top1_agree(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).float().mean().item())


def check_rule(err_stack: float, err_eager: float, scale: float) -> bool:
    """The pass rule of the module docstring."""
    return err_stack <= 1.5 * err_eager + 0.01 * max(scale, 1.0)


def capture(step: Callable[[], torch.Tensor], warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warm ``step`` up on a side stream, then capture one call in a CUDA graph; returns (graph, its
    static logits). Call under ``torch.inference_mode``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step()
    return graph, logits


def event_times_us(run: Callable[[], Any], n: int) -> list[float]:
    """``n`` timings of ``run()``, each bracketed by its own CUDA event pair and synchronised."""
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return times


def stats(times: list[float]) -> dict[str, float]:
    return {"median": round(tg.percentile(times, 0.5), 2), "p10": round(tg.percentile(times, 0.1), 2),
            "p90": round(tg.percentile(times, 0.9), 2), "min": round(min(times), 2), "n": len(times)}


def measure_case(stack: str, s: tg.Shape, w: dict[str, Any], step: Callable[[], torch.Tensor],
                 eager: Callable[[], torch.Tensor], ref: torch.Tensor, eager_logits: torch.Tensor,
                 eager_err: float, batch: int, kv_len: int, replays: int,
                 trace_path: Path | None = None, side_logits: torch.Tensor | None = None,
                 routing: list[list[int]] | None = None) -> dict[str, Any]:
    """Capture ``step`` (a zero-argument callable over static buffers) and time it (also 5 calls without
    the graph: ``ungraphed_step_us_median``). ``eager`` runs the eager torch step on the same buffers;
    ``ref`` and ``eager_logits`` are the float32 and eager logits, ``eager_err`` = max |eager - ref|.
    With ``trace_path``, a gzipped Chrome trace of 3 replays; with ``side_logits`` (the eager step run on
    a side stream), ``check.max_abs_diff_vs_eager_side_stream``."""
    graph, logits = capture(step)
    graph.replay()
    torch.cuda.synchronize()
    first = logits.clone()
    graph.replay()
    torch.cuda.synchronize()
    scale = float(ref.float().abs().max().item())
    err = max_abs(logits, ref)
    check = {"max_abs_diff_vs_eager": max_abs(logits, eager_logits), "top1_agree_vs_eager": top1_agree(logits,
             eager_logits), "max_abs_err_vs_fp32": err, "eager_max_abs_err_vs_fp32": eager_err,
             "top1_agree_vs_fp32": top1_agree(logits, ref), "logit_abs_max": scale,
             "graph_repeat_max_abs_diff": max_abs(first, logits), "ok": check_rule(err, eager_err, scale),
             "rule": "max|stack - fp32| <= 1.5 * max|eager - fp32| + 0.01 * max|logit|",
             "max_abs_diff_vs_eager_side_stream": max_abs(logits, side_logits) if side_logits is not None else None}
    event_times_us(graph.replay, 10)
    times = event_times_us(graph.replay, replays)
    eager_times = event_times_us(eager, 5)
    ungraphed = eager_times if step is eager else event_times_us(step, 5)
    prof_graph = tg.count_kernels(graph.replay)
    if trace_path is not None:
        export_trace(graph.replay, trace_path)
    kv_bytes = 2 * s.layers * batch * s.kv_heads * (kv_len + 1) * s.head_dim * 2
    wread = weight_bytes_read(s, w, batch, routing)
    med = tg.percentile(times, 0.5)
    del graph
    return {"trace": trace_path.name if trace_path else None,
        "stack": stack, "model": s.name, "batch": batch, "kv_len": kv_len, "step_us": stats(times),
        "eager_step_us_median": round(tg.percentile(eager_times, 0.5), 2),
        "ungraphed_step_us_median": round(tg.percentile(ungraphed, 0.5), 2),
        "kernels_per_step_graph": prof_graph["kernels"], "graph_profile": prof_graph,
        "weight_bytes": tg.weight_bytes(w), "weight_bytes_read": wread, "kv_bytes": kv_bytes,
        "implied_GBps": round((wread + kv_bytes) / (med * 1e-6) / 1e9, 1), "check": check,
        **({"routing": {"tokens_per_expert": routing, "distinct_experts": [sum(1 for c in r if c) for r in routing]}}
           if routing is not None else {}),
        "notes": "random bf16 weights; L2 not flushed between replays; one event pair per replay, "
                 "synchronised after each; fused qkv and gate/up weights; implied_GBps from weight_bytes_read "
                 "(embedding rows looked up, not the whole table) + kv_bytes"}


def eager_baseline(s: tg.Shape, w: dict[str, Any], tokens: torch.Tensor, pos: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, kv_len: int) -> dict[str, Any]:
    """The eager step's logits (second call; the first call's and a side stream's differences to it),
    the float32 reference and the eager error against it."""
    t0 = time.time()
    first = tg.decode_step(s, w, tokens, pos, k_cache, v_cache, kv_len).clone()
    second = tg.decode_step(s, w, tokens, pos, k_cache, v_cache, kv_len).clone()
    # the same step on a fresh side stream, as the capture runs it (cuBLAS keeps a workspace per stream)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        third = tg.decode_step(s, w, tokens, pos, k_cache, v_cache, kv_len).clone()
    torch.cuda.current_stream().wait_stream(side)
    chosen = tg.routing_choices(s, w, tokens, pos, k_cache, v_cache, kv_len) if s.moe else None
    ref = fp32_logits(s, w, tokens, pos, k_cache, v_cache, kv_len, chosen)
    torch.cuda.synchronize()
    return {"logits": second, "side_stream_logits": third, "ref": ref, "err": max_abs(second, ref),
            "routing": tg.routing_counts(s, chosen) if chosen is not None else None,
            "eager_repeat_max_abs_diff": max_abs(first, second),
            "eager_side_stream_max_abs_diff": max_abs(third, second), "wall_s": round(time.time() - t0, 2)}


def export_trace(run: Callable[[], Any], path: Path, n: int = 3) -> None:
    """A torch.profiler Chrome trace (CPU + CUDA) of ``n`` calls of ``run``, gzipped to ``path``."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(dir=path.parent) as d:
        raw = Path(d) / "trace.json"
        prof.export_chrome_trace(str(raw))
        data = json.loads(raw.read_text())
    with gzip.open(path, "wt") as f:
        json.dump(data, f, separators=(",", ":"))

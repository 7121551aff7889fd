"""The ``inductor_graph`` stack: the torch_graph decode step compiled by ``torch.compile`` (Inductor),
then captured by us in one ``torch.cuda.CUDAGraph`` exactly like torch_graph.

Mode: ``torch.compile(fn, fullgraph=True, dynamic=False)`` in the default mode (no autotuning, no
Inductor cudagraphs), and our own capture of the whole step. Why not the alternatives:

- ``mode="reduce-overhead"`` (cudagraph trees) captures each compiled function in its own graph with
  Inductor's own memory pool, copies non-static inputs into it, and skips graphs for functions that
  mutate inputs (our KV cache write): the step would become several graphs plus copies, not one graph,
  and its timing would not be comparable with torch_graph's. Capturing ourselves keeps the only
  difference between the two stacks the compiler.
- ``mode="max-autotune(-no-cudagraphs)"`` benchmarks Triton GEMM templates against cuBLAS for every
  matmul shape: minutes of compile per (model, batch) shape set, over this run's budget. The default mode
  keeps the matmuls and attention in cuBLAS / SDPA (as most users get) and fuses all the elementwise work
  (RMSNorm, RoPE, the KV-cache write, SiLU*mul, residual adds) into Triton kernels.

What is compiled: three functions, each over static shapes: the prologue (embedding + RoPE table), one
decoder block and the tail (final add, norm, LM head); the block is compiled once and called for every
layer with that layer's weights and cache slices (tensor arguments, so no recompile per layer). The block
is cut after the down-projection GEMM with the residual add deferred to the next block
(``torch_graph.block``): every cut lies at the output of an extern cuBLAS GEMM, which Inductor's default
mode does not fuse into Triton kernels, so the kernels are those of compiling the whole unrolled model, at
the compile cost of one layer instead of L. One known difference: compiling the whole model, Inductor may
fold the down projection's residual add into the GEMM (``addmm``, as it does for o_proj here); cut, the
add is fused into the next block's RMSNorm kernel instead (same kernel count, same bytes but B x hidden).
The caches are static buffers mutated in place (Inductor re-inplaces the slice write into the input).
Compile artefacts go to ``TORCHINDUCTOR_CACHE_DIR`` (the runner sets it under its output folder);
``compile_s`` is the wall time of the first (compiling) call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from validation.stacks import torch_graph as tg

COMPILE_KW: dict[str, Any] = {"fullgraph": True, "dynamic": False}


def configure() -> None:
    """Allow one compiled variant per (batch, kv_len) case of a process."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 64)


def compiled_parts(s: tg.Shape, kv_len: int) -> dict[str, Callable[..., Any]]:
    """The three compiled functions for one model and cache length (batch comes from the inputs)."""
    def prologue(embed: torch.Tensor, tokens: torch.Tensor,
                 pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tg.embed_and_rope(s, embed, tokens, pos)

    def block(lw: dict[str, Any], x: torch.Tensor, dres: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tg.block(s, lw, x, dres, cos, sin, k_cache, v_cache, kv_len)

    def tail(x: torch.Tensor, dres: torch.Tensor, final_norm: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        return tg.tail(s, x, dres, final_norm, lm_head)

    return {"prologue": torch.compile(prologue, **COMPILE_KW), "block": torch.compile(block, **COMPILE_KW),
            "tail": torch.compile(tail, **COMPILE_KW)}


def make_step(s: tg.Shape, w: dict[str, Any], tokens: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, kv_len: int,
              parts: dict[str, Callable[..., Any]] | None = None) -> Callable[[], torch.Tensor]:
    """A zero-argument compiled decode step over static buffers (the layer-0 residual input is a zero
    buffer, so every layer calls the same compiled block)."""
    p = parts or compiled_parts(s, kv_len)
    zero = torch.zeros(tokens.shape[0], s.hidden, device=tokens.device, dtype=w["embed"].dtype)

    def step() -> torch.Tensor:
        x, cos, sin = p["prologue"](w["embed"], tokens, pos)
        dres = zero
        for i, lw in enumerate(w["layers"]):
            x, dres = p["block"](lw, x, dres, cos, sin, k_cache[i], v_cache[i])
        return p["tail"](x, dres, w["final_norm"], w["lm_head"])
    return step


def compile_step(step: Callable[[], torch.Tensor]) -> float:
    """Run ``step`` once (compiling it) and return the wall seconds it took."""
    t0 = time.time()
    step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.time() - t0

"""The stacks people run from Hugging Face transformers: ``hf`` and ``hf_compiled``.

Both build the model with transformers' own classes (``AutoModelForCausalLM.from_config``, random weights
as transformers initialises them, bf16, on the GPU) from a config of ``mksim/models/configs`` (a Hugging
Face config.json's architecture fields), fill the KV cache by one prefill of ``kv_len`` random tokens, then
decode greedily, one token for each of the ``batch`` sequences a step, timing each step:

- ``hf``: eager PyTorch with the dynamic cache (``DynamicCache``), what ``model.generate`` does by default;
- ``hf_compiled``: the static cache (``StaticCache``) and ``torch.compile(model.forward,
  mode="reduce-overhead", fullgraph=True)``, transformers' documented fast path for decoding (Inductor
  kernels replayed from CUDA graphs by cudagraph trees).

A step is timed from a CUDA event recorded before the forward call to one recorded after it, synchronised:
the host's time to launch the step is in it (the eager step is host-bound), as a user waiting for the token
sees it. Positions advance as in a real generation (``kv_len`` to ``kv_len + warmup + steps``), so later
steps attend to a few more tokens. Mixture-of-experts models run transformers' default experts
implementation (``config._experts_implementation``, recorded). The check: the compiled stack's first
decode logits against the eager stack's from the same prefill (max |difference|, top-1 agreement).
Measured by ``python3 -m validation stacks run --stacks hf,hf_compiled``; needs torch and transformers.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from validation.stacks import torch_graph as tg

STACKS = ("hf", "hf_compiled")
COMPILE_KW: dict[str, Any] = {"mode": "reduce-overhead", "fullgraph": True}


def hf_config(name: str, configs: Path = tg.CONFIGS) -> Any:
    """transformers' config for a config file of mksim (keys starting with ``_`` dropped)."""
    from transformers import AutoConfig

    raw = {k: v for k, v in json.loads((configs / f"{name}.json").read_text()).items() if not k.startswith("_")}
    model_type = raw.pop("model_type", "llama")
    raw.pop("architectures", None)
    return AutoConfig.for_model(model_type, **raw)


def build(config: Any, device: str | torch.device, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Any:
    """The model with transformers' own random initialisation, made directly on ``device``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def new_cache(stack: str, config: Any, max_len: int) -> Any:
    from transformers import DynamicCache, StaticCache

    if stack == "hf":
        return DynamicCache(config=config)
    return StaticCache(config=config, max_cache_len=max_len)


def prefill(model: Any, cache: Any, batch: int, kv_len: int, vocab: int, seed: int = 2) -> torch.Tensor:
    """Fill ``cache`` with ``kv_len`` random tokens per sequence (the model's plain forward); returns the
    first decode step's input ids [batch, 1]."""
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, kv_len), device=dev, generator=g)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    return out.logits[:, -1:].argmax(-1)


def decode(forward: Callable[..., Any], cache: Any, first: torch.Tensor, steps: int,
           timed: bool = True) -> tuple[list[float], torch.Tensor]:
    """Greedy decode of ``steps`` steps from ``first``; per step µs (CUDA events around the call, the step
    synchronised) and the first step's logits."""
    times, nxt, first_logits = [], first, None
    for _ in range(steps):
        if timed:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        logits = forward(input_ids=nxt, past_key_values=cache, use_cache=True).logits
        if timed:
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000.0)
        if first_logits is None:
            first_logits = logits[:, -1].float().clone()
        nxt = logits[:, -1:].argmax(-1)
    assert first_logits is not None
    return times, first_logits


def run_case(stack: str, model: Any, config: Any, batch: int, kv_len: int, warmup: int, steps: int,
             forward: Callable[..., Any] | None = None) -> dict[str, Any]:
    """One stack at one (batch, kv_len): the prefill, ``warmup`` untimed steps (compiles happen here),
    ``steps`` timed ones; the record without the check (``worker`` adds it)."""
    fwd = forward or model.forward
    cache = new_cache(stack, config, kv_len + warmup + steps + 1)
    t0 = time.time()
    with torch.inference_mode():
        first = prefill(model, cache, batch, kv_len, config.vocab_size)
        _, first_logits = decode(fwd, cache, first, max(warmup, 1), timed=False)
        torch.cuda.synchronize()
        warm_s = time.time() - t0
        times, _ = decode(fwd, cache, first_logits[:, None].argmax(-1), steps)
        prof = tg.count_kernels(lambda: fwd(input_ids=first, past_key_values=cache, use_cache=True))
    return {"stack": stack, "batch": batch, "kv_len": kv_len, "positions": [kv_len + warmup, kv_len + warmup + steps],
            "step_us": _stats(times), "warmup_s": round(warm_s, 2), "kernels_per_step": prof["kernels"],
            "gpu_busy_us_one_step": prof["gpu_busy_us"], "kernels_by_name": prof["by_name"],
            "first_logits": first_logits}


def _stats(times: list[float]) -> dict[str, float]:
    return {"median": round(tg.percentile(times, 0.5), 2), "p10": round(tg.percentile(times, 0.1), 2),
            "p90": round(tg.percentile(times, 0.9), 2), "min": round(min(times), 2), "n": len(times)}


def worker(model_name: str, cases: list[tuple[int, int]], stacks: list[str], out: Path, steps: int,
           deadline: float, warmup: int = 5) -> int:
    """Every case of one model in this process: the eager stack first (its first logits are the check's
    reference), then the compiled one. Files ``step-<stack>-<model>-b<B>-kv<kv>.json``."""
    import transformers

    config = hf_config(model_name)
    t0 = time.time()
    model = build(config, "cuda")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"{model_name}: transformers {transformers.__version__}, {type(model).__name__}, built in "
          f"{time.time() - t0:.1f} s, {weights / 1e9:.2f} GB", flush=True)
    compiled = None
    for batch, kv in cases:
        ref = None
        for stack in stacks:
            name = f"{stack}-{model_name}-b{batch}-kv{kv}"
            if time.time() > deadline - (60 if stack == "hf_compiled" else 10):
                print(f"{name}: skipped (budget)", flush=True)
                continue
            try:
                fwd = None
                if stack == "hf_compiled":
                    compiled = compiled or torch.compile(model.forward, **COMPILE_KW)
                    fwd = compiled
                row = run_case(stack, model, config, batch, kv, warmup, steps, fwd)
                logits = row.pop("first_logits")
                if stack == "hf":
                    ref = logits
                row.update({"model": model_name, "model_class": type(model).__name__,
                            "transformers": transformers.__version__, "weight_bytes": weights,
                            "attn_implementation": getattr(config, "_attn_implementation", None),
                            "experts_implementation": getattr(config, "_experts_implementation", None),
                            "compile_kwargs": COMPILE_KW if stack == "hf_compiled" else None,
                            "check": None if ref is None or stack == "hf" else {
                                "max_abs_diff_vs_hf": round(float((logits - ref).abs().max()), 4),
                                "top1_agree_vs_hf": float((logits.argmax(-1) == ref.argmax(-1)).float().mean()),
                                "logit_abs_max": round(float(ref.abs().max()), 4)},
                            "notes": "transformers' own model class, random init; one CUDA event pair around "
                                     "each forward call, synchronised; greedy decode, positions advance"})
                (out / f"step-{name}.json").write_text(json.dumps(row, separators=(",", ":")) + "\n")
                print(f"{name}: {row['step_us']['median']:.1f} us, {row['kernels_per_step']} kernels, "
                      f"warm-up {row['warmup_s']} s", flush=True)
            except Exception as e:  # one failed stack must not lose the others
                (out / f"error-{name}.json").write_text(json.dumps(
                    {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}))
                print(f"{name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            torch.cuda.empty_cache()
    return 0

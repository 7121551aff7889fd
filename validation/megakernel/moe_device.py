"""The MoE step on the GPU, in one command: every MoE op kind checked against torch and whole steps
timed, with predictions beside them (``python -m validation.megakernel.moe_device OUT [--quick]``).

Cases: small MoE configs of our own (llama attention, N experts, top-k, T tokens, a shared expert with
its gate), Mixtral-8x7B at batch 1, Qwen3-30B-A3B and OLMoE at batch 1 and 8 where the kernel runs
their attention (else the one-line refusal is recorded), in the megakernel (moe_stride, and the plan
design with the default policy), persistent_barrier and the chain modes. Each case: plan, allocate
(random bf16 weights), check every op (its own error, inputs from the kernel; a route table exactly),
time (CUDA events, median of ``reps``), record the routing (active experts per layer, from the kernel's
route tables) and the prediction (``mksim.simulate`` of the same schedule), then free the GPU. Each
kernel launch has a watchdog; one JSON per case under OUT, and OUT/moe_device.json with them all.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import mksim
from mksim import models

from . import gpu, reference
from . import program as P

GPU = "h200"  # the validated target: the calibrated H200 with the mksim profile of these kernels
KV = 1024
MODES = ("megakernel", "megakernel:plan", "persistent_barrier", "stream", "graph", "graph_pdl")


def tiny(n_experts: int, top_k: int, shared: int = 0) -> Any:
    """A small MoE model of ours: 4 layers, hidden 1024, expert width 512 (shared: Qwen2-MoE's kind)."""
    raw = {"model_type": "qwen2_moe" if shared else "mixtral", "hidden_size": 1024, "intermediate_size": 1024,
           "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
           "vocab_size": 4096, "num_experts_per_tok": top_k, "attention_bias": False}
    if shared:
        raw.update(num_experts=n_experts, moe_intermediate_size=512, shared_expert_intermediate_size=1024)
    else:
        raw.update(num_local_experts=n_experts, intermediate_size=512)
    cfg = models.config_from_hf(raw)
    return cfg


def cases(quick: bool) -> list[tuple[str, Any, int, str]]:
    out: list[tuple[str, Any, int, str]] = []
    tinies = [("tiny-n16k4", tiny(16, 4)), ("tiny-n16k2", tiny(16, 2)), ("tiny-n8k8", tiny(8, 8)),
              ("tiny-n32k4-shared", tiny(32, 4, shared=1))]
    for i, (name, cfg) in enumerate(tinies):  # every mode on the first; the megakernel and a chain on all
        for T in (1, 2, 4, 8) if i < 2 else (1, 8):
            for mode in (MODES if i == 0 and T in (1, 8) else ("megakernel", "graph_pdl")):
                out.append((name, cfg, T, mode))
    if quick:
        return out
    for model in ("qwen3-30b-a3b", "olmoe-1b-7b"):  # the targets first, then Mixtral's 93 GB
        for T in (1, 8):
            for mode in ("megakernel", "megakernel:plan", "graph_pdl"):
                out.append((model, model, T, mode))
    for mode in ("megakernel", "graph_pdl"):
        out.append(("mixtral-8x7b", "mixtral-8x7b", 1, mode))
    out.append(("mixtral-8x7b", "mixtral-8x7b", 8, "megakernel"))  # expected: one-line refusal (shared memory)
    return out


def schedule(cfg: Any, T: int, mode: str) -> Any:
    base, _, design = mode.partition(":")
    opts = dict(P.kernel_options(cfg, T, KV, GPU, base))
    if base == "megakernel" and design != "plan":
        opts["moe_dispatch"] = "stride"
    wl = models.workload(cfg, batch=T, kv_len=KV, fuse_silu=True)
    return mksim.build_schedule(wl, GPU, base, **opts)


def run_case(name: str, cfg: Any, T: int, mode: str, reps: int, watchdog_s: float) -> dict:
    rec: dict[str, Any] = {"case": f"{name}/b{T}/{mode}", "model": name, "batch": T, "mode": mode}
    t0 = time.monotonic()
    try:
        s = schedule(cfg, T, mode)
        rec["predicted_us"] = float(mksim.simulate(s, timeline=False).latency_us)
        r = gpu.Runner(s)
    except Exception as exc:  # a refusal (one line) or an allocation failure
        rec["refused"] = " ".join(str(exc).split())[:300]
        return rec
    try:
        local, e2e = r.check(watchdog_s)
        ops = s.workload.ops
        by_kind: dict[str, float] = {}
        for op in ops:
            by_kind[op.kind] = max(by_kind.get(op.kind, 0.0), local[op.name])
        worst = max(local, key=local.__getitem__)
        tb = r.torch_buffers()
        active = []
        for op, row, out in zip(ops, r.plan.ops, r.plan.outputs, strict=True):
            if op.kind == "topk":
                rt = reference.route_parts(tb[out], T, row["K"], row["pos"])
                active.append(rt["count"])
        rec.update(max_rel_err=local[worst], worst_op=worst, rel_err_by_kind=by_kind, e2e_rel_err=max(e2e.values()),
                   ok=local[worst] <= 1e-2, active_experts=active,
                   simulated_active=[op.attrs["active"] for op in ops if op.kind == "topk"])
        times = r.time(reps, watchdog_s)
        rec.update(measured_us=statistics.median(times), spread_us=max(times) - min(times),
                   error_pct=None if not rec.get("predicted_us") else
                   100 * (rec["predicted_us"] - statistics.median(times)) / statistics.median(times))
        if s.mode in ("megakernel", "persistent_barrier"):
            rec["trace"] = r.trace_summary()
    except Exception as exc:
        rec["failed"] = " ".join(str(exc).split())[:300]
        rec["traceback"] = traceback.format_exc()[-2000:]
    finally:
        r.close()
        del r
        rec["wall_s"] = time.monotonic() - t0
    return rec


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m validation.megakernel.moe_device OUT [--quick]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    quick = "--quick" in argv
    t_end = time.monotonic() + 7 * 60  # the device call's 8 minutes, with room to write
    recs = []
    for name, cfg, T, mode in cases(quick):
        if time.monotonic() > t_end:
            recs.append({"case": f"{name}/b{T}/{mode}", "skipped": "out of time"})
            continue
        big = isinstance(cfg, str)
        rec = run_case(name, models.get(cfg) if big else cfg, T, mode, 10 if big else 20, 120.0 if big else 30.0)
        recs.append(rec)
        keep = {k: v for k, v in rec.items() if k not in ("traceback", "trace")}
        print(json.dumps(keep, default=float), flush=True)
        (out / "moe_device.json").write_text(json.dumps(recs, indent=1, default=float))
        if "hung" in str(rec.get("failed", "")):  # the GPU context is lost: nothing more can run
            break
    ok = [r for r in recs if r.get("ok")]
    bad = [r["case"] for r in recs if "failed" in r or r.get("ok") is False]
    print(json.dumps({"cases": len(recs), "ok": len(ok), "bad": bad,
                      "refused": [r["case"] for r in recs if "refused" in r]}))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

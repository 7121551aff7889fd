"""The engine piece of the MoE speculative prefetch: one DRAM flow per MoE layer, started as the layer
begins (its attention), reads the likeliest experts into L2; when the layer's top-k is seen, its
expert tiles find the expected hit share of their weights in L2 if the flow is in and not evicted."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from mksim.schedule.designs.moe_prefetch import MoEPrefetch, prefetch_plan
from mksim.schedule.designs.moe_stride import is_expert_op
from mksim.workload.routing import parse_routing

from .._design_run import DesignRun, runs


@runs(MoEPrefetch)
class MoEPrefetchRun(DesignRun):
    """Per MoE layer: the experts prefetched, the expected hit rate, and whether the prefetch was in
    (and still in L2) when the top-k was seen."""

    def setup(self) -> None:
        eng = self.eng
        g, wl, env = eng.g, eng.s.workload, eng.env
        cfg = wl.model
        if cfg is None:
            return
        model = parse_routing(wl.step.routing if wl.step is not None else "uniform")
        budget = eng.s.options.moe_prefetch_MiB * 2 ** 20
        self.l2_B = eng.s.gpu.l2.size_MiB * 2 ** 20
        self.layers: list[dict[str, Any]] = []
        first_of: dict[Any, int] = {}
        for j, op in enumerate(g.ops):
            first_of.setdefault(op.layer, j)
        drawn = {r.layer: set(r.experts) for r in wl.routing}
        for m, layer in enumerate(cfg.moe_layers):
            ops = [j for j, op in enumerate(g.ops) if op.layer == layer and is_expert_op(op) and op.weight_bytes > 0]
            topk = next(j for j, op in enumerate(g.ops) if op.layer == layer and op.kind == "topk")
            groups = g.ops[ops[0]].attrs["groups"]
            expert_B = sum(g.ops[j].weight_bytes for j in ops) / groups
            pi = model.probs(m, cfg.num_experts, cfg.experts_per_token)
            chosen, hits, rate = prefetch_plan(pi, wl.tokens, expert_B, budget)
            L = {"layer": layer, "prefetched": chosen, "bytes": len(chosen) * expert_B, "expected_hits": hits,
                 "hit_rate": rate, "drawn_hits": len(drawn.get(layer, set()) & set(chosen)), "in_time": False,
                 "_ops": ops, "_done": math.nan, "_mark": 0.0}
            self.layers.append(L)
            if L["bytes"] <= 0:
                continue
            start = first_of[layer] - 1  # the layer starts once the op before it is seen
            issue = partial(self._issue, L)
            if start < 0:
                env.timeout(eng.t0).callbacks.append(issue)
            else:
                eng.op_signal(start).callbacks.append(issue)
            # before any loader waits on the top-k: the tiles' bytes change before they are loaded
            eng.op_signal(topk).callbacks.append(partial(self._seen, L))

    def _issue(self, L: dict[str, Any], _ev: object = None) -> None:
        eng = self.eng

        def done() -> None:
            L["_done"], L["_mark"] = eng.env.now, eng.hbm.arrived_now()
        eng.hbm.start(L["bytes"], eng.r.hbm_Bpus, eng.r.dram_latency_us, done)

    def _seen(self, L: dict[str, Any], _ev: object = None) -> None:
        eng = self.eng
        if L["_done"] != L["_done"] or eng.hbm.arrived_now() - L["_mark"] > self.l2_B - L["bytes"]:
            return  # not in yet, or pushed out of L2: the tiles stream as without it
        L["in_time"] = True
        h, l2 = L["hit_rate"], eng.r.l2_per_sm_Bpus
        for j in L["_ops"]:
            for t in range(eng.op_first[j], eng.op_first[j + 1]):
                b = eng.pre_B[t]
                eng.pre_B[t] = b * (1.0 - h)
                eng.work_us[t] += b * h / l2

    def result(self) -> dict[str, Any] | None:
        if not hasattr(self, "layers"):
            return None
        layers = [{k: v for k, v in L.items() if not k.startswith("_")} for L in self.layers]
        n = len(layers) or 1
        return {"layers": layers, "hit_rate": sum(x["hit_rate"] for x in layers) / n,
                "in_time": sum(x["in_time"] for x in layers), "bytes": sum(x["bytes"] for x in layers)}

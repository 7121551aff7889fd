"""The engine piece of MoE static striding (its phantom slots' early exits), and what every MoE design
reports of a run (:func:`moe_stats`): per MoE layer, the expert tiles per SM (max / mean), the top-k's
serial time and which SM ran which expert."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from mksim.schedule.designs.moe_stride import MoEStride, MoEStridePolicy, is_expert_op, stride_slots

from .._design_run import DesignRun, runs
from .._result import task_experts

if TYPE_CHECKING:
    from .._engine import _Engine


def moe_stats(eng: _Engine) -> dict[str, Any]:
    """Per MoE layer of a finished run: its active experts, expert tiles, the most on one SM and the
    mean over the SMs (and their ratio, the imbalance), the top-k's serial time (from the router's
    end to the top-k's), and ``sm_experts``: the experts each SM ran tiles of."""
    g, n_sms = eng.g, eng.r.n_sms
    layers: dict[Any, dict[str, Any]] = {}
    ends = {(op.layer, op.kind): j for j, op in enumerate(g.ops) if op.kind == "topk" or op.attrs.get("moe")}
    experts = task_experts(g)
    for j, op in enumerate(g.ops):
        if not is_expert_op(op):
            continue
        L = layers.setdefault(op.layer, {"tiles": Counter(), "experts": {}})
        for t in range(eng.op_first[j], eng.op_first[j + 1]):
            sm = eng.lane_of[t]
            L["tiles"][sm] += 1
            et = experts[t]  # an expert op's task: (expert, tile)
            assert et is not None
            L["experts"].setdefault(sm, set()).add(et[0])
    out = []
    for layer, L in layers.items():
        tiles = sum(L["tiles"].values())
        top, mean = max(L["tiles"].values()), tiles / n_sms
        tk, router = ends.get((layer, "topk")), ends.get((layer, "matmul"))
        serial = eng.op_end[tk] - eng.op_end[router] if tk is not None and router is not None else None
        out.append({"layer": layer, "active": len(set().union(*L["experts"].values())), "tiles": tiles,
                    "max_tiles_per_sm": top, "mean_tiles_per_sm": mean, "imbalance": top / mean,
                    "topk_us": serial, "sm_experts": {sm: sorted(e) for sm, e in sorted(L["experts"].items())}})
    n = len(out) or 1
    return {"layers": out, "mean_imbalance": sum(x["imbalance"] for x in out) / n,
            "topk_us": sum(x["topk_us"] or 0.0 for x in out)}


@runs(MoEStride)
class MoEStrideRun(DesignRun):
    """A slot beyond the active experts costs its SM an early exit (an L2 read of the active list),
    paid before the SM's next task after the op."""

    def setup(self) -> None:
        eng = self.eng
        s = eng.s
        grid = (s.policy_options.get("grid") or eng.r.n_sms) if s.policy == MoEStridePolicy.name else eng.r.n_sms
        queues = s.queues or []
        self.phantoms = 0
        for j, op in enumerate(eng.g.ops):
            if not is_expert_op(op):
                continue
            last = eng.op_first[j + 1] - 1
            for sm, c in enumerate(stride_slots(eng.g, j, grid)):
                nxt = next((t for t in queues[sm] if t > last), None) if c else None
                if nxt is not None:
                    eng.work_us[nxt] += c * eng.r.l2_latency_us
                    self.phantoms += c

    def result(self) -> dict[str, Any] | None:
        if not hasattr(self, "phantoms"):
            return None
        return {**moe_stats(self.eng), "phantom_slots": self.phantoms}

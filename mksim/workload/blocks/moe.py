"""The mixture-of-experts FFN (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE): a router picks ``k`` of ``N``
experts per token, each a SwiGLU MLP ``expert_intermediate_size`` wide; their outputs, weighted, are summed
with a shared expert's (where the model has one) and the residual. The layers an MoE model keeps dense
(``ModelConfig.dense_layers``) are the :mod:`gated_mlp <mksim.workload.blocks.mlp>` block's.

Its ops in an MoE layer, for ``T`` tokens of which the step's routing (:mod:`mksim.workload.routing`,
``Step.routing``) sends ``r_e`` to each of the ``D`` distinct experts it draws:

- ``mlp_norm`` (unless ``fuse_norm``);
- ``router``: the ``hidden -> N`` logits (a matmul);
- ``topk`` (kind ``topk``): per token, softmax (or sigmoid) of its ``N`` logits, the top ``k`` and their
  weights, renormalised where ``norm_topk_prob``: a serial point, one task per token at most, each
  needing its token's whole router output;
- ``experts_gate_up`` (``experts_gate`` and ``experts_up`` with ``split_gate_up``), ``experts_silu_mul``
  (unless ``fuse_silu``), ``experts_down``: grouped matmuls over the *active* experts only, one group per
  expert (the gate/up's outputs as ``[gate of each expert | up of each expert]``); no task spans two
  experts, a task's rows are its expert's tokens (``attrs["group_rows"]``), and the weights read are the
  active experts' (``D x 3 x hidden x width``);
- the shared expert as a dense gated MLP (``shared_gate_up``, ``shared_silu_mul``, ``shared_down``) and
  Qwen2-MoE's ``shared_gate`` (``hidden -> 1``, its sigmoid scales the shared output);
- ``combine`` (kind ``combine``): each token's ``k`` expert outputs, weighted, + the shared expert + the
  residual.

What later designs read (the seams): a grouped op's ``attrs`` hold ``grouped = "experts"``, ``groups``,
``group_experts`` (the expert each group serves), ``group_rows`` (its tokens) and ``tokens``; ``topk``'s
hold the layer's routing (``experts``, ``top_k``, ``active``, ``expected_active``, ``active_std``).

Under tensor parallelism each expert's (and the shared expert's) width is ``1 / tp`` of it and
``combine.all_reduce`` after ``combine`` adds the residual; under expert parallelism (``ep``) the GPU holds
``experts / ep`` experts, ``dispatch`` (an ``all_to_all``) sends each token to its experts' GPUs and
``combine_back`` returns their outputs, and the GPU simulated is the one the draw loads most
(:func:`busiest_rank`; the routing of the whole batch, over all ``ep`` GPUs, is drawn).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from .._blocks import BLOCKS, BaseBlock
from .._builder import ACT_BYTES, MATMUL_ALIGN, VEC_ALIGN, Builder
from .._ops import Input
from ..kinds import KINDS, OpKind
from ..routing import RoutedLayer, parse_routing, route
from .mlp import GatedMLP

KINDS.register("topk", OpKind("topk", "vector", "an MoE router's scores (softmax or sigmoid), each token's top-k "
                                               "experts and their weights (renormalised where the config says)",
                               opcode=9))
KINDS.register("combine", OpKind("combine", "vector", "an MoE layer's output: each token's top-k expert outputs, "
                                                     "weighted, + the shared expert's + the residual", opcode=10,
                                  per_row=True))

WEIGHT_BYTES, INDEX_BYTES = 4, 4  # what the top-k writes per expert of a token: its weight (fp32), its index


@BLOCKS.add
class MixtureOfExperts(BaseBlock):
    """``moe``: the FFN of Mixtral, OLMoE, Qwen2-MoE and Qwen3-MoE (``ffn_block = "moe"``)."""

    name = "moe"
    role = "ffn"

    def ops(self, b: Builder, layer: int | None, x: str) -> str:
        cfg = b.cfg
        if layer is None or not cfg.moe_layer(layer):
            return GatedMLP().ops(b, layer, x)
        r = _routed(b, layer)
        H, N, k, I, T, p = cfg.hidden_size, cfg.num_experts, cfg.experts_per_token, cfg.expert_intermediate_size, \
            b.rows, f"L{layer}."
        h = b.norm(p + "mlp_norm", x, layer)
        logits = b.matmul(p + "router", h, H, N, layer, normed=True, attrs={"moe": "router"})
        topk = b.add(name=p + "topk", kind="topk", out_size=T, elem_bytes=k * (WEIGHT_BYTES + INDEX_BYTES),
                     flops=T * (5.0 * N + N * k + 2.0 * k), inputs=(Input(logits, full=True),), layer=layer,
                     attrs={"experts": N, "top_k": k, "scoring": cfg.router_scoring, "norm_topk_prob":
                            cfg.norm_topk_prob, "active": r.active, "expected_active": r.expected,
                            "active_std": r.std, "routing": b.step.routing})
        D, E, rows = r.active, r.experts, r.rows
        src = h
        if b.ep > 1:  # each token's hidden state to the GPUs of its k experts
            src = b.collective(p + "dispatch", "all_to_all", h, H, sum(rows) * ACT_BYTES, layer, b.ep,
                               T * k * H * ACT_BYTES, extra=(Input(topk, full=True),))
        feed = (Input(src, full=True), Input(topk, full=True))  # every expert's tokens, and which they are
        if b.build.split_gate_up:
            gate = _grouped(b, p + "experts_gate", feed, H, I, E, rows, layer, normed=True)
            up = _grouped(b, p + "experts_up", feed, H, I, E, rows, layer, normed=True)
            act = _silu_mul(b, p + "experts_silu_mul", (Input(gate), Input(up)), D * I, layer, E, rows)
        elif b.build.fuse_silu:  # one output per (gate, up) pair: the expert's weight rows come in pairs
            act = _grouped(b, p + "experts_gate_up", feed, H, I, E, rows, layer, normed=True, weight_n=2 * I,
                           extra={"epilogue": "silu_mul", "weight_rows": 2 * D * I}, epilogue_flops=5.0)
        else:  # [gate of each expert | up of each expert]: the SiLU of element i takes gate i and up D*I + i
            gu = _grouped(b, p + "experts_gate_up", feed, H, I, E + E, rows + rows, layer, normed=True)
            act = _silu_mul(b, p + "experts_silu_mul", (Input(gu, segments=((0, 1, 1), (D * I, 1, 1))),), D * I,
                            layer, E, rows)
        down = _grouped(b, p + "experts_down", (Input(act, group=H, segments=((0, I, I),)),), I, H, E, rows, layer)
        # each feature of a token sums that feature of its experts' outputs: feature i of expert g at g*H + i
        outs = Input(down, segments=tuple((g * H, 1, 1) for g in range(D)))
        if b.ep > 1:  # the experts' outputs back to their tokens' GPUs
            outs = Input(b.collective(p + "combine_back", "all_to_all", down, H, T * k * ACT_BYTES, layer, b.ep,
                                      sum(rows) * H * ACT_BYTES), full=True)
        res = b.residual(x)
        parts = [outs, *([Input(res)] if res else []), Input(topk, full=True)]
        flops = T * H * (2.0 * k + (1.0 if res else 0.0))
        if cfg.shared_expert_intermediate_size:
            shared, gated = _shared(b, layer, h)
            parts.append(Input(shared))
            flops += T * H * (1.0 + (1.0 if gated else 0.0)) + (4.0 * T if gated else 0.0)
            if gated:
                parts.append(Input(gated, full=True))
        out = b.add(name=p + "combine", kind="combine", out_size=H, elem_bytes=T * ACT_BYTES, flops=flops,
                    inputs=tuple(parts), layer=layer, align=VEC_ALIGN, attrs={"top_k": k, "active": D})
        return b.all_reduce(out, layer, x)

    def params(self, cfg: Any, layer: int | None) -> int:
        if layer is None or not cfg.moe_layer(layer):
            return GatedMLP().params(cfg, layer)
        H, Is = cfg.hidden_size, cfg.shared_expert_intermediate_size
        return (H + H * cfg.num_experts + cfg.num_experts * 3 * H * cfg.expert_intermediate_size
                + 3 * H * Is + (H if cfg.shared_expert_gate else 0))


def _routed(b: Builder, layer: int) -> RoutedLayer:
    """This layer's routing, drawn once per step; the routing model is checked against the model first."""
    cfg, step = b.cfg, b.step
    moe_layers = cfg.moe_layers
    model = parse_routing(step.routing)
    if not b.routing:
        model.check(cfg.name, len(moe_layers), cfg.num_experts, cfg.experts_per_token)
    r = route(model, layer=layer, tokens=b.rows * b.ep, n_experts=cfg.num_experts, top_k=cfg.experts_per_token,
              moe_layer=moe_layers.index(layer), seed=step.routing_seed)
    b.routing.append(r)
    return r if b.ep == 1 else busiest_rank(r, cfg.num_experts // b.ep)


def busiest_rank(r: RoutedLayer, per_rank: int) -> RoutedLayer:
    """Under expert parallelism, the experts of the GPU that the step's draw sends the most tokens (GPU
    ``g`` holds experts ``g * per_rank`` to ``(g + 1) * per_rank - 1``): the all-to-all makes every GPU wait
    for it, so it is the one simulated. Its expected and spread are the layer's, shared evenly.

    >>> r = RoutedLayer(0, 4, experts=(1, 5, 6), rows=(1, 2, 3), expected=3.0, std=0.5)
    >>> busiest_rank(r, 4).experts, busiest_rank(r, 4).rows
    ((5, 6), (2, 3))
    """
    load: dict[int, int] = {}
    for e, n in zip(r.experts, r.rows, strict=True):
        load[e // per_rank] = load.get(e // per_rank, 0) + n
    g = max(load, key=lambda k: (load[k], -k))
    keep = [(e, n) for e, n in zip(r.experts, r.rows, strict=True) if e // per_rank == g]
    share = per_rank * len(load) / max(r.experts[-1] + 1, per_rank * len(load))
    return replace(r, experts=tuple(e for e, _ in keep), rows=tuple(n for _, n in keep),
                   expected=r.expected * share / len(load), std=r.std)


def _grouped(b: Builder, name: str, inputs: tuple[Input, ...], k: int, n: int, experts: tuple[int, ...],
             rows: tuple[int, ...], layer: int, *, normed: bool = False, weight_n: int | None = None,
             extra: dict[str, Any] | None = None, epilogue_flops: float = 0.0) -> str:
    """A grouped matmul: group ``g`` multiplies the ``rows[g]`` tokens routed to expert ``experts[g]`` by
    that expert's ``k`` x ``weight_n`` weight (``weight_n``: ``n``; a fused epilogue writes ``n`` of them);
    a ``normed`` one does the norm before it under ``fuse_norm``, once per op (as ``Builder.matmul``)."""
    G, wn, total = len(experts), weight_n or n, sum(rows)
    fused = b.build.fuse_norm and normed
    T = b.rows
    return b.add(name=name, kind="matmul", out_size=G * n, elem_bytes=ACT_BYTES * total / G,
                 flops=2.0 * total * k * wn + epilogue_flops * total * n + (4.0 * T * k if fused else 0.0),
                 weight_bytes=G * k * wn * b.weight_B + (k * ACT_BYTES if fused else 0.0), inputs=inputs,
                 layer=layer, align=math.gcd(MATMUL_ALIGN if weight_n is None else MATMUL_ALIGN // 2, n),
                 dtype=b.step.weight_dtype,
                 attrs={"k": k, "rows": max(rows), "fused_norm": fused, "grouped": "experts", "groups": G,
                        "group_experts": experts, "group_rows": rows, "tokens": T, **(extra or {})})


def _silu_mul(b: Builder, name: str, inputs: tuple[Input, ...], size: int, layer: int,
              experts: tuple[int, ...] | None = None, rows: tuple[int, ...] | None = None) -> str:
    """SiLU(gate) * up over ``size`` features: the experts' (grouped, with their rows) or the shared expert's."""
    if experts is None or rows is None:
        return b.add(name=name, kind="silu_mul", out_size=size, elem_bytes=b.rows * ACT_BYTES,
                     flops=5.0 * b.rows * size, inputs=inputs, layer=layer, align=VEC_ALIGN)
    G, total = len(experts), sum(rows)
    return b.add(name=name, kind="silu_mul", out_size=size, elem_bytes=ACT_BYTES * total / G,
                 flops=5.0 * total * size / G, inputs=inputs, layer=layer, align=math.gcd(VEC_ALIGN, size // G),
                 attrs={"rows": max(rows), "grouped": "experts", "groups": G, "group_experts": experts,
                        "group_rows": rows, "tokens": b.rows})


def _shared(b: Builder, layer: int, h: str) -> tuple[str, str | None]:
    """The shared expert (a gated MLP of ``shared_expert_intermediate_size``), and Qwen2-MoE's gate of it."""
    cfg, build, p = b.cfg, b.build, f"L{layer}."
    H, Is, T = cfg.hidden_size, cfg.shared_expert_intermediate_size, b.rows
    if build.split_gate_up:
        g = b.matmul(p + "shared_gate_proj", h, H, Is, layer, normed=True)
        u = b.matmul(p + "shared_up_proj", h, H, Is, layer, normed=True)
        act = _silu_mul(b, p + "shared_silu_mul", (Input(g), Input(u)), Is, layer)
    elif build.fuse_silu:
        act = b.matmul(p + "shared_gate_up", h, H, 2 * Is, layer, normed=True, out_size=Is, align=MATMUL_ALIGN // 2,
                       extra_flops=5.0 * T * Is, attrs={"epilogue": "silu_mul", "weight_rows": 2 * Is})
    else:
        gu = b.matmul(p + "shared_gate_up", h, H, 2 * Is, layer, normed=True)
        act = _silu_mul(b, p + "shared_silu_mul", (Input(gu, segments=((0, 1, 1), (Is, 1, 1))),), Is, layer)
    down = b.matmul(p + "shared_down", act, Is, H, layer)
    gate = b.matmul(p + "shared_gate", h, H, 1, layer, normed=True) if cfg.shared_expert_gate else None
    return down, gate

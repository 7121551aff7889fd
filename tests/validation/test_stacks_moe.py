"""The stacks' mixture-of-experts step on CPU at tiny sizes: the grouped-GEMM experts (bf16) and the
expert-by-expert loop (float32) against the float64 reference, the routing read back, the bytes a step
reads (only the chosen experts), the shapes transformers reads from each MoE config type, and the
single-op units of a sparse layer."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from validation.stacks import measure  # noqa: E402
from validation.stacks import ops as sops  # noqa: E402
from validation.stacks import torch_graph as tg  # noqa: E402

TINY = tg.Shape(name="tiny", hidden=32, intermediate=48, layers=3, heads=4, kv_heads=2, head_dim=8, vocab=50,
                eps=1e-6)
MOE = replace(TINY, experts=6, top_k=2, expert_intermediate=16, norm_topk=True, dense_layers=(1,))
VARIANTS = {"mixtral-like": {}, "olmoe-like": {"qk_norm": True, "qk_norm_full": True, "norm_topk": False,
                                               "kv_heads": 4},
            "qwen3-moe-like": {"qk_norm": True},
            "qwen2-moe-like": {"shared_intermediate": 24, "shared_gate": True, "norm_topk": False,
                               "attention_bias": True}}


def case(s: tg.Shape, dtype: torch.dtype, batch: int = 3, kv_len: int = 7) -> tuple:
    w = tg.make_weights(s, "cpu", dtype, seed=3)
    k, v = tg.new_cache(s, batch, kv_len, "cpu", dtype)
    return w, k, v, torch.tensor([1, 7, 42, 5][:batch]), torch.full((batch,), kv_len)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_moe_step_matches_the_float64_reference(variant: str, dtype: torch.dtype, tol: float) -> None:
    s = replace(MOE, **VARIANTS[variant])
    w, k, v, tokens, pos = case(s, dtype)
    k0, v0 = k.clone(), v.clone()
    got = tg.decode_step(s, w, tokens, pos, k, v, 7)
    want = tg.reference_step(s, w, tokens, k0, v0, 7)
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    # the dense layer kept its gated MLP; the sparse ones hold stacked experts and a router
    assert "wgu" in w["layers"][1] and "router" not in w["layers"][1]
    assert w["layers"][0]["wgu_e"].shape == (6, 32, 32) and w["layers"][2]["wdown_e"].shape == (6, 32, 16)


def test_grouped_and_loop_experts_agree_and_skip_unchosen_experts() -> None:
    s = MOE
    w, *_ = case(s, torch.bfloat16)
    lw = w["layers"][0]
    h = torch.randn(5, s.hidden, dtype=torch.bfloat16)
    topi = torch.tensor([[0, 3], [3, 0], [3, 5], [0, 5], [5, 3]])
    grouped = tg._experts_grouped(s, lw, h, topi)
    loop = tg._experts_loop(s, lw, h, topi)
    torch.testing.assert_close(grouped.float(), loop.float(), rtol=2e-2, atol=2e-2)
    # an expert nobody chose is never read: poisoning its weights changes nothing
    poisoned = {**lw, "wgu_e": lw["wgu_e"].clone(), "wdown_e": lw["wdown_e"].clone()}
    poisoned["wgu_e"][1] = float("nan")
    poisoned["wdown_e"][4] = float("nan")
    assert torch.equal(tg._experts_grouped(s, poisoned, h, topi), grouped)


def test_routing_counts_and_the_bytes_a_step_reads() -> None:
    s = MOE
    w, k, v, tokens, pos = case(s, torch.bfloat16)
    chosen = tg.routing_choices(s, w, tokens, pos, k, v, 7)
    counts = tg.routing_counts(s, chosen)
    assert len(counts) == 2 and all(len(c) == 6 and sum(c) == 3 * 2 for c in counts)
    per_expert = (2 * 16 * 32 + 32 * 16) * 2
    unchosen = sum(1 for c in counts for n in c if n == 0)
    every = measure.weight_bytes_read(s, w, 3)
    assert measure.weight_bytes_read(s, w, 3, counts) == every - unchosen * per_expert
    with pytest.raises(ValueError, match="routing has 1 layers"):
        measure.weight_bytes_read(s, w, 3, counts[:1])


RAW = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
       "num_key_value_heads": 2, "vocab_size": 100}


@pytest.mark.parametrize("raw,want", [
    ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2},
     {"experts": 8, "top_k": 2, "expert_intermediate": 96, "norm_topk": True, "qk_norm": False, "dense_layers": ()}),
    ({"model_type": "olmoe", "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False},
     {"experts": 64, "expert_intermediate": 96, "qk_norm": True, "qk_norm_full": True, "norm_topk": False}),
    ({"model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 32,
      "norm_topk_prob": True, "decoder_sparse_step": 2, "mlp_only_layers": [3]},
     {"expert_intermediate": 32, "intermediate": 96, "qk_norm": True, "qk_norm_full": False, "norm_topk": True,
      "dense_layers": (0, 2, 3)}),
    ({"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 16,
      "shared_expert_intermediate_size": 48},
     {"shared_intermediate": 48, "shared_gate": True, "attention_bias": True, "norm_topk": False}),
])
def test_shape_from_moe_configs(raw: dict, want: dict) -> None:
    s = tg.shape_from_config({**RAW, **raw}, "m")
    assert s.moe
    assert {k: getattr(s, k) for k in want} == want


def test_sparse_layer_units_run_and_carry_the_experts_bytes() -> None:
    s = replace(MOE, **VARIANTS["qwen2-moe-like"])
    w, k, v, tokens, pos = case(s, torch.bfloat16)
    units = {u.name: u for u in sops.eager_ops(s, w, tokens, pos, k, v, 7)}
    for name in ("router", "topk", "permute", "experts_gate_up", "experts_silu_mul", "experts_down", "combine",
                 "shared_gate_up", "shared_down", "shared_gate", "gate_up", "down"):
        units[name].fn()
    assert units["experts_down"].count == 2 and units["gate_up"].count == 1
    d = units["experts_gate_up"].nbytes
    assert d is not None and d % 2 == 0 and d > 2 * 16 * 32 * 2  # at least one expert's gate/up weights


def test_the_float32_reference_keeps_the_steps_experts() -> None:
    """Forcing the bf16 step's experts: the reference then differs from the step by rounding only, and a
    reference forced onto other experts differs by far more."""
    s = replace(MOE, layers=2, dense_layers=())
    w, k, v, tokens, pos = case(s, torch.bfloat16)
    for lw in w["layers"]:  # experts that matter: their output well above the residual's
        lw["wgu_e"].mul_(8)
        lw["wdown_e"].mul_(8)
    chosen = tg.routing_choices(s, w, tokens, pos, k, v, 7)
    step = tg.decode_step(s, w, tokens, pos, k, v, 7)
    same = measure.fp32_logits(s, w, tokens, pos, k, v, 7, chosen)
    assert measure.max_abs(step, same) < 0.05
    other = [(c + 1) % s.experts for c in chosen]
    wrong = measure.fp32_logits(s, w, tokens, pos, k, v, 7, other)
    assert measure.max_abs(step, wrong) > 4 * measure.max_abs(step, same)


@pytest.mark.parametrize("name", ["olmoe-1b-7b", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_moe_shapes_match_mksim_configs(name: str) -> None:
    """The stacks read the same built-in config file as mksim: the experts agree field for field."""
    from mksim import models
    s, cfg = tg.load_shape(name), models.get(name)
    assert (s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.vocab) == (
        cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size)
    assert (s.experts, s.top_k, s.expert_intermediate, s.shared_intermediate, s.shared_gate, s.norm_topk) == (
        cfg.num_experts, cfg.experts_per_token, cfg.expert_intermediate_size, cfg.shared_expert_intermediate_size,
        cfg.shared_expert_gate, cfg.norm_topk_prob)
    assert s.dense_layers == tuple(cfg.dense_layers)
    assert (s.qk_norm, s.qk_norm_full) == (cfg.qk_norm, cfg.qk_norm_scope == "all")

"""Built-in models against published sizes; Hugging Face config import; workload parameters."""

from __future__ import annotations

import json

import pytest

from mksim import models
from mksim.errors import UnknownNameError, WorkloadError

# Published parameter counts (Hugging Face model pages / model cards).
PUBLISHED_PARAMS = {
    "llama-3.2-1b": 1.24e9,   # meta-llama/Llama-3.2-1B
    "llama-3.2-3b": 3.21e9,   # meta-llama/Llama-3.2-3B
    "llama-3.1-8b": 8.03e9,   # meta-llama/Llama-3.1-8B
    "llama-3.1-70b": 70.56e9,  # meta-llama/Llama-3.1-70B params.json: 70,562,938,880 (github.com/thamada/modelQuery)
    "qwen3-8b": 8.2e9,        # Qwen/Qwen3-8B model card: "Number of Parameters: 8.2B"
    "qwen2.5-7b": 7.61e9,     # Qwen/Qwen2.5-7B model card: "Number of Parameters: 7.61B"
    "mistral-7b": 7.25e9,     # mistralai/Mistral-7B-v0.3
    # mixtures of experts: every expert counted (a decode step reads only the active ones)
    "olmoe-1b-7b": 6.9e9,     # OLMoE paper (arXiv 2409.02060): "6.9B total parameters, 1.3B active"
    "qwen3-30b-a3b": 30.5e9,  # Qwen/Qwen3-30B-A3B model card: "30.5B in total and 3.3B activated"
    "mixtral-8x7b": 46.7e9,   # Mixtral of Experts (arXiv 2401.04088): "46.7B total parameters"
}
DENSE = sorted(n for n in PUBLISHED_PARAMS if not models.get(n).num_experts)


def test_builtin_models():
    assert set(models.names()) == set(PUBLISHED_PARAMS)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_param_count_matches_published(name):
    got = models.get(name).param_count()
    assert abs(got / PUBLISHED_PARAMS[name] - 1) < 0.01, got


@pytest.mark.parametrize("name", DENSE)
def test_decode_weight_bytes_follow_param_count(name):
    cfg = models.get(name)
    wl = models.workload(name, batch=2, kv_len=100)
    embed = cfg.vocab_size * cfg.hidden_size
    # a decode step reads every weight once, the embedding only for its tokens; a tied
    # LM head reads the embedding table in full
    expected = 2 * (cfg.param_count() - (0 if cfg.tie_word_embeddings else embed)) + 2 * 2 * cfg.hidden_size
    assert wl.weight_bytes == pytest.approx(expected)
    matmul_params = sum(op.weight_bytes for op in wl.ops if op.kind == "matmul") / 2
    attn = sum(op.flops for op in wl.ops if op.kind == "attn_partial")
    assert sum(op.flops for op in wl.ops if op.kind == "matmul") == pytest.approx(
        2 * 2 * matmul_params + 2 * 2 * cfg.hidden_size * cfg.num_layers, rel=1e-3)
    # each of 2 sequences attends to its 100 cached tokens and the new one, in every layer
    assert attn == pytest.approx(4 * cfg.num_heads * cfg.head_dim * 2 * 101 * cfg.num_layers)


def test_llama_1b_op_graph():
    wl = models.workload("llama-3.2-1b", batch=1, kv_len=1024)
    assert len(wl.ops) == 1 + 16 * 10 + 2
    names = [op.name for op in wl.ops[:11]]
    assert names == ["embed", "L0.attn_norm", "L0.qkv_proj", "L0.rope_kv", "L0.attn_partial",
                     "L0.attn_reduce", "L0.o_proj", "L0.mlp_norm", "L0.gate_up_proj", "L0.silu_mul",
                     "L0.down_proj"]
    assert wl.ops[-1].name == "lm_head" and wl.ops[-1].out_size == 128256
    # KV cache: 16 layers x 1024 tokens x (K+V) x 8 heads x 64 x 2 bytes, plus the appended token
    kv = 16 * 1024 * 2 * 8 * 64 * 2
    assert sum(op.kv_read_bytes for op in wl.ops) == kv
    assert sum(op.kv_write_bytes for op in wl.ops) == 16 * 2 * 8 * 64 * 2


def test_fp8_halves_matmul_weights():
    a = models.workload("llama-3.1-8b", weight_dtype="bf16")
    b = models.workload("llama-3.1-8b", weight_dtype="fp8")
    mm = lambda wl: sum(o.weight_bytes for o in wl.ops if o.kind == "matmul")  # noqa: E731
    assert mm(b) == pytest.approx(mm(a) / 2)


def test_prefill_computes_logits_of_last_tokens_only():
    wl = models.workload("llama-3.2-1b", batch=2, kv_len=0, phase="prefill", prefill_tokens=128)
    assert wl.tokens == 256
    lm = wl.ops[-1]
    assert lm.attrs["rows"] == 2
    qkv = wl.ops[wl.index["L0.qkv_proj"]]
    assert qkv.attrs["rows"] == 256
    # causal attention over the new tokens: sum_{i=1..N} i per head per sequence
    attn = wl.ops[wl.index["L0.attn_partial"]].flops
    assert attn == pytest.approx(4 * 32 * 64 * 2 * (128 * 129 / 2))


@pytest.mark.parametrize("kw,match", [
    ({"batch": 0}, "batch must be a positive integer"),
    ({"kv_len": -1}, "kv_len .* must be an integer >= 0"),
    ({"phase": "train"}, "phase must be 'decode' or 'prefill'"),
    ({"phase": "prefill"}, "prefill needs prefill_tokens"),
    ({"weight_dtype": "int3"}, "weight dtype must be"),
    ({"kv_len": 10**7}, "exceeds llama-3.2-1b's context"),
])
def test_impossible_parameters(kw, match):
    with pytest.raises(WorkloadError, match=match):
        models.workload("llama-3.2-1b", **kw)


def test_unknown_model_lists_known():
    with pytest.raises(UnknownNameError) as info:
        models.get("gpt-5")
    assert "llama-3.2-1b" in str(info.value) and "qwen3-8b" in str(info.value)


# -- Hugging Face config import --------------------------------------------------------
TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
        "max_position_embeddings": 2048, "tie_word_embeddings": False}


def test_from_hf_config_dict_and_file(tmp_path):
    a = models.from_hf_config(TINY, batch=1, kv_len=10)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY))
    b = models.from_hf_config(p, batch=1, kv_len=10)
    assert a.ops == b.ops
    assert b.model.head_dim == 32 and b.model.name == tmp_path.name
    assert len(a.ops) == 1 + 2 * 10 + 2


def test_builtin_equals_its_config_file():
    from mksim.models._config import _CONFIGS

    cfg = models.config_from_hf(_CONFIGS / "llama-3.1-8b.json", name="llama-3.1-8b")
    assert cfg == models.get("llama-3.1-8b")


def test_nested_text_config():
    cfg = models.config_from_hf({"model_type": "x", "text_config": TINY})
    assert cfg.hidden_size == 256


@pytest.mark.parametrize("patch,match", [
    ({"hidden_size": None}, "missing key 'hidden_size'"),
    ({"num_hidden_layers": -2}, "num_hidden_layers = -2; expected a positive integer"),
    ({"num_key_value_heads": 3}, "not a multiple"),
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
])
def test_bad_hf_config(patch, match):
    raw = {k: v for k, v in {**TINY, **patch}.items() if v is not None}
    with pytest.raises(WorkloadError, match=match):
        models.config_from_hf(raw)


def test_bad_config_file(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(WorkloadError, match="not a readable JSON config"):
        models.from_hf_config(p)
    with pytest.raises(WorkloadError, match="no such config file"):
        models.from_hf_config(tmp_path / "missing.json")

"""The torch_graph stack's pure parts on CPU: shapes from the configs, the decode step against a loop
reference at tiny sizes; the CUDA graph run itself is marked gpu."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from validation.stacks import torch_graph as tg  # noqa: E402

TINY = tg.Shape(name="tiny", hidden=32, intermediate=48, layers=2, heads=4, kv_heads=2, head_dim=8,
                vocab=50, eps=1e-6, rope_theta=10000.0)


@pytest.mark.parametrize("name", [name for name, _ in tg.CASES])
def test_shapes_match_mksim_configs(name: str) -> None:
    from mksim import models
    s, cfg = tg.load_shape(name), models.get(name)
    assert (s.hidden, s.intermediate, s.layers, s.heads, s.kv_heads, s.head_dim, s.vocab) == (
        cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
        cfg.vocab_size)
    assert (s.qk_norm, s.attention_bias, s.tie_word_embeddings) == (
        cfg.qk_norm, cfg.attention_bias, cfg.tie_word_embeddings)
    assert (s.eps, s.rope_theta) == (cfg.rms_norm_eps, cfg.rope_theta)
    w = tg.make_weights(replace(s, layers=1, vocab=8, hidden=16, intermediate=16, heads=2, kv_heads=1,
                                head_dim=8), "cpu", torch.float32)
    assert w["layers"][0]["wqkv"].shape == (32, 16)


@pytest.mark.parametrize("variant", [{}, {"qk_norm": True}, {"attention_bias": True},
                                     {"tie_word_embeddings": True}, {"kv_heads": 4}])
@pytest.mark.parametrize("batch,kv_len", [(1, 5), (3, 7)])
def test_decode_step_matches_reference(variant: dict, batch: int, kv_len: int) -> None:
    s = replace(TINY, **variant)
    w = tg.make_weights(s, "cpu", torch.float32, seed=3)
    k, v = tg.new_cache(s, batch, kv_len, "cpu", torch.float32)
    k0, v0 = k.clone(), v.clone()
    tokens = torch.tensor([1, 7, 42][:batch])
    pos = torch.full((batch,), kv_len, dtype=torch.long)
    got = tg.decode_step(s, w, tokens, pos, k, v, kv_len)
    want = tg.reference_step(s, w, tokens, k0, v0, kv_len)
    assert got.shape == (batch, s.vocab)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    # the step wrote exactly one new slot of the cache
    assert torch.equal(k[:, :, :, :kv_len], k0[:, :, :, :kv_len])
    assert not torch.equal(k[:, :, :, kv_len], k0[:, :, :, kv_len])


def test_weight_bytes_counts_tied_head_once() -> None:
    untied = tg.weight_bytes(tg.make_weights(TINY, "cpu", torch.bfloat16))
    tied = tg.weight_bytes(tg.make_weights(replace(TINY, tie_word_embeddings=True), "cpu", torch.bfloat16))
    assert untied - tied == TINY.vocab * TINY.hidden * 2


def test_percentile() -> None:
    xs = [float(i) for i in range(1, 12)]
    assert tg.percentile(xs, 0.5) == 6.0 and tg.percentile(xs, 0.1) == 2.0 and tg.percentile(xs, 0.9) == 10.0


@pytest.mark.gpu
def test_graph_case_runs(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    rows = tg.run_model("llama-3.2-1b", [(1, 64)], tmp_path, replays=20, trace=False)
    assert rows[0]["check"]["ok"] and rows[0]["kernels_per_step_graph"] > 0

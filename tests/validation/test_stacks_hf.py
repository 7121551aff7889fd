"""The transformers stacks' pieces on CPU with a tiny config: the config read from a mksim config file,
transformers' own model built from it, the prefill and a greedy decode with the dynamic cache (``hf``) and
with the static cache (``hf_compiled``'s cache, its forward not compiled here), which must agree; the
runner's stack names. The GPU runs themselves happen on the device (``stacks run --stacks hf,hf_compiled``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # transformers (a second or more to import) only where a test builds a model

from validation.stacks import cli, hf, runner  # noqa: E402

TINY = {"_source": "a test's config", "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50,
        "max_position_embeddings": 128, "tie_word_embeddings": False}


@pytest.mark.parametrize("extra", [{}, {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
                                        "moe_intermediate_size": 16, "head_dim": 8}])
def test_dynamic_and_static_caches_decode_alike(tmp_path: Path, extra: dict) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "tiny.json").write_text(json.dumps({**TINY, **extra}))
    config = hf.hf_config("tiny", tmp_path)
    assert config.model_type == extra.get("model_type", "llama") and config.hidden_size == 32
    model = hf.build(config, "cpu", torch.float32)
    firsts = {}
    for stack in hf.STACKS:
        cache = hf.new_cache(stack, config, 8 + 4)
        with torch.inference_mode():
            first = hf.prefill(model, cache, 2, 8, config.vocab_size)
            _, logits = hf.decode(model.forward, cache, first, 3, timed=False)
        assert first.shape == (2, 1) and logits.shape == (2, 50)
        assert int(cache.get_seq_length()) == 8 + 3  # the prefill, then one position a step
        firsts[stack] = logits
    torch.testing.assert_close(firsts["hf"], firsts["hf_compiled"], rtol=1e-4, atol=1e-4)


def test_the_runner_knows_the_stacks_and_runs_them_in_their_own_process() -> None:
    assert set(hf.STACKS) == set(runner.HF_STACKS) and set(runner.ALL_STACKS) > set(runner.STACKS)
    assert cli.name_list("torch_graph,hf", runner.ALL_STACKS, "stack") == ["torch_graph", "hf"]
    with pytest.raises(cli.ArgError, match="unknown stack 'vllm'"):
        cli.name_list("vllm", runner.ALL_STACKS, "stack")

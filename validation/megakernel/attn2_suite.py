"""The attention models' second set: the attention shapes the generated kernel builds but had never run on a GPU,
each in a model the importer reads, predicted before they are first measured (validation/results/h200-attn-2).

- :data:`PLAN` over :data:`CONFIGS` (Hugging Face configs, their shapes only; the weights are random):
  Phi-3-mini (multi-head attention at head size 96: 32 heads, read as the Llama block it is),
  H2O-Danube-1.8B (head size 80, groups of 4) and the same with a 512-position sliding window (the window
  the partials read, active at the suite's 1024 cached positions), Falcon3-1B (head size 256, groups of 2),
  Qwen3-1.7B (q/k norms per head, groups of 2), Qwen2.5-3B (q/k/v biases, groups of 8); batch 1 and 8,
  megakernel default and graph_pdl (the window: megakernel). And Qwen1.5-1.8B (multi-head attention with
  biases), whose FFN width 5504 is not a multiple of 256: refused in one line before any build.
- ``predict OUT``, ``run OUT [--only S ...] [--timeout S] [--predicted P]``, ``compare PREDICTED MEASURED...``:
  as ``python -m validation megakernel-attn`` (:mod:`validation.megakernel.attn_suite`), on these cases; the
  run compiles the five attention instances at once first.

Run ``python -m validation megakernel-attn2 --help``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from . import attn_suite as A
from . import suite_cli

GPU = A.GPU
MODES = ("megakernel", "graph_pdl")
# The shapes of each model's config.json (model_type as the importer reads it). Phi-3's decoder layer is the
# Llama block with q/k/v and gate/up stored fused (mksim fuses both anyway), so its config is read as llama's.
CONFIGS: dict[str, dict[str, Any]] = {
    "phi-3-mini": {"model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064, "rms_norm_eps": 1e-05,
                   "rope_theta": 10000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False},
    "h2o-danube-1.8b": {"model_type": "mistral", "hidden_size": 2560, "intermediate_size": 6912,
                        "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "vocab_size": 32000, "sliding_window": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
                        "max_position_embeddings": 16384, "tie_word_embeddings": False},
    "h2o-danube-1.8b-w512": {"model_type": "mistral", "hidden_size": 2560, "intermediate_size": 6912,
                             "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 8,
                             "vocab_size": 32000, "sliding_window": 512, "rms_norm_eps": 1e-05,
                             "rope_theta": 10000.0, "max_position_embeddings": 16384, "tie_word_embeddings": False},
    "falcon3-1b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 18,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 131072,
                   "rms_norm_eps": 1e-06, "rope_theta": 1000042.0, "max_position_embeddings": 8192,
                   "tie_word_embeddings": False},
    "qwen3-1.7b": {"model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
                   "tie_word_embeddings": True},
    "qwen2.5-3b": {"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936, "rms_norm_eps": 1e-06,
                   "rope_theta": 1000000.0, "max_position_embeddings": 32768, "tie_word_embeddings": True},
    "qwen1.5-1.8b": {"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 5504, "num_hidden_layers": 24,
                     "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
                     "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
                     "tie_word_embeddings": False},
}
PLAN: A.Plan = [
    ("phi-3-mini", (1, 8), MODES),
    ("h2o-danube-1.8b", (1, 8), MODES),
    ("h2o-danube-1.8b-w512", (1, 8), ("megakernel",)),
    ("falcon3-1b", (1, 8), MODES),
    ("qwen3-1.7b", (1, 8), MODES),
    ("qwen2.5-3b", (1, 8), MODES),
    ("qwen1.5-1.8b", (1,), ("megakernel",)),
]


def all_cases() -> list[tuple[str, int, str]]:
    return A.all_cases(PLAN)


def predict(out_dir: Path, gpu: str = GPU) -> dict:
    """``OUT/predicted.json``: every case's prediction (or its refusal), before the run."""
    return A.predict(out_dir, gpu, plan=PLAN, configs=CONFIGS)


def run(out_dir: Path, only: list[str], timeout_s: float | None, reps: int = 20, say: Any = lambda _msg: None,
        measure: Any = None) -> dict:
    """The cases on the GPU into ``OUT/measured.json`` (:func:`validation.megakernel.attn_suite.run`)."""
    return A.run(out_dir, only, timeout_s, reps, say, measure, plan=PLAN, configs=CONFIGS)


def main(argv: list[str] | None = None) -> int:
    return suite_cli.main(argv, "python -m validation megakernel-attn2", __doc__.split("\n")[0], predict, run,
                          A.compare, A._table)


if __name__ == "__main__":
    sys.exit(main())

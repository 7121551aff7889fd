"""The k-chunked input rows' cases: 7-12 B models at batch 8, whose FFN down projection's
input rows (T x intermediate_size) do not fit in shared memory whole and are chunked along k
(``mk_matmul_kc``, ``program.k_chunk``), predicted before they are first measured.

- :data:`PLAN`: llama-3.1-8b at batch 1 and 8, qwen3-8b and qwen2.5-7b at batch 8, and Mistral-NeMo-12B's
  shapes (:data:`CONFIGS`, read by the importer: hidden 5120, heads of 128, FFN 14336) at batch 1 and 8;
  megakernel default and graph_pdl. Batch 1 measures the unchunked step beside its batch 8.
- ``predict OUT``: every case's schedule, built as the device will build it, and its prediction with
  ``h200-mk-kernels`` into ``OUT/predicted.json`` with a SHA-256 of the schedule. Commit it before the run.
- ``run OUT [--only S ...] [--timeout S]``: on the GPU, the cases as the suite runs them (checked against
  torch, timed; ``OUT/measured.json``), then ``OUT/compare.json`` against ``--predicted``.
- ``compare PREDICTED MEASURED...``: as ``megakernel-attn compare``.

Run ``python -m validation megakernel-kchunk --help``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import hwmodels
import mksim
from mksim.errors import MksimError
from mksim.models import ModelConfig, config_from_hf
from mksim.workload import build_llm_workload
from validation import suite as vs

from . import attn_suite as A
from . import program as P
from . import suite_cli

GPU = A.GPU
KV_LEN = A.KV_LEN
CONFIGS: dict[str, dict[str, Any]] = {
    "mistral-nemo-12b": {"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336,
                         "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                         "head_dim": 128, "vocab_size": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-05,
                         "max_position_embeddings": 131072},
}
MODES = ("megakernel", "graph_pdl")
PLAN: list[tuple[str, tuple[int, ...], tuple[str, ...]]] = [
    ("llama-3.1-8b", (1, 8), MODES),
    ("qwen3-8b", (8,), MODES),
    ("qwen2.5-7b", (8,), MODES),
    ("mistral-nemo-12b", (1, 8), MODES),
]


def model_config(name: str) -> ModelConfig:
    return config_from_hf(CONFIGS[name], name=name) if name in CONFIGS else mksim.models.get(name)


def all_cases() -> list[tuple[str, int, str]]:
    return [(m, b, mode) for m, batches, modes in PLAN for b in batches for mode in modes]


def build(model: str, batch: int, mode: str, gpu: str = GPU):
    """The case's schedule, as :func:`validation.suite.build` makes a default case's."""
    if model not in CONFIGS:
        return vs.build(vs.Case(model, batch, mode, kv_len=KV_LEN), gpu)
    g = hwmodels.load(gpu)
    opts = P.kernel_options(model_config(model), batch, KV_LEN, gpu, mode=mode)
    wl = build_llm_workload(model_config(model), batch=batch, kv_len=KV_LEN, n_sms=g.sm.count)
    return mksim.build_schedule(wl, g, mode, **opts)


def predict(out_dir: Path, gpu: str = GPU) -> dict:
    """``predicted.json``: every case's prediction (or refusal) and which of its ops are chunked."""
    rows = []
    for model, batch, mode in all_cases():
        row: dict[str, Any] = {"name": A.case_name(model, batch, mode), "model": model, "batch": batch,
                               "mode": mode, "kv_len": KV_LEN}
        try:
            s = build(model, batch, mode, gpu)
            P.check_supported(s)
            plan = P.plan(s)
            chunked = sorted({op.name.split(".", 1)[-1]: r["off2"] for op, r in zip(s.workload.ops, plan.ops,
                                                                                     strict=True)
                              if r["opt"] & P.OPT_KCHUNK}.items())
            row.update(predicted_us=round(vs.predicted_us(s), 2), schedule_sha256=A.schedule_hash(s),
                       k_chunks=dict(chunked), x_region_B=plan.x_B, ring_depth=plan.depth)
        except MksimError as exc:
            row["refused"] = vs.one_line(exc)
        rows.append(row)
    doc = {"format": A.FORMAT, "version": 1, "gpu": gpu, "code": vs.code_version(), "cases": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def run(out_dir: Path, only: list[str], timeout_s: float | None, reps: int = 20,
        say: Any = lambda _msg: None, measure: Any = None) -> dict:
    """The cases on the GPU, as the suite runs them, into ``out_dir/measured.json``."""
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for model, batch, mode in all_cases():
            name = A.case_name(model, batch, mode)
            if only and not any(s in name for s in only):
                continue
            if model not in CONFIGS:
                cases.append(vs.Case(model, batch, mode))
                continue
            path = Path(tmp) / (name.replace("/", "-").replace(":", "-") + ".json")
            path.write_text(json.dumps(build(model, batch, mode).to_dict()))
            cases.append(vs.Case(model, batch, mode, schedule="default", schedule_file=str(path)))
        return vs.run_suite(cases, out_dir, measure, reps=reps, say=say, timeout_s=timeout_s, resume=True)


def main(argv: list[str] | None = None) -> int:
    return suite_cli.main(argv, "python -m validation megakernel-kchunk", __doc__.split("\n")[0],
                          predict, run, A.compare, A._table)


if __name__ == "__main__":
    sys.exit(main())

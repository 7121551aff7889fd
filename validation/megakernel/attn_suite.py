"""The attention models' cases: models that exercise the generated kernels' attention
beyond the suite's Llamas, predicted before they are first measured.

- :data:`CASES`: qwen3-8b (per-head q/k norms, group 4), qwen2.5-7b (q/k/v biases, group 7), and
  three imported Hugging Face configs, :data:`CONFIGS`: Qwen2-1.5B (biases, group 6), Llama-2-7B
  (multi-head attention, head size 128) and SmolLM2-1.7B (multi-head, head size 64); each at batch 1
  and 8 (the two 8B-class built-ins at batch 4 too: at 8 their down_proj inputs do not fit in shared
  memory until input rows are chunked along k, and the case is refused), megakernel default and
  graph_pdl. And qwen3-30b-a3b's attention (q/k norms, group 8) on a dense stand-in of 4 layers in
  ``graph`` mode, whose single ops are timed (``qwen3-30b-a3b-attn``).
- ``predict OUT``: every case's schedule, built here as the device will build it, and its
  prediction with ``h200-mk-kernels`` (:func:`validation.suite.predicted_us`) into
  ``OUT/predicted.json``, with a SHA-256 of the schedule, so that a run can show it measured the
  schedule predicted. Commit it before the run.
- ``run OUT [--only S ...] [--timeout S]``: on the GPU, the cases as the suite runs them
  (:func:`validation.suite.run_suite`: checked against torch, timed; ``OUT/measured.json`` in the
  suite's format), the imported models through schedule files (in a temporary folder: each case's
  record keeps its schedule).
- ``compare PREDICTED MEASURED...``: each measured case against the prediction made before, in a
  table (and ``--json FILE``), the schedules' hashes checked.

Run ``python -m validation megakernel-attn --help``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import hwmodels
import mksim
from mksim.errors import MksimError
from mksim.models import ModelConfig, config_from_hf
from mksim.schedule import MODE_DEFAULTS
from mksim.workload import build_llm_workload
from validation import suite as vs

from . import abcase, gpu, suite_cli
from . import program as P

GPU = "h200-mk-kernels"
KV_LEN = 1024
FORMAT = "mksim-validation-predicted"
# Hugging Face configs (their shapes; no weights): what the importer reads for these models
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                   "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                   "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": True,
                   "max_position_embeddings": 131072},
    "llama-2-7b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "rms_norm_eps": 1e-05,
                   "rope_theta": 10000.0, "max_position_embeddings": 4096},
    "smollm2-1.7b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                     "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 49152,
                     "rms_norm_eps": 1e-05, "rope_theta": 130000.0, "tie_word_embeddings": True,
                     "max_position_embeddings": 8192},
    # qwen3-30b-a3b's attention (32 query heads of 128, 4 KV heads, q/k norms per head) with a dense FFN
    "qwen3-30b-a3b-attn": {"model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
                           "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 4,
                           "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                           "tie_word_embeddings": False},
}
# (model, batches, modes)
PLAN: list[tuple[str, tuple[int, ...], tuple[str, ...]]] = [
    ("qwen3-8b", (1, 4, 8), ("megakernel", "graph_pdl")),
    ("qwen2.5-7b", (1, 4, 8), ("megakernel", "graph_pdl")),
    ("qwen2-1.5b", (1, 8), ("megakernel", "graph_pdl")),
    ("llama-2-7b", (1, 8), ("megakernel", "graph_pdl")),
    ("smollm2-1.7b", (1, 8), ("megakernel", "graph_pdl")),
    ("qwen3-30b-a3b-attn", (1, 8), ("graph",)),
]


#: a set of cases: (model, batches, modes) rows
Plan = list[tuple[str, tuple[int, ...], tuple[str, ...]]]


def model_config(name: str, configs: dict[str, dict[str, Any]] | None = None) -> ModelConfig:
    """A built-in model, or one of ``configs`` (default :data:`CONFIGS`) read by the importer."""
    configs = CONFIGS if configs is None else configs
    if name in configs:
        return config_from_hf(configs[name], name=name)
    return mksim.models.get(name)


def case_name(model: str, batch: int, mode: str) -> str:
    """The suite's name of a case (:attr:`validation.suite.Case.name`)."""
    return f"{model}/b{batch}/{mode}" + (":default" if mode == "megakernel" else "")


def all_cases(plan: Plan | None = None) -> list[tuple[str, int, str]]:
    """The (model, batch, mode) of every case of ``plan`` (default :data:`PLAN`), in its order."""
    return [(m, b, mode) for m, batches, modes in (PLAN if plan is None else plan) for b in batches for mode in modes]


def build(model: str, batch: int, mode: str, gpu: str = GPU, configs: dict[str, dict[str, Any]] | None = None):
    """The case's schedule, as :func:`validation.suite.build` makes a default case's: the kernel's
    options (``validation.suite.kernel_options``; :class:`validation.suite.Refused` where not even
    the mode's weight pages fit beside its inputs), the GPU's SMs, the mode's default policy. A model of
    ``configs`` (default :data:`CONFIGS`) is read by the importer, any other is a built-in."""
    configs = CONFIGS if configs is None else configs
    cfg = model_config(model, configs)
    if model not in configs:
        return vs.build(vs.Case(model, batch, mode, kv_len=KV_LEN), gpu)
    g = hwmodels.load(gpu)
    opts = P.kernel_options(cfg, batch, KV_LEN, gpu, mode=mode)
    room = g.sm.shared_memory_per_block_KiB - opts["smem_reserve_KiB"]
    if room < (1 if MODE_DEFAULTS[mode]["prefetch_depth"] else 2) * 32:
        raise vs.Refused(f"{model} batch {batch} does not fit the kernel's shared memory: its inputs and "
                         f"accumulators take {opts['smem_reserve_KiB']:g} of the "
                         f"{g.sm.shared_memory_per_block_KiB:g} KiB a block has")
    wl = build_llm_workload(cfg, batch=batch, kv_len=KV_LEN, n_sms=g.sm.count)
    return mksim.build_schedule(wl, g, mode, **opts)


def schedule_hash(schedule) -> str:
    return hashlib.sha256(json.dumps(schedule.to_dict(), sort_keys=True).encode()).hexdigest()


def predict(out_dir: Path, gpu: str = GPU, plan: Plan | None = None,
            configs: dict[str, dict[str, Any]] | None = None) -> dict:
    """``predicted.json``: every case's prediction (or refusal), made before it runs, of ``plan`` and
    ``configs`` (default :data:`PLAN`, :data:`CONFIGS`)."""

    rows = []
    for model, batch, mode in all_cases(plan):
        row: dict[str, Any] = {"name": case_name(model, batch, mode), "model": model, "batch": batch, "mode": mode,
                               "kv_len": KV_LEN}
        try:
            s = build(model, batch, mode, gpu, configs)
            P.check_supported(s)
            P.plan(s)  # what the kernel needs fits, as the run will find
            cfg = s.workload.model
            row.update(predicted_us=round(vs.predicted_us(s), 2), schedule_sha256=schedule_hash(s),
                       attention={"head_dim": cfg.head_dim, "group": cfg.num_heads // cfg.num_kv_heads,
                                  "qk_norm": cfg.qk_norm, "bias": cfg.attention_bias})
        except MksimError as exc:
            row["refused"] = vs.one_line(exc)
        rows.append(row)
    doc = {"format": FORMAT, "version": 1, "gpu": gpu, "code": vs.code_version(), "cases": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def run(out_dir: Path, only: list[str], timeout_s: float | None, reps: int = 20,
        say: Any = lambda _msg: None, measure: Any = None, plan: Plan | None = None,
        configs: dict[str, dict[str, Any]] | None = None) -> dict:
    """The cases of ``plan`` and ``configs`` (default :data:`PLAN`, :data:`CONFIGS`) on the GPU, as the suite
    runs them, into ``out_dir/measured.json`` (``measure``: the suite's runner by default,
    :func:`validation.megakernel.gpu.measure`; with it, the models' attention instances are compiled first,
    all at once: :func:`validation.megakernel.abcase.precompile`)."""
    configs = CONFIGS if configs is None else configs
    with tempfile.TemporaryDirectory() as tmp:  # the imported models' schedules (measured.json keeps each)
        cases = []
        for model, batch, mode in all_cases(plan):
            if only and not any(s in case_name(model, batch, mode) for s in only):
                continue
            if model not in configs:
                cases.append(vs.Case(model, batch, mode))
                continue
            try:
                s = build(model, batch, mode, configs=configs)
            except vs.Refused:
                continue  # refused before any schedule: predicted.json says so
            path = Path(tmp) / (case_name(model, batch, mode).replace("/", "-").replace(":", "-") + ".json")
            path.write_text(json.dumps(s.to_dict()))
            cases.append(vs.Case(model, batch, mode, schedule="default", schedule_file=str(path)))
        if measure is None:
            builds = sorted({gpu.compile_options("early", P.attn_defines(model_config(c.model, configs)))
                             for c in cases})
            say(f"compiled {len(builds)} attention instances at once: {abcase.precompile(builds)}")
        return vs.run_suite(cases, out_dir, measure, reps=reps, say=say, timeout_s=timeout_s, resume=True)


def compare(predicted: Path, measured: list[Path]) -> dict:
    """Each measured case against the prediction made before its run: predicted and measured µs,
    error, the kernel's largest relative error against torch, and whether the schedule measured is
    the one predicted (its hash, from the record's schedule)."""
    pred = {r["name"]: r for r in json.loads(predicted.read_text())["cases"]}
    rows = []
    for path in measured:
        for rec in json.loads(path.read_text())["cases"]:
            p = pred.get(rec["name"], {})
            m = rec.get("measurement") or {}
            row = {"name": rec["name"], "predicted_us": p.get("predicted_us"), "measured_us": m.get("measured_us"),
                   "max_rel_err": m.get("max_rel_err"), "ok": m.get("ok"),
                   "error": rec.get("error"), "refused": rec.get("refused") or p.get("refused")}
            if rec.get("schedule_json") is not None:
                h = hashlib.sha256(json.dumps(rec["schedule_json"], sort_keys=True).encode()).hexdigest()
                row["same_schedule"] = h == p.get("schedule_sha256")
            if row["predicted_us"] and row["measured_us"]:
                row["error_pct"] = round((row["predicted_us"] - row["measured_us"]) / row["measured_us"] * 100, 1)
            rows.append(row)
    errs = [abs(r["error_pct"]) for r in rows if "error_pct" in r]
    return {"cases": rows, "mape_pct": round(sum(errs) / len(errs), 1) if errs else None,
            "max_abs_error_pct": max(errs) if errs else None}


def _table(doc: dict) -> str:
    lines = ["| case | predicted µs | measured µs | error | max rel err | schedule as predicted |",
             "|---|---|---|---|---|---|"]
    for r in doc["cases"]:
        if r.get("refused") or r.get("error"):
            lines.append(f"| {r['name']} | {r.get('refused') or r.get('error')} | | | | |")
            continue
        lines.append(f"| {r['name']} | {r['predicted_us']:.1f} | {r['measured_us']:.1f} | "
                     f"{r.get('error_pct', 0):+.1f} % | {r['max_rel_err']:.1e} | {r.get('same_schedule')} |")
    lines.append(f"\nMAPE {doc['mape_pct']} %, largest |error| {doc['max_abs_error_pct']} %")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return suite_cli.main(argv, "python -m validation megakernel-attn", __doc__.split("\n")[0],
                          predict, run, compare, _table)


if __name__ == "__main__":
    sys.exit(main())

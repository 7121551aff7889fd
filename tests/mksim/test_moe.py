"""The mixture-of-experts block: bytes read are the active experts' weights, grouped tiles stay inside one
expert with its tokens as rows, dense layers stay dense, every config type imports (DeepSeek refused for
its latent attention), bad inputs are one line, and every mode simulates an MoE step."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mksim
from mksim import models
from mksim.compare import compare
from mksim.errors import WorkloadError
from mksim.schedule import MODES, Schedule
from mksim.workload import Step, TaskGraph, Tiling
from tests.mksim.simkit import first_layers
from tests.mksim.test_bad_inputs import assert_one_line, run_cli

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = json.loads((ROOT / "mksim/models/configs/qwen3-30b-a3b.json").read_text())
# a Qwen3-MoE small enough to simulate in a blink: 4 layers, 16 experts, top-4, layer 0 dense
TINY = {**QWEN3, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "num_experts": 16,
        "num_experts_per_tok": 4, "vocab_size": 4096, "mlp_only_layers": [0], "_name_or_path": "tiny-moe"}


def _cfg(**change: Any) -> models.ModelConfig:
    return models.config_from_hf({**TINY, **change})


def _expert_ops(wl: mksim.Workload) -> list[Any]:
    return [op for op in wl.ops if op.attrs.get("grouped") == "experts"]


def test_a_step_reads_the_distinct_experts_weights():
    cfg = models.get("qwen3-30b-a3b")
    H, I = cfg.hidden_size, cfg.expert_intermediate_size
    wl = models.workload("qwen3-30b-a3b", batch=8)
    assert [r.layer for r in wl.routing] == list(range(48))
    for r in wl.routing:
        layer = [op for op in _expert_ops(wl) if op.layer == r.layer]
        assert sum(op.weight_bytes for op in layer) == r.active * 3 * H * I * 2  # gate, up, down of each
        assert sum(r.rows) == 8 * 8 and all(op.attrs["group_experts"][:r.active] == r.experts for op in layer)
    s = wl.routing_summary()
    assert s is not None and s["expected_active_experts"] == pytest.approx(51.62, abs=0.01)
    assert abs(s["active_experts"] - 51.62) < 3 * s["active_experts_std"] / math.sqrt(48)
    # batch 1: 8 experts a layer, 6.08 GB a step (the issue's ~6.1 GB)
    one = models.workload("qwen3-30b-a3b", batch=1)
    assert {r.active for r in one.routing} == {8} and round(one.weight_bytes / 1e9, 2) == 6.08


def test_dense_layers_stay_dense():
    cfg = _cfg(decoder_sparse_step=2)  # sparse where (layer + 1) % 2 == 0, and never layer 0
    assert cfg.dense_layers == (0, 2) and cfg.moe_layers == (1, 3)
    wl = models.workload(cfg, batch=2)
    kinds = {layer: {op.name.split(".")[1] for op in wl.ops if op.layer == layer} for layer in range(4)}
    assert "gate_up_proj" in kinds[0] and "experts_gate_up" not in kinds[0] and "router" not in kinds[2]
    assert {"router", "topk", "experts_gate_up", "experts_silu_mul", "experts_down", "combine"} <= kinds[3]
    assert [r.layer for r in wl.routing] == [1, 3]
    dense = models.ModelConfig(**{**cfg.to_dict(), "num_experts": 0, "ffn_block": "gated_mlp",
                                  "experts_per_token": 0, "expert_intermediate_size": 0, "dense_layers": ()})
    per_moe = 256 + 256 * 16 + 16 * 3 * 256 * 128  # norm, router, experts
    per_dense = 3 * 256 * 512 + 256
    assert cfg.param_count() == dense.param_count() + 2 * (per_moe - per_dense)


def test_grouped_tasks_never_span_two_experts_and_take_their_experts_rows():
    wl = models.workload(_cfg(), batch=4)
    g = TaskGraph(wl, Tiling(default=7))
    for i, op in enumerate(wl.ops):
        if op.attrs.get("grouped") != "experts":
            continue
        G, width = op.attrs["groups"], op.out_size // op.attrs["groups"]
        assert g.n_tiles[i] % G == 0
        b = g.bounds[i]
        groups = b[:-1] // width
        assert ((b[1:] - 1) // width == groups).all()  # each task inside one group
        rows = np.asarray(op.attrs["group_rows"])[groups]
        assert (g.task_rows(i) == rows).all()
        a, z = int(g.op_first[i]), int(g.op_first[i + 1])
        per_row_width = g.flops[a:z] / (rows * np.diff(b))
        assert np.allclose(per_row_width, per_row_width[0])  # FLOPs go with rows x width
        assert g.weight_bytes[a:z] == pytest.approx(op.weight_bytes * np.diff(b) / op.out_size)
    assert g.task_rows(wl.index["L1.router"]) is None


@pytest.mark.parametrize("build", [{}, {"fuse_norm": True}, {"fuse_silu": True}, {"split_gate_up": True}])
def test_every_cut_of_the_op_graph_reads_the_same_experts(build):
    plain = models.workload(_cfg(), batch=4)
    wl = models.workload(_cfg(), batch=4, **build)
    assert [r.experts for r in wl.routing] == [r.experts for r in plain.routing]
    fused_norms = 256 * 2 * sum(1 for o in _expert_ops(wl) if o.attrs.get("fused_norm"))
    assert fused_norms == (256 * 2 * 3 if build.get("fuse_norm") else 0)  # gate_up in each of 3 MoE layers
    assert sum(o.weight_bytes for o in _expert_ops(wl) if o.kind == "matmul") == pytest.approx(
        sum(o.weight_bytes for o in _expert_ops(plain) if o.kind == "matmul") + fused_norms)
    TaskGraph(wl, Tiling(default=13)).check_acyclic()


CONFIGS = {  # model_type: (changes to a Qwen3-MoE config, what the importer reads)
    "mixtral": ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "num_experts": ...,
                 "moe_intermediate_size": ..., "mlp_only_layers": ..., "norm_topk_prob": ...},
                dict(num_experts=8, experts_per_token=2, expert_intermediate_size=512, norm_topk_prob=True,
                     dense_layers=(), qk_norm=False)),
    "olmoe": ({"model_type": "olmoe", "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": ...,
               "mlp_only_layers": ..., "num_key_value_heads": 4, "head_dim": ..., "norm_topk_prob": ...},
              dict(num_experts=64, expert_intermediate_size=512, norm_topk_prob=False, qk_norm=True,
                   qk_norm_scope="all", num_kv_heads=4)),
    "qwen2_moe": ({"model_type": "qwen2_moe", "shared_expert_intermediate_size": 384, "norm_topk_prob": False,
                   "attention_bias": ...},
                  dict(shared_expert_intermediate_size=384, shared_expert_gate=True, attention_bias=True,
                       dense_layers=(0,), qk_norm=False)),
    "qwen3_moe": ({}, dict(num_experts=16, experts_per_token=4, expert_intermediate_size=128, norm_topk_prob=True,
                           dense_layers=(0,), qk_norm=True, qk_norm_scope="head")),
}


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_config_import(model_type):
    change, want = CONFIGS[model_type]
    raw = {k: v for k, v in {**TINY, **change}.items() if v is not ...}
    cfg = models.config_from_hf(raw)
    assert cfg.ffn_block == "moe" and {k: getattr(cfg, k) for k in want} == want
    wl = models.workload(cfg, batch=3)
    names = {op.name for op in wl.ops}
    assert ("L1.shared_gate" in names) == (model_type == "qwen2_moe") == ("L1.shared_down" in names)
    back = Schedule.from_json(mksim.build_schedule(wl, "h200-datasheet", "graph").to_json())  # an imported MoE config
    assert back.workload == wl and back.workload.model == cfg  # round-trips through a schedule file


@pytest.mark.parametrize("model_type,scoring", [("deepseek_v2", "softmax"), ("deepseek_v3", "sigmoid")])
def test_deepseek_is_refused_for_its_latent_attention(model_type, scoring):
    raw = {**TINY, "model_type": model_type, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
           "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536}
    with pytest.raises(WorkloadError, match=f"{model_type} uses multi-head latent attention .kv_lora_rank = 512, "
                       r"q_lora_rank = 1536.: mksim has no MLA attention block yet \(its experts were read: 256 "
                       r"routed, top-8, a shared expert\)"):
        models.config_from_hf(raw)


def test_routing_travels_with_the_step():
    cfg = _cfg()
    a = models.workload(Step(cfg, batch=8, routing="zipf:1.5", routing_seed=2))
    assert a.name == "tiny-moe decode b8 kv1024 routing=zipf:1.5 seed2"
    assert a == models.workload(cfg, batch=8, routing="zipf:1.5", routing_seed=2)  # deterministic
    assert [r.experts for r in a.routing] != [r.experts for r in models.workload(cfg, batch=8).routing]
    back = Schedule.from_json(mksim.build_schedule(a, "h200-datasheet", "megakernel").to_json())
    assert back.workload == a and back.workload.step.routing == "zipf:1.5"
    with pytest.raises(WorkloadError, match="llama-3.2-1b has no experts: routing 'zipf:1.2' applies to mixture"):
        models.workload("llama-3.2-1b", routing="zipf:1.2")


def test_every_mode_simulates_an_moe_step():
    c = compare(Step(_cfg(), batch=4), "h200-datasheet", designs="all")
    assert set(MODES) <= set(c.results)
    lat = {k: r.latency_us for k, r in c.results.items()}
    assert all(0 < v < 1e4 for v in lat.values()), lat
    assert lat["megakernel"] < lat["stream"]


@pytest.mark.slow  # every mode and design
@pytest.mark.parametrize("batch", [1, 8])
def test_qwen3_30b_a3b_in_every_mode(batch):
    # its first 4 layers: every mode and design on its kind of layer (its 48 are that layer 48 times)
    c = compare(Step(first_layers("qwen3-30b-a3b"), batch=batch), "h200-datasheet", designs="all")
    lat = {k: r.latency_us for k, r in c.results.items()}
    floor = c.workload.bandwidth_floor_us(4.8e12)
    assert set(MODES) <= set(lat) and all(floor < v < 5 * floor for v in lat.values()), (floor, lat)


def _counts(tmp: Path, layers: int, experts: int) -> str:
    path = tmp / f"counts-{layers}x{experts}.json"
    path.write_text(json.dumps({"counts": [[1 + e for e in range(experts)] for _ in range(layers)]}))
    return str(path)


def _config_file(tmp: Path, **change: Any) -> str:
    path = tmp / "config.json"
    path.write_text(json.dumps({k: v for k, v in {**TINY, **change}.items() if v is not ...}))
    return str(path)


BAD = [  # (id, argv with {d} for tmp_path, the error's fragment)
    ("topk-over-experts", ["workload", "-m", "{cfg:num_experts_per_tok=32}"],
     "each token picks 32 experts (top-k) but there are 16; top-k must be at most the number of experts"),
    ("zero-experts", ["workload", "-m", "{cfg:num_experts=0}"], "num_experts = 0; a mixture of experts needs at"),
    ("shared-without-size", ["workload", "-m", "{cfg:model_type=qwen2_moe}"],
     "qwen2_moe has a shared expert; give its width, shared_expert_intermediate_size"),
    ("counts-layers", ["compare", "-m", "qwen3-30b-a3b", "--routing", "{counts:47x128}"],
     "47 layers of counts, but qwen3-30b-a3b has 48 MoE layers"),
    ("counts-experts", ["simulate", "-m", "qwen3-30b-a3b", "--routing", "{counts:48x64}"],
     "MoE layer 0 has 64 counts, but qwen3-30b-a3b has 128 experts"),
    ("zipf-abc", ["compare", "-m", "qwen3-30b-a3b", "--routing", "zipf:abc"], "zipf:S must be a number > 0"),
    ("zipf-neg", ["sweep", "-m", "qwen3-30b-a3b", "--routing", "zipf:-1"],
     "zipf:S must be a number > 0 (1.2 is typical), got '-1'"),
    ("routing-binary", ["workload", "-m", "qwen3-30b-a3b", "--routing", "{file:\x00\xff}"], "not valid JSON"),
    ("routing-not-json", ["search", "-m", "qwen3-30b-a3b", "--routing", "{file:counts please}", "--storage",
                          "memory"], "not valid JSON"),
    ("routing-dense", ["simulate", "-m", "llama-3.2-1b", "--routing", "zipf:1.2"], "llama-3.2-1b has no experts"),
    ("routing-folder", ["compare", "-m", "qwen3-30b-a3b", "--routing", "{d}/"], "a folder, not a regular file"),
]


@pytest.mark.parametrize("argv,fragment", [pytest.param(a, f, id=i) for i, a, f in BAD])
def test_bad_inputs_are_one_line(argv, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing lands in the checkout
    out = []
    for a in argv:
        if a.startswith("{cfg:"):
            k, v = a[5:-1].split("=")
            a = _config_file(tmp_path, **{k: int(v) if v.isdigit() else v})
        elif a.startswith("{counts:"):
            a = _counts(tmp_path, *map(int, a[8:-1].split("x")))
        elif a.startswith("{file:"):
            (tmp_path / "r.json").write_bytes(a[6:-1].encode("latin-1"))
            a = str(tmp_path / "r.json")
        out.append(a.replace("{d}", str(tmp_path)))
    code, _, err = run_cli(out, capsys)
    assert_one_line(code, err, fragment)


def test_a_huge_routing_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "huge.json"
    with open(path, "wb") as fh:
        fh.truncate(32 << 20)
    code, _, err = run_cli(["compare", "-m", "qwen3-30b-a3b", "--routing", str(path)], capsys)
    assert_one_line(code, err, "larger than 16 MiB")


def test_the_workload_command_reports_the_routing(capsys):
    code, out, _ = run_cli(["workload", "-m", "qwen3-30b-a3b", "-b", "8", "--json"], capsys)
    moe = json.loads(out)["moe"]
    assert code == 0 and moe["moe_layers"] == 48 and moe["expected_active_experts"] == pytest.approx(51.62, abs=0.01)
    assert moe["expert_weight_bytes"] == pytest.approx(moe["active_experts"] * 48 * 3 * 2048 * 768 * 2)


def test_a_config_built_in_python_is_checked():
    cfg = models.get("qwen3-30b-a3b")
    with pytest.raises(WorkloadError, match="each token picks 200 experts"):
        replace(cfg, experts_per_token=200)
    with pytest.raises(WorkloadError, match="router scoring 'relu'; known: softmax, sigmoid"):
        replace(cfg, router_scoring="relu")

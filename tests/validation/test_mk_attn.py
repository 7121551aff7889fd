"""The generated kernels' attention for the dense models the importer accepts (CPU; no GPU).

Plans for every attention variant the workload builds (any group size up to 8 with MHA, head sizes
64 to 256, q/k/v biases, q/k norms per head and over all heads, sliding windows): each streams what
the simulator charges and names its attention's template instance; what has no device function is
refused in one line before any build. The torch reference of each feature against the formula it
stands for, and the partials' and reduction's lane mapping (test_attn_mapping's emulation) at the
new shapes.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import mksim
from mksim.errors import ScheduleError
from mksim.models import ModelConfig, config_from_hf
from mksim.workload import build_llm_workload
from validation.megakernel import attn2_suite as A2
from validation.megakernel import program as P

from . import nvcc_builds
from . import test_attn_mapping as M
from .mkkit import cpu_buffers

# Hugging Face configs of dense models the importer takes, by their shapes (no weights, no network)
LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "rms_norm_eps": 1e-5}
SMOLLM2_1_7B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 49152, "rope_theta": 130000.0,
                "tie_word_embeddings": True}
QWEN2_1_5B = {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
              "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936, "rope_theta": 1e6,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
DANUBE_1_8B = {"model_type": "mistral", "hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 24,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "sliding_window": 512}
HEAD96 = {"model_type": "qwen3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 4,
          "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 96, "vocab_size": 32000}
HEAD256 = {"model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 32000}


def _cfg(spec) -> ModelConfig:
    return mksim.models.get(spec) if isinstance(spec, str) else config_from_hf(spec)


def _schedule(spec, batch: int, mode: str = "megakernel", kv_len: int = 1024, layers: int | None = None, **wl):
    """A step of ``spec`` on h200-calibrated with the kernel's options; ``layers``: its first layers only (a
    plan is the same per layer, so a test of what one layer streams needs two, not 28)."""
    cfg = _cfg(spec)
    if layers is not None:
        cfg = dataclasses.replace(cfg, num_layers=min(layers, cfg.num_layers))
    opts = P.kernel_options(cfg, batch, kv_len, "h200-calibrated", mode)
    return mksim.build_schedule(build_llm_workload(cfg, batch=batch, kv_len=kv_len, **wl), "h200-calibrated", mode,
                                **opts)


# -- plans ------------------------------------------------------------------------------------------
# (model, head size, group, what it exercises)
MODELS = [
    ("qwen2.5-7b", 128, 7, "bias"),
    ("qwen3-8b", 128, 4, "qk_norm"),
    (LLAMA2_7B, 128, 1, "mha"),
    (SMOLLM2_1_7B, 64, 1, "mha"),
    (QWEN2_1_5B, 128, 6, "bias"),
    (DANUBE_1_8B, 80, 4, "window"),
    (HEAD96, 96, 2, "qk_norm"),
    (HEAD256, 256, 1, "qk_norm"),
    # validation/results/h200-attn-2's models
    (A2.CONFIGS["phi-3-mini"], 96, 1, "mha"),
    (A2.CONFIGS["h2o-danube-1.8b-w512"], 80, 4, "window"),
    (A2.CONFIGS["falcon3-1b"], 256, 2, "head256"),
    (A2.CONFIGS["qwen3-1.7b"], 128, 2, "qk_norm"),
    (A2.CONFIGS["qwen2.5-3b"], 128, 8, "bias"),
]


# batch 8 of the two 8B-class built-ins needs input rows chunked along k (their 18944- and 12288-wide
# down_proj inputs do not fit in shared memory beside the pages): batch 4 there
CASES = [(spec, D, G, feature, b) for spec, D, G, feature in MODELS
         for b in ((1, 4) if spec in ("qwen2.5-7b", "qwen3-8b") else (1, 8))]


@pytest.mark.parametrize("spec,D,G,feature,batch", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_plans_stream_what_the_simulator_charges(spec, D, G, feature, batch):
    s = _schedule(spec, batch, layers=2)
    plan = P.plan(s)
    cfg = s.workload.model
    assert plan.smem_B <= P.SMEM_MAX_B
    assert plan.defines == (f"-DMK_ATTN_HD={D}", f"-DMK_ATTN_G={G}") == P.attn_defines(cfg)
    assert P.attn_smem_bytes(D, G) <= plan.x_B
    rows = dict(zip([op.name for op in s.workload.ops], plan.ops, strict=True))
    # the weights, biases and q/k norm weights the kernel reads are the bytes the workload charges
    read = sum(b.nbytes for n, b in plan.buffers.items() if n.startswith(("w:", "w2:", "b:")) and n != "w:embed")
    assert read + batch * cfg.hidden_size * 2 == pytest.approx(s.workload.weight_bytes, rel=1e-12)
    biased = [n for n, r in rows.items() if r["bias"]]
    assert biased == ([f"L{i}.qkv_proj" for i in range(cfg.num_layers)] if cfg.attention_bias else [])
    rope = rows["L0.rope_kv"]
    if cfg.qk_norm:
        assert rope["opt"] == P.ROPE_NORM["head"] and plan.buffers[rope["W"]].shape == (D,)
        assert plan.buffers[rope["w2"]].shape == (D,) and rope["eps"] == cfg.rms_norm_eps
    else:
        assert rope["opt"] == 0 and rope["W"] is None
    window = cfg.window(0)
    assert rows["L0.attn_partial"]["K"] == (window if window is not None and window < 1025 else 0)


def test_a_norm_over_all_heads_reads_weights_of_all_of_q_and_k():
    """OLMoE's and OLMo 2's q/k norm: one weight per element of q (k), the sums over the whole row."""
    cfg = ModelConfig(name="olmo-like", hidden_size=2048, intermediate_size=8192, num_layers=2, num_heads=16,
                      num_kv_heads=16, head_dim=128, vocab_size=50304, qk_norm=True, qk_norm_scope="all")
    s = mksim.build_schedule(build_llm_workload(cfg, batch=4), "h200-calibrated", "megakernel",
                             **P.kernel_options(cfg, 4))
    plan = P.plan(s)
    rope = plan.ops[s.workload.index["L0.rope_kv"]]
    assert rope["opt"] == P.ROPE_NORM["all"]
    assert plan.buffers[rope["W"]].shape == (cfg.q_size,) and plan.buffers[rope["w2"]].shape == (cfg.kv_size,)


def test_a_split_projection_adds_each_bias_to_its_own_rows():
    s = _schedule(QWEN2_1_5B, 1, "graph", split_qkv=True)
    plan = P.plan(s)
    rows = dict(zip([op.name for op in s.workload.ops], plan.ops, strict=True))
    for name, n in (("q_proj", 1536), ("k_proj", 256), ("v_proj", 256)):
        assert plan.buffers[rows[f"L0.{name}"]["bias"]].shape == (n,)
    assert rows["L0.o_proj"]["bias"] is None


def test_a_fused_rope_keeps_the_bias_in_the_weights_row_order():
    """With RoPE in the projection's epilogue the weight's rows are stored in pairs; the bias is one
    per stored row, so the epilogue adds bias[p] to the sum of stored row p."""
    s = _schedule("qwen2.5-7b", 1, fuse_rope=True)
    plan = P.plan(s)
    i = s.workload.index["L0.qkv_proj"]
    row = plan.ops[i]
    assert row["opt"] & P.OPT_ROPE and plan.buffers[row["bias"]].shape == (s.workload.ops[i].out_size,)


# -- refusals ---------------------------------------------------------------------------------------
def _hf(**kw) -> dict:
    return {**LLAMA2_7B, "num_hidden_layers": 2, **kw}


@pytest.mark.parametrize("raw,msg", [
    (_hf(hidden_size=3200, num_attention_heads=32, num_key_value_heads=32),  # open_llama_3b: heads of 100
     "no attention device function: head size 100 is not a multiple of 16"),
    (_hf(num_key_value_heads=2), "no attention device function: 16 query heads per KV head is over 8"),
    (_hf(hidden_size=4352, num_attention_heads=16, num_key_value_heads=16, head_dim=272),
     "no attention device function: head size 272 is over 256"),
])
def test_attention_without_a_device_function_is_refused_in_one_line(raw, msg):
    wl = build_llm_workload(config_from_hf(raw), batch=1)
    s = mksim.build_schedule(wl, "h200-calibrated", "graph", blocks_per_sm=1)
    with pytest.raises(ScheduleError, match=msg) as exc:
        P.plan(s)
    assert "\n" not in str(exc.value)


def test_the_lane_per_position_partials_refuse_other_head_sizes(monkeypatch):
    monkeypatch.setenv("MKSIM_KERNEL_DEFINES", "-DMK_ATTN=1")
    with pytest.raises(ScheduleError, match="head size 80 with MK_ATTN=1"):
        P.plan(_schedule(DANUBE_1_8B, 1, "graph"))
    P.plan(_schedule(LLAMA2_7B, 1, "graph"))  # 128: built


# -- the torch reference of each feature -------------------------------------------------------------
TINY = dict(hidden_size=256, intermediate_size=512, num_layers=2, vocab_size=1000, max_position_embeddings=4096)


def _tiny_plan(batch=2, kv_len=70, **cfg_kw):
    cfg = ModelConfig(name="tiny", **(TINY | {"num_heads": 8, "num_kv_heads": 2, "head_dim": 64} | cfg_kw))
    wl = build_llm_workload(cfg, batch=batch, kv_len=kv_len, n_sms=8, kv_splits=3)
    # heads of 256: the partials' K and V tiles take 135 KiB, two pages fit beside them
    depth = {"prefetch_depth": 2} if cfg.head_dim > 128 else {}
    return P.plan(mksim.build_schedule(wl, "h200", "megakernel", blocks_per_sm=1, **depth))


def test_reference_adds_the_bias_before_rounding():
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plan = _tiny_plan(attention_bias=True)
    bufs = cpu_buffers(plan, torch)
    ref = reference.run(plan, bufs)
    x = ref["out:L0.attn_norm"].double()
    want = x @ bufs["w:L0.qkv_proj"].double().t() + bufs["b:L0.qkv_proj"].double()
    assert reference.rel_err(ref["out:L0.qkv_proj"], want) < 4e-3  # bf16 output rounding
    assert reference.rel_err(ref["out:L0.qkv_proj"], want - bufs["b:L0.qkv_proj"].double()) > 0.1


@pytest.mark.parametrize("scope", ["head", "all"])
def test_reference_norms_q_and_k_before_the_rotation(scope):
    """Qwen3's q_norm/k_norm (weights of head_dim, over each head) and OLMoE's (over all of q, all of
    k): x / rms(x) * w, then RoPE; v untouched."""
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plan = _tiny_plan(qk_norm=True, qk_norm_scope=scope, num_heads=4, num_kv_heads=4)
    bufs = cpu_buffers(plan, torch)
    ref = reference.run(plan, bufs)
    T, hd, Q = 2, 64, 256
    qkv = ref["out:L0.qkv_proj"].double()

    def norm(x, w, n):  # rows of n elements
        x = x.reshape(-1, n)
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()).reshape(T, -1)

    def rot(x):
        x = x.reshape(T, -1, hd)
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        c, s = bufs["rope"][:hd // 2].double(), bufs["rope"][hd // 2:].double()
        return torch.cat([a * c - b * s, b * c + a * s], -1).reshape(T, -1)

    n = hd if scope == "head" else Q
    q = rot(norm(qkv[:, :Q], bufs["w:L0.rope_kv"], n))
    k = rot(norm(qkv[:, Q:2 * Q], bufs["w2:L0.rope_kv"], n))
    got = ref["out:L0.rope_kv"]
    assert reference.rel_err(got[:, :Q], q) < 1e-2 and reference.rel_err(got[:, Q:2 * Q], k) < 1e-2
    assert torch.equal(got[:, 2 * Q:], ref["out:L0.qkv_proj"][:, 2 * Q:])
    assert reference.rel_err(got[:, :Q], rot(qkv[:, :Q])) > 0.05  # the norm changed something


@pytest.mark.parametrize("hd,nq,nkv,window", [(64, 8, 2, 33), (80, 16, 16, 0), (96, 8, 8, 20), (256, 4, 2, 0)])
def test_reference_attention_sees_only_the_window(hd, nq, nkv, window):
    """The reference's attention against the formula: any head size, groups down to 1 (MHA), a sliding window."""
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plan = _tiny_plan(num_heads=nq, num_kv_heads=nkv, head_dim=hd, **({"sliding_window": window} if window else {}))
    row = plan.ops[plan.schedule.workload.index["L0.attn_partial"]]
    assert row["K"] == window
    window = window or 71  # every position: the 70 cached and the new one
    bufs = cpu_buffers(plan, torch)
    ref = reference.run(plan, bufs)
    T, pos = 2, 70
    rope = ref["out:L0.rope_kv"].float()
    q = rope[:, :nq * hd].reshape(T, nq, hd)
    k = torch.cat([bufs["kc:0"][:, :, :pos].float(), rope[:, nq * hd:(nq + nkv) * hd].reshape(T, nkv, 1, hd)], 2)
    v = torch.cat([bufs["vc:0"][:, :, :pos].float(), rope[:, (nq + nkv) * hd:].reshape(T, nkv, 1, hd)], 2)
    G = nq // nkv
    k, v = k[:, :, -window:].repeat_interleave(G, dim=1), v[:, :, -window:].repeat_interleave(G, dim=1)
    att = torch.softmax(torch.einsum("thd,thpd->thp", q, k) / hd ** 0.5, dim=-1)
    want = torch.einsum("thp,thpd->thd", att, v).reshape(T, nq * hd)
    assert reference.rel_err(ref["out:L0.attn_reduce"], want) < 4e-3


@pytest.mark.parametrize("kw", [{"attention_bias": True}, {"qk_norm": True}, {"qk_norm": True, "qk_norm_scope": "all"},
                                {"num_kv_heads": 8}, {"sliding_window": 20}])
def test_reference_local_and_end_to_end_agree_on_their_own_outputs(kw):
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plan = _tiny_plan(**kw)
    bufs = cpu_buffers(plan, torch)
    e2e = reference.run(plan, bufs)
    local = reference.run(plan, {**bufs, **e2e}, local=True)
    assert all(reference.rel_err(local[n], e2e[n]) == 0.0 for n in plan.outputs)


# -- the partials' lane mapping at the new shapes ----------------------------------------------------
NEW_SHAPES = [(64, 1), (128, 1), (128, 2), (80, 4), (96, 1), (96, 2), (128, 7), (128, 8), (256, 1), (256, 2)]


@pytest.mark.parametrize("D,G", NEW_SHAPES)
@pytest.mark.parametrize("n,window", [(17, 0), (205, 0), (300, 70)])
def test_partial_mapping_matches_attention_at_new_shapes(D, G, n, window):
    """test_attn_mapping's lane-by-lane emulation of mk_attn_partial_tc: any head size a multiple of
    16 (80, 96: rows of 10 and 12 chunks, copied across rounds of the lanes), groups 1 to 8, and a
    sliding window (the last `window` positions, over two splits)."""
    rng = np.random.default_rng(D * 100 + G * 10 + n)
    op = M.Op(rng, T=1, hkv=1, G=G, D=D, splits=2 if window else 1, kv_total=n, s_max=n + 5, window=window)
    sm = M.Smem(M.attn_smem_bytes(D, G, 8))
    for i in range(op.n_parts):
        M.attn_partial(op, i, 256, sm)
    ref = M.reference_partials(op)
    got = op.out.astype(np.float64)
    if window:
        assert [op.span(i)[1:3] for i in range(2)] == [(n - window, n - window // 2), (n - window // 2, n)]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[:, G * D:], ref[:, G * D:], rtol=1e-5, atol=1e-5)
    assert np.linalg.norm(got[:, :G * D] - ref[:, :G * D]) <= 1e-5 * np.linalg.norm(ref[:, :G * D])


@pytest.mark.parametrize("D,G", [(80, 4), (96, 2), (128, 1), (256, 1)])
@pytest.mark.parametrize("C,T", [(1, 1), (5, 2), (33, 1)])
def test_reduce_mapping_matches_the_merge_at_new_shapes(D, G, C, T):
    M.test_reduce_mapping_matches_the_merge(D, G, C, T)


def test_every_built_in_and_new_shape_fits_the_x_region():
    for spec, D, G, _ in MODELS:
        wl = build_llm_workload(_cfg(spec), batch=1)
        assert M.attn_smem_bytes(D, G, P.CONSUMERS) == P.attn_smem_bytes(D, G)
        assert P.attn_smem_bytes(D, G) <= P.x_region_bytes(type("S", (), {"workload": wl})())


# -- the builds: one instance each, compiled for sm_90 -----------------------------------------------
ATTN_BUILDS = [name for name in nvcc_builds.BUILDS if name.startswith("mk-attn-")]
#: the persistent kernel's spill stores (bytes) of each instance, nvcc 13.0, sm_90, as first built (the first seven
#: at 9ba1dbe, the last three beside h200-attn-2's predictions); a build may not spill more. Heads of 80 and 96
#: (rows of 10 and 12 chunks over rounds of the lanes) and of 256 in groups of 2 spill the most; the 472-byte
#: spills that once slowed every task would fail (test_sentinel)
ATTN_SPILL_B = {"mk-attn-128x1": 4, "mk-attn-64x1": 0, "mk-attn-128x7": 4, "mk-attn-128x8": 0, "mk-attn-80x4": 20,
                "mk-attn-96x2": 20, "mk-attn-256x1": 12, "mk-attn-96x1": 12, "mk-attn-256x2": 24, "mk-attn-128x2": 4}


def test_every_attention_build_has_its_spill_bound():
    assert sorted(ATTN_SPILL_B) == sorted(ATTN_BUILDS)


@pytest.mark.skipif(nvcc_builds.NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ATTN_BUILDS)
@pytest.mark.slow
@pytest.mark.nvcc
def test_attention_instances_compile_for_sm90_without_more_spills(name):
    r = nvcc_builds.build(name)
    assert r.returncode == 0, r.stderr
    persistent = r.stderr.split("Function properties for mk_persistent")[1].splitlines()[1]
    assert int(re.search(r"(\d+) bytes spill stores", persistent).group(1)) <= ATTN_SPILL_B[name], persistent


# -- the cases predicted before their first run ------------------------------------------------------
def test_the_committed_predictions_name_every_case_once():
    import json
    from pathlib import Path

    from validation.megakernel import attn_suite as A

    doc = json.loads((Path(__file__).resolve().parents[2] / "validation/results/h200-attn/predicted.json").read_text())
    assert doc["format"] == A.FORMAT and doc["gpu"] == A.GPU
    assert [r["name"] for r in doc["cases"]] == [A.case_name(*c) for c in A.all_cases()]
    for r in doc["cases"]:  # a prediction, or a one-line refusal (batch 8 of the 8B-class built-ins)
        assert ("predicted_us" in r) != ("refused" in r)
        assert r.get("predicted_us", 1) > 0 and "\n" not in r.get("refused", "")
    refused = {r["name"] for r in doc["cases"] if "refused" in r}
    modes = ("megakernel", "graph_pdl")
    assert refused == {A.case_name(m, 8, mode) for m in ("qwen3-8b", "qwen2.5-7b") for mode in modes}
    attn = {(r["attention"]["head_dim"], r["attention"]["group"]) for r in doc["cases"] if "attention" in r}
    assert {(128, 1), (64, 1), (128, 6), (128, 7), (128, 8), (128, 4)} <= attn


def test_a_case_builds_the_same_schedule_each_time_and_compares(tmp_path):
    """The device rebuilds each schedule: the hash predicted is the hash run (same code); compare
    holds a measured record against the prediction and flags another schedule."""
    import json

    from validation.megakernel import attn_suite as A

    a, b = A.build("qwen3-30b-a3b-attn", 1, "graph"), A.build("qwen3-30b-a3b-attn", 1, "graph")
    assert A.schedule_hash(a) == A.schedule_hash(b)
    name = A.case_name("qwen3-30b-a3b-attn", 1, "graph")
    (tmp_path / "p.json").write_text(json.dumps({"cases": [{"name": name, "predicted_us": 110.0,
                                                            "schedule_sha256": A.schedule_hash(a)}]}))
    rec = {"name": name, "schedule_json": a.to_dict(), "measurement": {"measured_us": 100.0, "max_rel_err": 1e-4,
                                                                       "ok": True}}
    (tmp_path / "m.json").write_text(json.dumps({"cases": [rec]}))
    doc = A.compare(tmp_path / "p.json", [tmp_path / "m.json"])
    assert doc["cases"][0]["error_pct"] == 10.0 and doc["cases"][0]["same_schedule"] is True
    assert doc["mape_pct"] == 10.0
    rec["schedule_json"] = A.build("qwen3-30b-a3b-attn", 8, "graph").to_dict()
    (tmp_path / "m.json").write_text(json.dumps({"cases": [rec]}))
    assert A.compare(tmp_path / "p.json", [tmp_path / "m.json"])["cases"][0]["same_schedule"] is False


def test_run_measures_the_schedules_predicted(tmp_path):
    """run, with a stand-in for the GPU's measure: the imported models through schedule files, the
    built-ins as suite cases (qwen3-8b at batch 8, refused before its input rows were chunked); compare
    finds every schedule measured the one predict hashed (the schedule file read back is the schedule built)."""
    import json

    from validation.megakernel import attn_suite as A

    seen = []

    def measure(schedule, **kw):
        seen.append(schedule.workload.model.name)
        return {"measured_us": 1000.0, "max_rel_err": 1e-4, "ok": True}

    only = ["smollm2-1.7b/b1/megakernel", "qwen3-8b/b8/megakernel", "qwen3-30b-a3b-attn/b1"]
    doc = A.run(tmp_path, only, None, measure=measure)
    assert sorted(seen) == ["qwen3-30b-a3b-attn", "qwen3-8b", "smollm2-1.7b"]  # qwen3-8b b8: rows chunked along k
    assert {r["name"]: "refused" in r for r in doc["cases"]} == {
        "smollm2-1.7b/b1/megakernel:default": False, "qwen3-30b-a3b-attn/b1/graph": False,
        "qwen3-8b/b8/megakernel:default": False}
    predicted = tmp_path / "predicted.json"
    predicted.write_text(json.dumps({"cases": [
        {"name": A.case_name(m, 1, mode), "predicted_us": 900.0,
         "schedule_sha256": A.schedule_hash(A.build(m, 1, mode))}
        for m, mode in (("smollm2-1.7b", "megakernel"), ("qwen3-30b-a3b-attn", "graph"))]}))
    rows = A.compare(predicted, [tmp_path / "measured.json"])["cases"]
    mine = {A.case_name("smollm2-1.7b", 1, "megakernel"), A.case_name("qwen3-30b-a3b-attn", 1, "graph")}
    assert [r.get("same_schedule") for r in rows if r["name"] in mine] == [True, True]


def test_the_second_sets_predictions_name_every_case_once_and_each_new_feature():
    """validation/results/h200-attn-2: committed before its first run; every case predicted but Qwen1.5-1.8B's,
    refused in one line for its FFN width; an MHA model, one with biases, one with q/k norms, head sizes 80, 96
    and 256 and an active window, each at batch 1 and 8."""
    import json
    from pathlib import Path

    from validation.megakernel import attn_suite as A

    doc = json.loads((Path(__file__).resolve().parents[2] / "validation/results/h200-attn-2/predicted.json")
                     .read_text())
    assert doc["format"] == A.FORMAT and doc["gpu"] == A2.GPU
    assert [r["name"] for r in doc["cases"]] == [A.case_name(*c) for c in A2.all_cases()]
    refused = {r["name"]: r["refused"] for r in doc["cases"] if "refused" in r}
    assert refused == {"qwen1.5-1.8b/b1/megakernel:default":
                       "op L0.down_proj: input size 5504 is not a multiple of 256; the matmul has no device function "
                       "for it (its pages hold whole 512-byte units of a weight row)"}
    ran = [r for r in doc["cases"] if "predicted_us" in r]
    assert all(r["predicted_us"] > 0 and len(r["schedule_sha256"]) == 64 for r in ran)

    def batches(pred):
        return {r["batch"] for r in ran if pred(r["attention"])}

    assert batches(lambda a: a["group"] == 1) == {1, 8}
    assert batches(lambda a: a["bias"]) == batches(lambda a: a["qk_norm"]) == {1, 8}
    for d in (80, 96, 256):
        assert batches(lambda a, d=d: a["head_dim"] == d) == {1, 8}
    assert {(r["attention"]["head_dim"], r["attention"]["group"]) for r in ran} == {
        (96, 1), (80, 4), (256, 2), (128, 2), (128, 8)}


def test_the_second_set_runs_through_the_suite_with_its_own_configs(tmp_path):
    """attn2_suite.run: the imported models' schedules through schedule files, measured as predicted (the same
    hash), a stand-in for the GPU's measure (so nothing is compiled)."""
    import json

    from validation.megakernel import attn_suite as A

    seen = []

    def measure(schedule, **kw):
        seen.append((schedule.workload.model.name, schedule.workload.model.head_dim))
        return {"measured_us": 1000.0, "max_rel_err": 1e-4, "ok": True}

    doc = A2.run(tmp_path, ["falcon3-1b/b1/megakernel", "phi-3-mini/b8/graph_pdl"], None, measure=measure)
    assert seen == [("phi-3-mini", 96), ("falcon3-1b", 256)]
    assert [r["name"] for r in doc["cases"]] == ["phi-3-mini/b8/graph_pdl", "falcon3-1b/b1/megakernel:default"]
    pred = {"cases": [{"name": A.case_name(m, b, mode), "predicted_us": 900.0,
                       "schedule_sha256": A.schedule_hash(A.build(m, b, mode, configs=A2.CONFIGS))}
                      for m, b, mode in (("phi-3-mini", 8, "graph_pdl"), ("falcon3-1b", 1, "megakernel"))]}
    (tmp_path / "predicted.json").write_text(json.dumps(pred))
    rows = A.compare(tmp_path / "predicted.json", [tmp_path / "measured.json"])["cases"]
    assert [r["same_schedule"] for r in rows] == [True, True]

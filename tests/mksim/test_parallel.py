"""Tensor and expert parallelism: one GPU's share of a step adds up to the whole, the collective ops it
implies, the designs that run them, and bad splits refused in one line."""

from __future__ import annotations

from collections import defaultdict

import pytest

import mksim
from mksim import models
from mksim.errors import WorkloadError
from mksim.workload import COLLECTIVE_KINDS, parallel
from tests.clirun import mksim as run_cli


def _by_kind(wl, attr):
    out: dict[str, float] = defaultdict(float)
    for op in wl.ops:
        out[op.kind] += getattr(op, attr)
    return out


def _residual_flops(wl) -> float:
    """The residual adds a row-parallel product makes on one GPU (T x H each o_proj and down_proj)."""
    return sum(op.attrs["rows"] * op.out_size for op in wl.ops if op.name.endswith(("o_proj", "down_proj")))


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_shares_add_up_to_the_whole(tp):
    one = models.workload("llama-3.1-8b", batch=4, kv_len=1024)
    part = models.workload("llama-3.1-8b", batch=4, kv_len=1024, tp=tp)
    w1, wp = _by_kind(one, "weight_bytes"), _by_kind(part, "weight_bytes")
    f1, fp = _by_kind(one, "flops"), _by_kind(part, "flops")
    # sharded kinds, exactly: projections (by columns and rows, the head by vocabulary), attention, the KV cache
    assert wp["matmul"] * tp == w1["matmul"]  # every projection's weight split, the head's by vocabulary
    assert fp["matmul"] * tp == f1["matmul"] - _residual_flops(one)  # the residual moved to the all-reduce
    for kind in ("attn_partial", "attn_reduce", "rope_kv", "silu_mul"):
        assert fp[kind] * tp == f1[kind], kind
    assert part.kv_bytes * tp == one.kv_bytes
    # replicated: the norms and the embedding, on every GPU
    assert (fp["rmsnorm"], wp["embed"]) == (f1["rmsnorm"], w1["embed"])
    # the communication: two all-reduces a layer of the hidden state, and the logits gathered
    ar = [op for op in part.ops if op.kind == "all_reduce"]
    assert len(ar) == 2 * 32 and {op.attrs["message_B"] for op in ar} == {4 * 4096 * 2}
    (ag,) = [op for op in part.ops if op.kind == "all_gather"]
    assert ag.attrs["message_B"] == 4 * 128256 * 2 and ag.attrs["ranks"] == tp


def test_tp1_makes_the_same_ops_as_before():
    a, b = models.workload("llama-3.1-8b", batch=2), models.workload("llama-3.1-8b", batch=2, tp=1)
    assert a.ops == b.ops and a.name == b.name
    assert not any(op.kind in COLLECTIVE_KINDS for op in a.ops)


def test_expert_parallel_splits_the_experts_and_the_batch():
    one = models.workload("qwen3-30b-a3b", batch=8, kv_len=1024)
    part = models.workload("qwen3-30b-a3b", batch=8, kv_len=1024, ep=2)
    # attention is data-parallel: half the sequences, half the KV cache, all the attention weights
    assert part.kv_bytes * 2 == one.kv_bytes
    attn = [op for op in part.ops if op.name.endswith("qkv_proj")]
    assert attn[0].weight_bytes == next(op for op in one.ops if op.name == "L0.qkv_proj").weight_bytes
    # each MoE layer: dispatch and combine, all-to-all over 2 GPUs; the GPU's experts are its half's
    a2a = [op for op in part.ops if op.kind == "all_to_all"]
    assert len(a2a) == 2 * 48 and {op.attrs["ranks"] for op in a2a} == {2}
    dispatch = next(op for op in a2a if op.name == "L0.dispatch")
    assert dispatch.attrs["message_B"] == 4 * 8 * 2048 * 2  # 4 tokens a GPU, to 8 experts each
    experts = next(op for op in part.ops if op.name == "L0.experts_down").attrs["group_experts"]
    assert len({e // 64 for e in experts}) == 1  # one GPU's experts (64 of 128)


def test_tensor_and_expert_parallel_together_compose_the_two():
    # qwen3-30b-a3b (H 2048, 32 heads, 4 KV heads, 128 experts of width 768, top-8) at batch 8 on tp 2 x ep 4
    # GPUs: 4 groups of 2; a group runs attention tensor-parallel over its 2 sequences
    T, H, k = 2, 2048, 8
    both = models.workload("qwen3-30b-a3b", batch=8, kv_len=1024, tp=2, ep=4)
    ep = models.workload("qwen3-30b-a3b", batch=8, kv_len=1024, ep=4)
    tp = models.workload("qwen3-30b-a3b", batch=8, kv_len=1024, tp=2)
    one = models.workload("qwen3-30b-a3b", batch=8, kv_len=1024)
    assert both.kv_bytes * 8 == one.kv_bytes  # a quarter of the sequences, half of their heads
    w = {wl: {op.name: op.weight_bytes for op in wl.ops} for wl in (both, ep, tp)}
    assert w[both]["L0.qkv_proj"] == w[tp]["L0.qkv_proj"] and w[both]["lm_head"] == w[tp]["lm_head"]
    # the same draw (32 tokens) picks the same busiest group's experts, each at half its width
    for name in ("L0.experts_gate_up", "L0.experts_down", "L47.experts_down"):
        assert w[both][name] * 2 == w[ep][name], name
    coll = [(op.name.split(".", 1)[-1], op.kind, op.attrs["ranks"], op.attrs["message_B"])
            for op in both.ops if op.kind in COLLECTIVE_KINDS and op.layer == 0]
    dispatch_B = T * k * H * 2
    back = next(op for op in both.ops if op.name == "L0.combine_back")
    assert coll == [("o_proj.all_reduce", "all_reduce", 2, T * H * 2), ("dispatch", "all_to_all", 4, dispatch_B),
                    ("combine_back", "all_to_all", 4, back.attrs["message_B"]),
                    ("combine.all_reduce", "all_reduce", 2, T * H * 2)]
    # what comes back: the busiest group's expert outputs (partial sums over its half of each expert), H each
    rows = sum(next(op for op in both.ops if op.name == "L0.experts_down").attrs["group_rows"])
    assert back.attrs["message_B"] == rows * H * 2
    (ag,) = [op for op in both.ops if op.kind == "all_gather"]
    assert (ag.attrs["ranks"], ag.attrs["message_B"]) == (2, T * 151936 * 2)
    # one GPU holds half of each of a quarter of the experts; the embedding, the routers and the norms (2 a
    # layer, q/k norms of 128, the final one) whole; half of the rest (attention, the LM head)
    cfg = models.get("qwen3-30b-a3b")
    routed = 48 * 128 * 3 * H * 768
    whole = 151936 * H + 48 * 128 * H + 48 * (2 * H + 2 * 128) + H
    assert parallel.rank_param_count(cfg, 2, 4) == (cfg.param_count() - routed - whole) // 2 + routed // 8 + whole


def test_cli_tp_with_ep_needs_their_product_of_gpus():
    p = run_cli("compare", "--model", "qwen3-30b-a3b", "--gpu", "h200-datasheet", "--tp", "2", "--ep", "8",
                "--batch", "8")
    assert p.returncode == 2 and p.stderr == ("error: --tp 2 --ep 8 needs 16 GPUs (tp × ep) but a h200-datasheet "
                                              "node has 8; use at most 8\n")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model": "llama-3.1-8b", "tp": 3},
     "--tp 3 does not divide llama-3.1-8b's 32 attention heads; use one of 1, 2, 4, 8"),
    ({"model": "llama-3.1-8b", "tp": 16}, "--tp 16 does not divide llama-3.1-8b's 8 KV heads; use one of 1, 2, 4, 8"),
    ({"model": "llama-3.1-8b", "ep": 2}, "--ep 2: llama-3.1-8b is a dense model (no experts to split); use --tp"),
    ({"model": "qwen3-30b-a3b", "ep": 3}, "--ep 3 does not divide qwen3-30b-a3b's 128 experts; use one of 1, 2, 4, 8"),
])
def test_bad_splits_are_one_line(kwargs, message):
    with pytest.raises(WorkloadError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        models.workload(kwargs.pop("model"), **kwargs)


@pytest.mark.parametrize(("args", "message"), [
    (["--tp", "3"], "error: --tp 3 does not divide llama-3.1-8b's 32 attention heads"),
    (["--ep", "2"], "error: --ep 2: llama-3.1-8b is a dense model"),
])
def test_cli_refuses_a_bad_split(args, message):
    for cmd in ("compare", "simulate", "sweep"):
        p = run_cli(cmd, "--model", "llama-3.1-8b", "--gpu", "h200-datasheet", *args, *(["--batch", "1"]))
        assert p.returncode == 2 and p.stderr.startswith(message) and p.stderr.count("\n") == 1, (cmd, p.stderr)


def test_cli_refuses_more_gpus_than_the_node_has(tmp_path):
    small = tmp_path / "two.toml"
    small.write_text('extends = "h200-datasheet"\nname = "two"\n[interconnect]\n'
                     'gpus_count = { value = 2, source = "t" }\n[sources.t]\nkind = "estimate"\ntitle = "t"\n')
    p = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", str(small), "--tp", "4")
    assert p.returncode == 2 and p.stderr == "error: --tp 4 needs 4 GPUs but a two node has 2; use at most 2\n"


def test_compare_tp2_gives_every_mode_and_its_communication():
    c = mksim.compare.compare(mksim.Step("llama-3.1-8b", tp=2), "h200-datasheet").to_dict()["modes"]
    assert list(c) == list(mksim.schedule.MODES)  # every mode
    for row in c.values():
        assert 0 < row["communication_share"] < 1 and row["breakdown_us"]["communication"] > 0
    # NCCL between kernels costs the chain modes far more than the megakernel's one-shot in the kernel
    assert c["graph"]["communication_share"] > 5 * c["megakernel"]["communication_share"]


def test_the_megakernel_designs_order_as_their_mechanisms_say():
    wl = models.workload("llama-3.1-8b", batch=1, kv_len=1024, tp=4)
    lat = {c: mksim.simulate(mksim.build_schedule(wl, "h200-datasheet", "megakernel", collective=c),
                             timeline=False) for c in ("one_shot", "two_shot", "push")}
    comm = {c: r.communication_us for c, r in lat.items()}
    # a decode all-reduce is 8 KiB: one hop beats two; pushing as tiles finish leaves only the last flag
    assert comm["push"] < comm["one_shot"] < comm["two_shot"]
    with pytest.raises(mksim.errors.ScheduleError, match="runs inside a megakernel"):
        mksim.build_schedule(wl, "h200-datasheet", "graph", collective="push")
    with pytest.raises(mksim.errors.ScheduleError, match="no switch multicast"):
        mksim.build_schedule(wl, "a100", "megakernel", collective="multicast")

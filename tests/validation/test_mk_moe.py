"""The generated kernel's mixture-of-experts step on CPU: the tasks it runs (validation/megakernel/moe.py),
its op-table rows, the torch reference of its MoE ops against a plain MoE layer, and its refusals."""

from __future__ import annotations

import pytest

import mksim
from mksim import models
from mksim.errors import ScheduleError
from validation.megakernel import program as P
from validation.megakernel.encode import DEP_OP, OPCODES
from validation.megakernel.moe import KernelGraph

GPU = "h200-calibrated"


def _cfg(n_experts: int = 16, top_k: int = 4, shared: int = 0, hidden: int = 256, width: int = 256):
    raw = {"model_type": "qwen2_moe" if shared else "mixtral", "hidden_size": hidden, "intermediate_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
           "vocab_size": 1000, "num_experts_per_tok": top_k, "attention_bias": False}
    if shared:
        raw.update(num_experts=n_experts, moe_intermediate_size=width, shared_expert_intermediate_size=shared)
    else:
        raw.update(num_local_experts=n_experts, intermediate_size=width)
    return models.config_from_hf(raw)


def _plan(cfg, batch: int, mode: str = "megakernel", **opts):
    wl = models.workload(cfg, batch=batch, kv_len=40, fuse_silu=True)
    return P.plan(mksim.build_schedule(wl, GPU, mode, **{**P.kernel_options(cfg, batch, 40, GPU, mode), **opts}))


def _ready_order(plan) -> bool:
    """Whether every SM's queue can run to its end: each queue's head runs once its dependencies are done."""
    prog, g = plan.program, plan.graph
    heads = list(prog.queue_start[:-1])
    done_tiles = [set() for _ in g.ops]
    left = len(prog.tasks)
    while left:
        moved = False
        for sm in range(len(heads)):
            i = heads[sm]
            if i >= prog.queue_start[sm + 1]:
                continue
            row = prog.tasks[i]
            d0, nd = row[5], row[6]
            if all(set(range(t0, t1)) <= done_tiles[p] for _k, p, t0, t1 in prog.deps[d0:d0 + nd].tolist()):
                done_tiles[row[1]].add(int(row[2]))
                heads[sm] += 1
                left -= 1
                moved = True
        if not moved:
            return False
    return True


@pytest.mark.parametrize("batch", [1, 2, 8])
def test_the_kernel_runs_every_slot_once_in_an_order_that_completes(batch):
    plan = _plan(_cfg(), batch, moe_dispatch="stride")
    g, sg = plan.graph, plan.schedule.graph
    assert isinstance(g, KernelGraph)
    assert sorted(plan.program.task_id.tolist()) == list(range(len(g)))
    C = min(16, 4 * batch)
    for i, op in enumerate(g.ops):
        if op.kind == "topk":
            assert g.n_tiles[i] == 1 and sg.n_tiles[i] == batch
        if op.attrs.get("grouped") == "experts":
            D = op.attrs["groups"]
            assert g.n_tiles[i] == C * sg.n_tiles[i] // D
            assert g.bounds[i][-1] == C * op.out_size // D
    assert _ready_order(plan)


def test_phantom_slots_go_where_moe_stride_charges_them():
    plan = _plan(_cfg(), 8, moe_dispatch="stride")
    g, sched = plan.graph, plan.schedule
    prog = plan.program
    sm_of = {}
    for sm in range(len(prog.queue_start) - 1):
        for t in prog.task_id[prog.queue_start[sm]:prog.queue_start[sm + 1]].tolist():
            sm_of[t] = sm
    n_sms = len(sched.queues)
    for i, op in enumerate(g.ops):
        if op.attrs.get("grouped") != "experts":
            continue
        for s in range(int(g.n_tiles[i])):  # every slot tile: real ones where the schedule put them
            t = int(g.op_first[i]) + s
            if s < op.attrs["groups"] * g.per[i]:
                gt = int(sched.graph.op_first[i]) + s
                assert any(gt in q and sm == sm_of[t] for sm, q in enumerate(sched.queues))
            else:
                assert sm_of[t] == s % n_sms


def test_expert_dependencies_are_the_kernels_not_the_draws():
    plan = _plan(_cfg(), 8, moe_dispatch="stride")
    g = plan.graph
    idx = {op.name: i for i, op in enumerate(g.ops)}
    tk, gu, dn, cb = (idx[f"L0.{n}"] for n in ("topk", "experts_gate_up", "experts_down", "combine"))
    last_slot = int(g.n_tiles[dn]) - 1  # a phantom slot of the draw: still waits for its own gate/up slot
    j = last_slot // g.per[dn]
    deps = g.deps(int(g.op_first[dn]) + last_slot)
    assert (gu, j * g.per[gu], (j + 1) * g.per[gu]) in deps
    assert (tk, 0, 1) in g.deps(int(g.op_first[gu]))
    assert (dn, 0, int(g.n_tiles[dn])) in g.deps(int(g.op_first[cb]))  # every slot, whichever are active
    rows = plan.program.deps.tolist()
    assert [DEP_OP, dn, 0, int(g.n_tiles[dn])] in rows


def test_moe_rows():
    plan = _plan(_cfg(shared=512), 2)
    rows = {op.name: r for op, r in zip(plan.schedule.workload.ops, plan.ops, strict=True)}
    C = 8
    tk, gu, dn, cb = (rows[f"L1.{n}"] for n in ("topk", "experts_gate_up", "experts_down", "combine"))
    assert (tk["kind"], tk["N"], tk["K"], tk["pos"], tk["opt"]) == (OPCODES["topk"], 16, 4, C, 0)
    assert plan.buffers[tk["out"]].shape == (1 + C + 2 * 2 * 4,)
    assert gu["opt"] == P.OPT_MMA | P.OPT_EXPERTS | P.OPT_SILU and gu["tokens"] == tk["out"]
    assert dn["opt"] == P.OPT_MMA | P.OPT_EXPERTS | P.OPT_SLOT_IN and dn["ld0"] == C * 256 and dn["pos"] == 256
    assert plan.buffers[gu["W"]].shape == (16 * 2 * 256, 256) and plan.buffers[dn["out"]].shape == (2, C * 256)
    assert (cb["kind"], cb["opt"], cb["in0"], cb["ld0"], cb["tokens"]) == (
        OPCODES["combine"], P.COMBINE_SHARED | P.COMBINE_GATED, dn["out"], C * 256, tk["out"])


@pytest.mark.parametrize("n_experts, top_k, batch, shared", [(16, 4, 1, 0), (16, 2, 8, 0), (8, 8, 2, 0),
                                                             (16, 4, 4, 512), (32, 4, 8, 0)])
def test_reference_moe_layer_is_a_plain_moe(n_experts, top_k, batch, shared):
    """The reference of the kernel's MoE ops (route table, slots, combine) gives what a plain MoE layer
    gives: per token softmax over the router logits, its top k renormalised, each chosen expert's SwiGLU."""
    torch = pytest.importorskip("torch")
    from tests.validation.mkkit import cpu_buffers
    from validation.megakernel import reference

    cfg = _cfg(n_experts, top_k, shared)
    plan = _plan(cfg, batch, moe_dispatch="stride")
    b = cpu_buffers(plan, torch, seed=batch + top_k)
    out = reference.run(plan, b)
    rows = {op.name: r for op, r in zip(plan.schedule.workload.ops, plan.ops, strict=True)}
    L = "L1."
    h = out[f"out:{L}mlp_norm"].float() if f"out:{L}mlp_norm" in out else None
    assert h is not None
    logits = out[f"out:{L}router"].float()
    x = out[rows[f"{L}combine"]["in1"]].float()
    Wgu, Wd = b[rows[f"{L}experts_gate_up"]["W"]].float(), b[rows[f"{L}experts_down"]["W"]].float()
    n = 256
    want = torch.zeros_like(x)
    for t in range(batch):
        p = torch.softmax(logits[t], -1)
        top = torch.topk(logits[t], top_k).indices
        w = p[top] / (p[top].sum() if cfg.norm_topk_prob else 1.0)
        for e, we in zip(top.tolist(), w.tolist(), strict=True):
            gu = Wgu[e * 2 * n:(e + 1) * 2 * n]
            gt = (h[t] @ gu[0::2].t()).bfloat16().float()
            up = (h[t] @ gu[1::2].t()).bfloat16().float()
            a = (gt / (1 + torch.exp(-gt)) * up).bfloat16().float()
            want[t] += we * (a @ Wd[e * 256:(e + 1) * 256].t()).bfloat16().float()
    if shared:
        sg = torch.sigmoid(out[f"out:{L}shared_gate"].float())
        want += sg * out[f"out:{L}shared_down"].float()
    want += x
    got = out[f"out:{L}combine"].float()
    assert reference.rel_err(got, want) < 1e-2
    rt = reference.route_parts(out[f"out:{L}topk"], batch, top_k, min(n_experts, batch * top_k))
    chosen = {int(e) for t in range(batch) for e in torch.topk(logits[t], top_k).indices}
    assert rt["count"] == len(chosen) and rt["experts"][:rt["count"]].tolist() == sorted(chosen)


def test_reference_topk_takes_the_lower_expert_on_a_tie_and_the_comparison_is_exact():
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    cfg = _cfg(8, 2)
    plan = _plan(cfg, 2)
    op = next(op for op in plan.schedule.workload.ops if op.kind == "topk")
    row = plan.ops[plan.schedule.workload.index[op.name]]
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, -1.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0]],
                          dtype=torch.bfloat16)
    step = reference.Step(bufs={}, cfg=cfg, T=2, pos=0, cos=None, sin=None)
    r = reference.REFERENCES["topk"](step, op, row, [logits])
    parts = reference.route_parts(r, 2, 2, 4)
    assert parts["count"] == 4 and parts["experts"].tolist() == [0, 1, 3, 7]  # 1 before 3: a tie at 3.0
    assert parts["slots"].tolist() == [[1, 2], [0, 3]]
    assert abs(parts["weights"].sum().item() - 2.0) < 1e-6  # mixtral renormalises its top k
    bad = r.clone()
    bad[1] = 2.0  # another expert in slot 0: not a rounding
    assert reference.op_rel_err(op, row, bad, r, {}) == float("inf") and reference.op_rel_err(op, row, r, r, {}) == 0


@pytest.mark.parametrize("opts, msg", [
    ({"moe_dispatch": "queue"}, "moe_dispatch='queue' .* has no device code yet"),
    ({"moe_prefetch_MiB": 16.0}, "moe_prefetch_MiB > 0"),
    ({"sync": "sentinel"}, "sync='sentinel'"),
])
def test_moe_designs_without_device_code_are_refused_in_one_line(opts, msg):
    with pytest.raises(ScheduleError, match=msg) as exc:
        _plan(_cfg(), 1, **opts)
    assert "\n" not in str(exc.value)


def test_unfused_expert_gate_up_is_refused_in_one_line():
    cfg = _cfg()
    wl = models.workload(cfg, batch=1, kv_len=40, fuse_silu=False)
    with pytest.raises(ScheduleError, match="fuse_silu=True") as exc:
        P.plan(mksim.build_schedule(wl, GPU, "megakernel", **P.kernel_options(cfg, 1, 40, GPU)))
    assert "\n" not in str(exc.value)


def test_mixtral_b8_does_not_fit_and_says_so_in_one_line():
    with pytest.raises(ScheduleError, match="shared memory per block") as exc:
        P.plan(mksim.build_schedule(models.workload("mixtral-8x7b", batch=8, fuse_silu=True), GPU, "megakernel",
                                    blocks_per_sm=1, moe_dispatch="stride"))
    assert "\n" not in str(exc.value)


def test_chain_modes_run_one_block_per_kernel_task():
    plan = _plan(_cfg(), 8, "graph")
    g = plan.graph
    assert plan.program.task_id.tolist() == list(range(len(g)))
    assert int(plan.program.op_tiles.sum()) == len(g)

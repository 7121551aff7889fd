"""The MoE device script's parts that run without a GPU: the trace's expert split on a made-up trace,
the cases planned (moe_ops --dry-run), and the fit of MoE single ops on a made-up file."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np

from tests.validation.test_mk_moe import _cfg, _plan
from validation import kernel_costs
from validation.megakernel import gpu


def _fake_runner(plan, counts: dict[int, int]):
    r = gpu.Runner.__new__(gpu.Runner)
    r.plan, r.schedule = plan, plan.schedule
    r.cp = types.SimpleNamespace(asnumpy=np.asarray)
    r.bufs = {}
    for op, out in zip(plan.schedule.workload.ops, plan.outputs, strict=True):
        if op.kind == "topk":
            r.bufs[out] = np.array([float(counts[op.layer])], dtype=np.float32)
    return r


def test_the_trace_splits_expert_tasks_by_their_slot_and_times_the_top_k():
    plan = _plan(_cfg(), 2, moe_dispatch="stride")  # C = 8 slots a layer
    g, prog = plan.graph, plan.program
    n = len(prog.tasks)
    tr = np.zeros((n, 4), dtype=np.int64)
    order = np.argsort(prog.task_id)  # made-up stamps: task t starts at 10 t us, waits 1, computes 2, publishes 0.5
    tr[order, 0] = np.arange(n) * 10_000
    tr[:, 1] = tr[:, 0] + 1000
    tr[:, 2] = tr[:, 1] + 2000
    tr[:, 3] = tr[:, 2] + 500
    ops = plan.schedule.workload.ops
    exit_rows = np.array([g.per[g.op_of[t]] > 0 and g.tile_of[t] // g.per[g.op_of[t]] >= 5 for t in prog.task_id])
    tr[exit_rows, 2] = tr[exit_rows, 1] + 300  # the slots past the active experts exit early
    r = _fake_runner(plan, {0: 5, 1: 5})
    out = r._moe_trace(tr)
    n_exp = int((g.per[g.op_of[prog.task_id]] > 0).sum())
    assert out["expert_exit"]["tasks"] == int(exit_rows.sum()) > 0
    assert out["expert_active"]["tasks"] + out["expert_exit"]["tasks"] == n_exp
    assert abs(out["expert_exit"]["compute_us"] - 0.3) < 1e-9 and abs(out["expert_active"]["compute_us"] - 2) < 1e-9
    idx = {op.name: i for i, op in enumerate(ops)}
    first = {i: int(g.op_first[i]) for i in range(len(ops))}
    want = np.mean([10 * (first[idx[f"L{L}.topk"]] - (first[idx[f"L{L}.router"] + 1] - 1)) for L in (0, 1)])
    assert abs(out["router_to_topk_us"] - want) < 1e-9


def test_the_device_script_plans_its_cases_on_the_cpu(tmp_path, monkeypatch):
    from validation.megakernel import moe_ops

    monkeypatch.setattr(moe_ops, "AB", (("olmoe-1b-7b", 1, "new", ""), ("olmoe-1b-7b", 1, "v1", "-DMK_MOE_V1=1")))
    monkeypatch.setattr(moe_ops, "AB_MORE", ())
    monkeypatch.setattr(moe_ops, "SINGLE", (("olmoe-1b-7b", 8), ("mixtral-8x7b", 8)))
    assert moe_ops.main([str(tmp_path), "--dry-run"]) == 0
    doc = json.loads((tmp_path / "moe_ops.json").read_text())
    assert [r["build"] for r in doc["ab"]] == ["new", "v1"] and doc["ab"][0]["predicted_us"] > 0
    olmoe, mixtral = json.loads((tmp_path / "single_ops.json").read_text())
    assert olmoe["kernel"]["page_B"] > 0 and olmoe["ops"] == 4 * 16  # top-k, gate/up, down, combine a layer
    assert "refused" in mixtral and "\n" not in mixtral["refused"]
    assert kernel_costs.records([[olmoe]]) == []  # the file is what kernel-costs reads (no records: a dry run)


def _single_ops_file(path: Path) -> Path:
    """Made-up single ops of MoE kinds, as moe_ops writes them: a top-k of 4 us at every batch, a combine
    of 2 us + 0.25 us a row, expert matmuls of 6 us a slot's task, and one dense matmul."""
    rows = []
    for model in ("olmoe-1b-7b", "qwen3-30b-a3b"):
        for b in (1, 8):
            ops = [{"op": "L0.topk", "kind": "topk", "N": b, "tiles": 1, "task_us_mean": 4.0, "task_us_max": 4.0,
                    "task_B_mean": 0.0, "l2": "flushed", "experts": 64, "top_k": 8},
                   {"op": "L0.combine", "kind": "combine", "N": 2048, "tiles": 32, "task_us_mean": 2.0 + 0.25 * (b - 1),
                    "task_us_max": 2.2 + 0.25 * (b - 1), "task_B_mean": 0.0, "l2": "flushed"},
                   {"op": "L0.experts_down", "kind": "matmul", "N": 2048 * 8, "K": 1024, "tiles": 256,
                    "task_us_mean": 6.0, "task_us_max": 7.0, "task_B_mean": 131072.0, "l2": "flushed", "GBps": 900.0,
                    "experts_op": True, "slots": 8, "per_slot": 32, "active_slots": 8, "task_rows": b,
                    "group_rows_mean": 1.0, "exit_us_mean": 1.5},
                   {"op": "L0.o_proj", "kind": "matmul", "N": 2048, "K": 2048, "tiles": 128, "task_us_mean": 5.0,
                    "task_us_max": 5.5, "task_B_mean": 65536.0, "l2": "flushed", "GBps": 1000.0}]
            rows.append({"model": model, "batch": b, "mode": "graph", "kernel": {"page_B": 32768, "depth": 4},
                         "single_ops": ops})
    f = path / "single_ops.json"
    f.write_text(json.dumps(rows))
    return f


def test_the_fit_prices_topk_and_combine_and_leaves_the_expert_matmuls_out(tmp_path, capsys):
    import hwmodels
    from mksim.costs import rates

    f = _single_ops_file(tmp_path)
    params = kernel_costs.fit(kernel_costs.records([json.loads(f.read_text())]))
    assert params["topk"]["task_fixed_us"]["value"] == 4.0
    assert abs(params["combine"]["task_fixed_us"]["value"] - 2.0) < 1e-9
    assert abs(params["combine"]["task_row_us"]["value"] - 0.25) < 1e-9
    assert "2 single ops" not in params["matmul"]["task_fixed_us"]["note"]  # o_proj only, never the experts
    assert params["matmul"]["task_fixed_us"]["note"].startswith("4 single ops (o_proj")
    prof = tmp_path / "mksim.toml"
    prof.write_text((Path(hwmodels.__file__).parent / "profiles" / "mksim.toml").read_text())
    before = rates(hwmodels.load("h200-calibrated", profile=str(prof))).device["matmul"]
    assert kernel_costs.main([str(f), "--kinds", "topk,combine", "--profile", str(prof)]) == 0
    printed = capsys.readouterr().out
    assert "wrote the [runtime.kernels.<kind>] tables of topk, combine" in printed
    assert "L0.experts_down" in printed and "at 1.00 rows" in printed  # held against the matmul table
    dev = rates(hwmodels.load("h200-calibrated", profile=str(prof))).device
    assert dev["topk"].fixed_us == 4.0 and dev["combine"].row_us == 0.25 and dev["matmul"] == before


def test_expert_check_holds_an_expert_matmul_against_the_matmul_table():
    import hwmodels
    from mksim.costs import rates

    r = rates(hwmodels.load("h200"))
    rec = {"op": "L0.experts_gate_up", "kind": "matmul", "experts_op": True, "task_us_mean": 10.0,
           "task_B_mean": 262144.0, "task_rows": 8, "group_rows_mean": 1.25, "batch": 8, "page_KiB": 32, "depth": 4}
    (c,) = kernel_costs.expert_check([rec], r.device["matmul"], r, r.device["matmul"].page_us)
    assert c["table_us"] > c["table_sim_rows_us"] > 0  # the kernel computes 8 rows; the simulator charges 1.25
    assert abs(c["error"] - (c["table_us"] / 10.0 - 1)) < 1e-12


def test_the_speed_script_plans_its_builds_on_the_cpu(tmp_path, monkeypatch):
    from validation.megakernel import moe_speed

    monkeypatch.setattr(moe_speed, "CASES", (("olmoe-1b-7b", 1, "plan", ("old", "new")),
                                             ("olmoe-1b-7b", 1, "plan_fn", ("new",))))
    assert moe_speed.main([str(tmp_path), "--dry-run"]) == 0
    doc = json.loads((tmp_path / "moe_speed.json").read_text())
    recs = doc["records"]
    assert [(r["design"], r["build"], r["defines"]) for r in recs] == [
        ("plan", "old", "-DMK_MOE_EARLY=0 -DMK_MOE_L2PF_B=0"), ("plan", "new", "-DMK_MOE_L2PF_B=262144"),
        ("plan_fn", "new", "-DMK_MOE_L2PF_B=262144")]
    assert recs[0]["predicted_us"] > 0 and recs[2]["tasks"] < recs[1]["tasks"]  # the norms fused: fewer tasks
    assert doc["compile"] == {"builds": 2}  # the builds the cases name, of the one model they run
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["design"], s["us"]) for s in summary] == [("plan", {}), ("plan_fn", {})]


def test_the_speed_summary_compares_builds_that_ran_correct():
    from validation.megakernel.moe_speed import summarize

    recs = [{"model": "m", "batch": 1, "design": "plan", "build": b, "ok": ok, "measured_us": us}
            for b, ok, us in (("old", True, 400.0), ("new", True, 300.0), ("early", False, 100.0))]
    (row,) = summarize(recs)
    assert row["us"] == {"old": 400.0, "new": 300.0} and row["new_over_old"] == 0.75 and "early_over_old" not in row


def test_an_expert_row_names_its_layers_top_k():
    """The producer's gate (MK_MOE_EARLY): an expert matmul's op-table row carries its layer's top-k op in
    off2, and no other row kind of an MoE step uses off2 but the k-chunked matmul."""
    from tests.validation.test_mk_moe import _cfg, _plan

    plan = _plan(_cfg(), 2)
    ops = plan.schedule.workload.ops
    idx = {op.name: i for i, op in enumerate(ops)}
    experts = [(op, r) for op, r in zip(ops, plan.ops, strict=True) if op.attrs.get("grouped") == "experts"]
    assert experts
    for op, r in experts:
        assert r["off2"] == idx[f"L{op.layer}.topk"] and ops[r["off2"]].kind == "topk"


def test_the_second_speed_script_plans_its_rounds_on_the_cpu(tmp_path, monkeypatch):
    """moe_speed2: a design's words reach the workload (KV splits) and the ring (page, depth); a bad round
    is refused in one line."""
    from validation.megakernel import moe_speed, moe_speed2

    s = moe_speed.schedule("olmoe-1b-7b", 1, "plan_fn_kv8_p31_d5")
    assert (s.options.page_KiB, s.options.prefetch_depth) == (31.0, 5)
    assert s.workload.build.fuse_norm and s.workload.build.kv_splits == 8
    monkeypatch.setattr(moe_speed2, "ROUNDS", {"2": (("olmoe-1b-7b", 1, "plan_fn_kv8_p31_d5", ("base", "ftopk")),)})
    assert moe_speed2.main([str(tmp_path), "--round", "2", "--dry-run"]) == 0
    recs = json.loads((tmp_path / "moe_speed.json").read_text())["records"]
    assert [(r["build"], r["defines"]) for r in recs] == [("base", ""), ("ftopk", "-DMK_MOE_FTOPK=1")]
    assert moe_speed2.main([str(tmp_path), "--round", "9"]) == 2

"""The A/B runner of the generated kernels (validation.megakernel.ab): its plan checks and its run
order, defines, budget and files, with the GPU run replaced (no GPU here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mksim.errors import MksimError
from validation.megakernel import ab

WL = {"kv_splits": 16, "fuse_norm": 1, "fuse_rope": 1, "fuse_silu": 1}


def _plan(tmp_path: Path, plan) -> Path:
    p = tmp_path / "plan.json"
    p.write_text(plan if isinstance(plan, str) else json.dumps(plan))
    return p


def _fake_row(us: float) -> dict:
    return {"measured_us": us, "measured_spread_us": 1.0, "predicted_us": 900.0, "GBps": 2500.0,
            "max_rel_err": 1e-4, "worst_op": "lm_head", "e2e_rel_err": 2e-2, "ok": True, "single_ops": [],
            "trace": {"span_us": us, "kinds": {"matmul": {"tasks": 3, "wait_us": 3.0, "compute_us": 9.25,
                                                          "publish_us": 0.06, "GBps_per_sm": 30.0}}}}


@pytest.mark.parametrize("plan, says", [
    ("{", "not valid JSON"),
    ({"cases": []}, "non-empty list 'cases'"),
    ({"cases": [{"name": "a", "model": "llama-3.2-1b", "batch": 1}], "reps": 0}, "reps must be a positive"),
    ({"cases": [{"name": "a b", "model": "llama-3.2-1b", "batch": 1}]}, "name must be letters"),
    ({"cases": [{"name": "a", "model": "llama-3.2-1b", "batch": 1}] * 2}, "used twice"),
    ({"cases": [{"name": "a", "model": "llama-3.2-1b", "batch": 1, "colour": 1}]}, "unknown key 'colour'"),
    ({"cases": [{"name": "a", "batch": 1}]}, "needs a model"),
    ({"cases": [{"name": "a", "model": "llama-3.2-1b", "batch": 0}]}, "batch must be a positive integer"),
    ({"cases": [{"name": "a", "model": "llama-3.2-1b", "batch": 1, "defines": "-DX=1; rm -rf /"}]},
     "defines must be -DNAME=VALUE"),
    ({"cases": [{"name": "a", "model": "llama-3.2-1b", "batch": 1, "wl": {"fuse_nrom": 1}}]},
     "unknown workload option 'fuse_nrom'"),
    ({"cases": [{"name": "a", "model": "gpt-9", "batch": 1}]}, "unknown model 'gpt-9'"),
    ({"cases": [{"name": "a", "model": "llama-3.2-1b", "batch": 1, "opt": {"dispatch": "dynamic"}}]},
     "the generated kernel cannot run this schedule"),
    ({"cases": [{"name": "a", "model": "llama-3.2-1b", "batch": 3}]}, "batch 1, 2, 4, 8"),
])
def test_a_bad_plan_is_refused_in_one_line_before_any_gpu_work(tmp_path, capsys, plan, says):
    path = _plan(tmp_path, plan)
    with pytest.raises(MksimError, match=None) as e:
        ab.load_plan(path)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert ab.main([str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and says in err
    assert not (tmp_path / "out").exists()


def test_the_cases_run_in_order_with_their_own_defines_within_the_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("MKSIM_KERNEL_DEFINES", "-DOUTSIDE=1")
    plan = ab.load_plan(_plan(tmp_path, {"reps": 7, "cases": [
        {"name": "base", "model": "llama-3.2-1b", "batch": 1, "wl": WL},
        {"name": "fd0", "model": "llama-3.2-1b", "batch": 1, "wl": WL, "defines": "-DMK_MM_FASTDIV=0",
         "opt": {"prefetch_depth": 3}, "reps": 3, "traces": True},
        {"name": "late", "model": "llama-3.2-1b", "batch": 8, "wl": {"fuse_norm": True}},
    ]}))
    seen, now = [], [0.0]

    def measure(s, *, reps, single_ops, raw_trace):
        seen.append((os.environ["MKSIM_KERNEL_DEFINES"], s.options.prefetch_depth, reps, raw_trace, s.workload.batch))
        now[0] += 250.0  # each case takes 250 s of the clock
        return _fake_row(1000.0 + len(seen))

    out = tmp_path / "out"
    rows = ab.run_plan(plan, out, budget_s=400, measure=measure, clock=lambda: now[0], say=lambda m: None)
    assert [d for d, *_ in seen] == ["", "-DMK_MM_FASTDIV=0"]          # each case's defines alone
    assert [(depth, reps) for _d, depth, reps, _r, _b in seen] == [(4, 7), (3, 3)]
    assert seen[0][3] is None and seen[1][3] == str(out / "fd0.npz")
    assert os.environ["MKSIM_KERNEL_DEFINES"] == "-DOUTSIDE=1"        # restored
    assert rows[2] == {"name": "late", "skipped": "the 400 s budget was spent"}  # 500 s > 400 s
    assert rows[0]["measured_us"] == 1001.0 and rows[1]["matmul"] == {"wait_us": 3.0, "compute_us": 9.25}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cases"] == rows and [c["name"] for c in summary["plan"]["cases"]] == ["base", "fd0", "late"]
    assert "_wl" not in summary["plan"]["cases"][0]
    row = json.loads((out / "fd0.json").read_text())
    assert row[0]["wl"] == {"kv_splits": 16, "fuse_norm": True, "fuse_rope": True, "fuse_silu": True}
    assert row[0]["options"] == {"prefetch_depth": 3} and not (out / "late.json").exists()


def test_a_case_that_fails_on_the_gpu_is_recorded_and_the_others_go_on(tmp_path):
    plan = ab.load_plan(_plan(tmp_path, {"cases": [
        {"name": "hangs", "model": "llama-3.2-1b", "batch": 1},
        {"name": "runs", "model": "llama-3.2-1b", "batch": 1}]}))

    def measure(s, **kw):
        if not os.environ.get("DONE"):
            os.environ["DONE"] = "1"
            raise MksimError("the kernel stopped: a wait ran past 2 s (pipeline)\nmore")
        return _fake_row(950.0)

    try:
        rows = ab.run_plan(plan, tmp_path / "out", 400, measure=measure, say=lambda m: None)
    finally:
        os.environ.pop("DONE", None)
    assert rows[0] == {"name": "hangs", "error": "the kernel stopped: a wait ran past 2 s (pipeline)"}
    assert rows[1]["measured_us"] == 950.0


def test_the_plan_in_the_docs_is_one_the_runner_takes(tmp_path):
    """docs/validation-log.md's example plan (the ```json block after the runner's paragraph) loads."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "validation-log.md").read_text()
    block = text[text.index("python -m validation megakernel-ab PLAN.json"):]
    block = block[block.index("```json") + len("```json"):]
    plan = ab.load_plan(_plan(tmp_path, block[:block.index("```")]))
    assert [c["name"] for c in plan["cases"]] == ["b1-base", "b1-groups2"]
    assert plan["cases"][1]["defines"] == "-DMK_MM_GROUPS=2"

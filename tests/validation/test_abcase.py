"""validation.megakernel.abcase.run_case, the one case of mk_speed, moe_speed and moe_ops, with a stand-in runner."""

from __future__ import annotations

import pytest

from validation.megakernel import abcase


class FakeRunner:
    def __init__(self, local, again=None, fail_time=False):
        self.local, self.again, self.fail_time, self.closed = local, again, fail_time, False

    def check(self, watchdog_s):
        return dict(self.local), None

    def check_recycled(self, watchdog_s):
        return dict(self.again), None

    def time(self, reps, watchdog_s):
        if self.fail_time:
            raise RuntimeError("the kernel hung:\n  watchdog")
        return [float(i) for i in range(reps)]

    def close(self):
        self.closed = True


def _run(monkeypatch, fake, **kw):
    monkeypatch.setattr(abcase, "runner", lambda s, defines: fake)
    seen = {}

    def measured(r, s, times):
        seen["schedule"] = s
        return {"measured_us": times[-1], "n": len(times)}

    rec = abcase.run_case({"case": "x"}, lambda: "schedule", "-DX=1", False, predict=lambda s: 12.5, reps=4,
                          watchdog_s=1.0, measured=measured, **kw)
    return rec, seen


def test_a_case_is_predicted_checked_and_timed_in_order(monkeypatch):
    fake = FakeRunner({"a": 1e-4, "b": 3e-3})
    rec, seen = _run(monkeypatch, fake, checked=lambda local: {"n_ops": len(local)})
    assert list(rec) == ["case", "predicted_us", "ok", "max_rel_err", "worst_op", "n_ops", "measured_us", "n",
                         "wall_s"]
    assert (rec["ok"], rec["max_rel_err"], rec["worst_op"], rec["measured_us"]) == (True, 3e-3, "b", 3.0)
    assert seen["schedule"] == "schedule" and fake.closed


def test_a_sentinel_case_takes_the_worse_of_its_two_checks(monkeypatch):
    rec, _ = _run(monkeypatch, FakeRunner({"a": 1e-4, "b": 3e-3}, again={"a": 2e-2, "b": 1e-3}), recycled=True,
                  rel_err_max=1e-2)
    assert rec["recycled_max_rel_err"] == 2e-2
    assert (rec["ok"], rec["max_rel_err"], rec["worst_op"]) == (False, 2e-2, "a")


def test_a_refusal_and_a_failure_are_one_line_each(monkeypatch):
    def refuse(s):
        raise ValueError("no device function\nfor this")

    rec, _ = _run(monkeypatch, FakeRunner({"a": 0.0}), prepare=refuse)
    assert rec == {"case": "x", "predicted_us": 12.5, "refused": "no device function for this"}
    fake = FakeRunner({"a": 0.0}, fail_time=True)
    rec, _ = _run(monkeypatch, fake)
    assert rec["failed"] == "the kernel hung: watchdog" and "RuntimeError" in rec["traceback"] and fake.closed
    assert "measured_us" not in rec and rec["ok"] is True


def test_a_dry_run_counts_the_plans_tasks_and_builds_nothing(monkeypatch):
    import mksim
    from validation.megakernel import program as P

    monkeypatch.setattr(abcase, "runner", lambda s, defines: pytest.fail("built a kernel in a dry run"))
    s = mksim.build_schedule(mksim.models.workload("llama-3.2-1b", batch=1), "h200", "megakernel",
                             **P.kernel_options("llama-3.2-1b", 1))
    rec = abcase.run_case({}, lambda: s, "", True, predict=lambda s: 1.0, reps=1, watchdog_s=1.0,
                          measured=lambda r, s, t: {})
    assert rec == {"predicted_us": 1.0, "tasks": len(P.plan(s).program.tasks)}

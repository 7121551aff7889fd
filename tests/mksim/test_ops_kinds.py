"""mksim.workload.kinds: the one description of each op kind."""

from __future__ import annotations

import doctest

import pytest

from mksim import models
from mksim.errors import MksimError
from mksim.registry import Registry
from mksim.workload import KINDS, Op, OpKind, get_kind, kinds


def test_the_examples_hold():
    assert doctest.testmod(kinds).failed == 0


def test_names_and_opcodes_are_unique():
    codes = [k.opcode for k in KINDS.values() if k.opcode is not None]
    assert len(codes) == len(set(codes)) and all(c > 0 for c in codes)
    assert all(name == k.name for name, k in KINDS.items())
    assert isinstance(KINDS, Registry) and KINDS in Registry.every()


def test_the_registry_refuses_a_taken_name_or_opcode_and_takes_a_new_kind():
    with pytest.raises(ValueError, match="op kind 'matmul' is registered already"):
        KINDS.register("matmul", OpKind("matmul", "tensor", "again"))
    with pytest.raises(ValueError, match="opcode 3 is taken"):
        KINDS.register("gemm", OpKind("gemm", "tensor", "a second matmul", opcode=3))
    assert "gemm" not in KINDS
    KINDS.register("router", OpKind("router", "vector", "top-k of each token's expert scores"))
    try:  # a kind registered later (by a block's file) is one like the others
        assert get_kind("router").unit == "vector" and list(KINDS)[-1] == "router"
        assert Op(name="r", kind="router", out_size=8, elem_bytes=2.0, flops=1.0).unit == "vector"
    finally:
        KINDS.remove("router")


def test_every_kind_a_built_in_workload_emits_is_registered():
    for opts in ({}, {"fuse_norm": True, "split_qkv": True, "split_gate_up": True, "logit_softcap": 30.0}):
        wl = models.workload("llama-3.2-1b", batch=2, kv_len=64, **opts)
        assert {op.kind for op in wl.ops} <= set(KINDS)


def test_an_ops_unit_is_its_kinds():
    op = Op(name="m", kind="matmul", out_size=16, elem_bytes=2.0, flops=1.0)
    assert op.unit == "tensor"
    assert Op(name="x", kind="not_a_kind", out_size=16, elem_bytes=2.0, flops=1.0).unit == "vector"


def test_cost_fields_follow_the_fit_form():
    assert get_kind("attn_reduce").cost_fields == ("task_fixed_us",)
    assert get_kind("silu_mul").cost_fields == ("task_fixed_us", "task_row_us")


def test_bad_names_and_units_fail_in_one_line():
    with pytest.raises(MksimError, match="unknown op kind 'matvec'; known: embed, rmsnorm, matmul") as exc:
        get_kind("matvec")
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="unit must be one of tensor, vector"):
        OpKind("x", "scalar", "nothing")


# -- softcap: the kind added end to end as the example of docs/extending.md ---------------------------
def test_logit_softcap_adds_one_op_after_the_lm_head():
    import mksim

    plain = models.workload("llama-3.2-1b", batch=2, kv_len=256)
    capped = models.workload("llama-3.2-1b", batch=2, kv_len=256, logit_softcap=30.0)
    assert capped.ops[:-1] == plain.ops and capped.name == plain.name + " softcap30"
    op = capped.ops[-1]
    assert (op.kind, op.unit, op.out_size, op.attrs) == ("softcap", "vector", 128256, {"rows": 2, "cap": 30.0})
    assert op.inputs[0].op == "lm_head" and op.flops == 3.0 * 2 * 128256
    for mode in ("graph", "megakernel"):  # costs what its bytes and FLOPs do: a little, not nothing
        a = mksim.simulate(mksim.build_schedule(plain, "h200-datasheet", mode)).latency_us
        b = mksim.simulate(mksim.build_schedule(capped, "h200-datasheet", mode)).latency_us
        assert a < b < a + 20


@pytest.mark.parametrize("bad", [-1.0, "30", True, float("nan")])
def test_a_bad_softcap_is_refused_in_one_line(bad):
    with pytest.raises(MksimError, match="logit_softcap must be a number >= 0") as exc:
        models.workload("llama-3.2-1b", logit_softcap=bad)
    assert "\n" not in str(exc.value)


def test_a_workload_option_round_trips_through_a_schedule_file():
    """A builder option recorded in ``Workload.options`` is saved and rebuilt without mksim.schedule
    knowing it (what lets a new op kind's option take no schedule code)."""
    import mksim
    from mksim.schedule import Schedule

    wl = mksim.models.workload("llama-3.2-1b", logit_softcap=30.0)
    s = mksim.build_schedule(wl, "h200-datasheet", "graph")
    back = Schedule.from_json(s.to_json())
    assert back.workload == wl and back.workload.ops[-1].kind == "softcap"
    assert mksim.models.workload("llama-3.2-1b").options == ()

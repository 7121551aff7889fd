"""Instruction tables of the megakernel: round trips and invariants (no GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import mksim
from mksim.errors import ScheduleError
from validation.megakernel import OPCODES, decode, encode
from validation.megakernel.encode import DEP_OP, DEP_TILES, TASK_FIELDS, waits_on_flags

from . import nvcc_builds


@pytest.mark.parametrize("policy,sync", [("dag", "counter"), ("rr", "flag"), ("pool", "counter")])
def test_encode_decode_round_trip(policy, sync):
    s = mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel", policy=policy, sync=sync)
    prog = encode(s)
    queues, deps = decode(prog)
    assert queues == s.queues
    g = s.graph
    assert all(deps[t] == g.deps(t) for t in range(len(g)))
    assert prog.tasks.shape == (len(g), len(TASK_FIELDS)) and prog.tasks.dtype == np.int32
    assert prog.queue_start[-1] == len(g) and len(prog.queue_start) == len(s.queues) + 1
    assert waits_on_flags(prog) == (sync == "flag" or bool((prog.deps[:, 0] == DEP_TILES).any()))


def test_rows_carry_the_tile_and_what_it_streams():
    s = mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel")
    prog = encode(s)
    g = s.graph
    for row, t in zip(prog.tasks[:500].tolist(), prog.task_id[:500].tolist(), strict=True):
        op = g.ops[g.op_of[t]]
        assert row[0] == OPCODES[op.kind] and row[1] == g.op_of[t] and row[2] == g.tile_of[t]
        b = g.bounds[g.op_of[t]]
        assert (row[3], row[4]) == (b[g.tile_of[t]], b[g.tile_of[t] + 1])
        assert row[7] * 256 >= g.weight_bytes[t] + g.kv_read_bytes[t] > (row[7] - 1) * 256 - 1
    # whole-op dependencies (a matvec needs its whole input) use the op's counter
    qkv = g.task_id("L0.qkv_proj", 0)
    row = prog.tasks[list(prog.task_id).index(qkv)]
    assert [tuple(d) for d in prog.deps[row[5]:row[5] + row[6]].tolist()][0][0] == DEP_OP


def test_chain_modes_have_no_queues_to_encode():
    s = mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "graph")
    with pytest.raises(ScheduleError, match="no per-SM queues"):
        encode(s)


def test_chain_tables_list_every_task_in_id_order():
    from validation.megakernel.encode import encode_queues

    s = mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "graph")
    prog = encode_queues(s.graph, [list(range(len(s.graph)))])
    assert prog.task_id.tolist() == list(range(len(s.graph)))
    assert list(prog.op_tiles) == [int(n) for n in s.graph.n_tiles]


@pytest.mark.skipif(nvcc_builds.NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ["mk", "mk-consumers16", "mk-l2pf1", "mk-l2pf2", "calibrate-kernels", "launch-bench"])
@pytest.mark.slow
@pytest.mark.nvcc
def test_cuda_sources_compile_for_sm90(name):
    r = nvcc_builds.build(name)  # compiled once per run (two at a time) and kept between runs
    assert r.returncode == 0, r.stderr

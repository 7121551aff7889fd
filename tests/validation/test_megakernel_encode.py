"""Instruction tables of the megakernel: round trips and invariants (no GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import mksim
from mksim.errors import ScheduleError
from validation.megakernel import OPCODES, decode, encode
from validation.megakernel.encode import DEP_OP, DEP_TILES, TASK_FIELDS, waits_on_flags


@pytest.mark.parametrize("policy,sync", [("dag", "counter"), ("rr", "flag"), ("pool", "counter")])
def test_encode_decode_round_trip(policy, sync):
    s = mksim.build_schedule("llama-3.2-1b", "h200", "megakernel", policy=policy, sync=sync)
    prog = encode(s)
    queues, deps = decode(prog)
    assert queues == s.queues
    g = s.graph
    assert all(deps[t] == g.deps(t) for t in range(len(g)))
    assert prog.tasks.shape == (len(g), len(TASK_FIELDS)) and prog.tasks.dtype == np.int32
    assert prog.queue_start[-1] == len(g) and len(prog.queue_start) == len(s.queues) + 1
    assert waits_on_flags(prog) == (sync == "flag" or bool((prog.deps[:, 0] == DEP_TILES).any()))


def test_rows_carry_the_tile_and_what_it_streams():
    s = mksim.build_schedule("llama-3.2-1b", "h200", "megakernel")
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
    s = mksim.build_schedule("llama-3.2-1b", "h200", "graph")
    with pytest.raises(ScheduleError, match="no per-SM queues"):
        encode(s)


def test_chain_tables_list_every_task_in_id_order():
    from validation.megakernel.encode import encode_queues

    s = mksim.build_schedule("llama-3.2-1b", "h200", "graph")
    prog = encode_queues(s.graph, [list(range(len(s.graph)))])
    assert prog.task_id.tolist() == list(range(len(s.graph)))
    assert list(prog.op_tiles) == [int(n) for n in s.graph.n_tiles]


NVCC = __import__("shutil").which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed (CI has none; the device machine compiles)")
@pytest.mark.parametrize("source,extra", [("validation/megakernel/mk_kernel.cu", []),
                                          ("validation/megakernel/mk_kernel.cu", ["-DMK_CONSUMERS=16"]),
                                          ("validation/megakernel/mk_kernel.cu", ["-DMK_L2PF_KIND=1"]),
                                          ("validation/megakernel/mk_kernel.cu", ["-DMK_L2PF_KIND=2"]),
                                          ("validation/calibrate/kernels.cu", []),
                                          ("validation/calibrate/launch_bench.cu", [])])
@pytest.mark.slow
def test_cuda_sources_compile_for_sm90(source, extra, tmp_path):
    import subprocess
    from pathlib import Path

    from validation.megakernel.gpu import compile_options

    root = Path(__file__).resolve().parents[2]
    flags = [f for f in compile_options() if not f.startswith("-DMK_CONSUMERS")]  # as the runner passes them
    r = subprocess.run([NVCC, "-arch=sm_90", *flags, "-c", str(root / source), "-o", str(tmp_path / "out.o"),
                        *extra], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr

"""Instruction tables for the megakernel interpreter (pure numpy; no GPU).

The generated kernel runs one block per SM. Block ``s`` reads its queue, ``queue_start[s]`` to
``queue_start[s + 1]`` in ``tasks``; each task is one row of ``TASK_FIELDS`` int32 words:

- ``opcode``: what device function runs (:data:`OPCODES`, the ``opcode`` of each kind of
  ``mksim.workload.KINDS`` that has one), ``op``: the op index (its buffers and
  sizes live in the op table the code generator writes), ``tile``: the tile of that op;
- ``lo``, ``hi``: the output elements the tile writes (the op's tile bounds); for a matmul, the
  weight rows it streams, which are the same but with a fused SiLU·mul epilogue: two rows (gate,
  up) per output element (:func:`weight_rows_per_output`);
- ``dep_start``, ``dep_count``: the task's rows in ``deps``;
- ``weight_bytes``: what the task streams from DRAM (weights and KV cache), in 256-byte units,
  so the loader can size its shared-memory pages without the op table.

A dependency row is ``(kind, op, t0, t1)``: ``DEP_OP`` waits until the op's completion counter
reaches its tile count (every tile done); ``DEP_TILES`` waits for the flags of tiles
``[t0, t1)`` of that op. Whole-op dependencies use the counter with ``sync = "counter"``; with
``sync = "flag"`` every dependency is a range of flags, and partial ranges always are (a counter
cannot say which tiles are done). With ``sync = "sentinel"`` every dependency is a tile range too,
and the kernel polls the bytes those tiles write instead of any flag (``program.py`` turns each
range into the byte segments to poll). :func:`decode` inverts :func:`encode`, and tests hold the
two together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mksim.errors import ScheduleError
from mksim.workload import KINDS

OPCODES: dict[str, int] = {k.name: k.opcode for k in KINDS.values() if k.opcode is not None}
TASK_FIELDS = ("opcode", "op", "tile", "lo", "hi", "dep_start", "dep_count", "weight_units")
DEP_OP, DEP_TILES = 0, 1
WEIGHT_UNIT_B = 256


@dataclass(frozen=True)
class Program:
    """The tables one schedule becomes: int32 arrays, ready to copy to the GPU."""
    tasks: np.ndarray        # (n_tasks, len(TASK_FIELDS)), in queue order, SM after SM
    queue_start: np.ndarray  # (n_sms + 1,): SM s runs tasks[queue_start[s]:queue_start[s + 1]]
    deps: np.ndarray         # (n_deps, 4): kind, op, t0, t1
    op_tiles: np.ndarray     # (n_ops,): tiles per op, the completion counters' targets
    task_id: np.ndarray      # (n_tasks,): the schedule's task id of each row (for checks and traces)
    sync: str

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.tasks, self.queue_start, self.deps, self.op_tiles))


def opcode_defines() -> tuple[str, ...]:
    """The compiler flags that give the CUDA sources their opcodes (``-DMK_OP_MATMUL=3``): the
    kernels name opcodes only, their numbers come from the op kinds' descriptions.

    >>> opcode_defines()[:2]
    ('-DMK_OP_EMBED=1', '-DMK_OP_RMSNORM=2')
    """
    return tuple(f"-D{KINDS[name].define}={code}" for name, code in OPCODES.items())


def weight_rows_per_output(op) -> int:
    """Weight rows a task of ``op`` streams per output element it writes: 2 for a matmul whose
    epilogue pairs its rows (``attrs["weight_rows"]``, a fused SiLU·mul), else 1.

    >>> import mksim
    >>> ops = {op.name: op for op in mksim.models.workload("llama-3.2-1b", fuse_silu=True).ops}
    >>> weight_rows_per_output(ops["L0.gate_up_proj"]), weight_rows_per_output(ops["L0.qkv_proj"])
    (2, 1)
    """
    return int(op.attrs.get("weight_rows", op.out_size)) // op.out_size if op.kind == "matmul" else 1


def encode(schedule) -> Program:
    """The instruction tables of a megakernel (or persistent_barrier) schedule."""
    if schedule.queues is None:
        raise ScheduleError(f"mode {schedule.mode} has no per-SM queues to encode; use a persistent mode")
    return encode_queues(schedule.graph, schedule.queues, schedule.options.sync)


def encode_queues(g, queues: list[list[int]], sync: str = "counter") -> Program:
    """The instruction tables of per-SM ``queues`` of task ids of task graph ``g``."""
    unknown = sorted({op.kind for op in g.ops} - set(OPCODES))
    if unknown:
        raise ScheduleError(f"no device function for op kind {unknown[0]!r}; the megakernel runs "
                            f"{', '.join(OPCODES)}")
    n_tiles = g.n_tiles.tolist()
    op_of, tile_of = g.op_of.tolist(), g.tile_of.tolist()
    bounds = [b.tolist() for b in g.bounds]
    stream_B = (g.weight_bytes + g.kv_read_bytes).tolist()
    per_out = [weight_rows_per_output(op) for op in g.ops]
    rows, ids, starts = [], [], [0]
    deps: list[tuple[int, int, int, int]] = []
    for q in queues:
        for t in q:
            op = op_of[t]
            tile = tile_of[t]
            d0 = len(deps)
            for p, t0, t1 in g.deps(t):
                whole = sync == "counter" and t1 - t0 == n_tiles[p]
                deps.append((DEP_OP if whole else DEP_TILES, p, t0, t1))
            f = per_out[op]
            rows.append((OPCODES[g.ops[op].kind], op, tile, f * bounds[op][tile], f * bounds[op][tile + 1], d0,
                         len(deps) - d0, -(-int(stream_B[t]) // WEIGHT_UNIT_B)))
            ids.append(t)
        starts.append(len(rows))
    return Program(tasks=np.array(rows, dtype=np.int32).reshape(-1, len(TASK_FIELDS)),
                   queue_start=np.array(starts, dtype=np.int32),
                   deps=np.array(deps, dtype=np.int32).reshape(-1, 4),
                   op_tiles=np.array(n_tiles, dtype=np.int32), task_id=np.array(ids, dtype=np.int32), sync=sync)


def decode(program: Program) -> tuple[list[list[int]], dict[int, tuple[tuple[int, int, int], ...]]]:
    """The per-SM queues (task ids) and each task's dependency ranges, read back from the tables."""
    queues = []
    deps: dict[int, tuple[tuple[int, int, int], ...]] = {}
    qs = program.queue_start.tolist()
    for s in range(len(qs) - 1):
        queues.append(program.task_id[qs[s]:qs[s + 1]].tolist())
    for row, t in zip(program.tasks.tolist(), program.task_id.tolist(), strict=True):
        d0, n = row[5], row[6]
        deps[t] = tuple((p, t0, t1) for _kind, p, t0, t1 in program.deps[d0:d0 + n].tolist())
    return queues, deps


def waits_on_flags(program: Program) -> bool:
    """Whether the kernel waits on per-tile flags (partial-range deps, or ``sync = "flag"``; with
    ``sync = "sentinel"`` it polls the data instead)."""
    if program.sync == "sentinel":
        return False
    return program.sync == "flag" or bool((program.deps[:, 0] == DEP_TILES).any())

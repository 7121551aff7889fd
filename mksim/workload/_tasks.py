"""Tiling: cut each op's output into tasks and derive tile-level dependencies.

A task is one contiguous range of its op's output. A dependency is a range of a
producer's tiles, ``(producer_op, first_tile, last_tile + 1)``: a matvec tile needs
every tile of its input vector, an elementwise tile only the matching tiles, an
attention partial its head's q/k/v tiles, a reduction its head's partials.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mksim.errors import WorkloadError

from ._ops import Input, Op, Workload, unresolved

Dep = tuple[int, int, int]  # (producer op index, first tile, end tile)


@dataclass(frozen=True)
class Tiling:
    """How many tasks each op becomes.

    ``default`` applies to every op, capped by what its alignment allows; ``per_kind``
    (``{"matmul": 264}``) and ``per_op`` (``{"lm_head": 528}``) override it. A value of
    0 means "as many as the op allows" (one task per aligned step). A grouped op (the experts of a
    mixture of experts, ``op.attrs["groups"]`` equal groups) gets a multiple of its groups, so that
    no task spans two.
    """
    default: int = 132
    per_kind: Mapping[str, int] = field(default_factory=dict)
    per_op: Mapping[str, int] = field(default_factory=dict)

    def tiles_for(self, op: Op) -> int:
        want = self.per_op.get(op.name, self.per_kind.get(op.kind, self.default))
        if isinstance(want, bool) or not isinstance(want, int) or want < 0:
            raise WorkloadError(f"tile count for op {op.name!r} must be an integer >= 0, got {want!r}")
        steps = -(-op.out_size // op.align)
        n = steps if want == 0 else max(1, min(want, steps))
        groups = op.attrs.get("groups", 1)
        return min(steps, groups * max(1, round(n / groups))) if groups > 1 else n

    @classmethod
    def for_sms(cls, n_sms: int, tasks_per_sm: float = 1.0) -> Tiling:
        """About ``tasks_per_sm`` tasks per SM for every op (attention split as flash-decoding)."""
        if not 0 < tasks_per_sm < float("inf"):  # also nan
            raise WorkloadError(f"tasks per SM must be a positive finite number, got {tasks_per_sm}")
        return cls(default=max(1, round(n_sms * tasks_per_sm)), per_kind={"attn_partial": 0,
                                                                            "attn_reduce": 0})


def tile_bounds(op: Op, n: int) -> np.ndarray:
    """``n + 1`` element boundaries of ``n`` tiles on multiples of ``op.align``."""
    steps = -(-op.out_size // op.align)
    b = (np.arange(n + 1, dtype=np.int64) * steps // n) * op.align
    b[-1] = op.out_size
    return b


class TaskGraph:
    """The tasks of a tiled workload, with their costs and dependencies.

    Tasks are numbered op by op, tiles in order; ``op_first[i]`` is the first task of op
    ``i``. Cost arrays are per task: ``flops``, ``weight_bytes``, ``kv_read_bytes`` and
    ``kv_write_bytes`` (KV cache), ``in_bytes`` (activations read, each task reading what it needs,
    so a matvec input is read once per tile), ``out_bytes``. In a grouped op whose groups have their own
    rows (an expert's tokens: ``op.attrs["group_rows"]``), a task's FLOPs, output bytes and inputs read go
    with its group's rows (:meth:`task_rows`); its weights with its width.

    Example::

        >>> from mksim import models
        >>> from mksim.workload import TaskGraph, Tiling
        >>> g = TaskGraph(models.workload("llama-3.2-1b"), Tiling(default=4))
        >>> g.deps(g.task_id("L0.qkv_proj", 0))   # a matvec tile needs all of its input
        ((1, 0, 4),)
    """

    def __init__(self, workload: Workload, tiling: Tiling | None = None):
        self.workload = workload
        self.tiling = tiling or Tiling()
        ops = workload.ops
        index = workload.index
        self.ops = ops
        self.n_tiles = np.array([self.tiling.tiles_for(op) for op in ops], dtype=np.int64)
        self.op_first = np.concatenate([[0], np.cumsum(self.n_tiles)]).astype(np.int64)
        n = int(self.op_first[-1])
        self.bounds = [tile_bounds(op, int(k)) for op, k in zip(ops, self.n_tiles, strict=True)]
        self.op_of = np.repeat(np.arange(len(ops)), self.n_tiles)
        self.tile_of = np.arange(n) - self.op_first[self.op_of]
        frac = np.empty(n)
        self.flops = np.empty(n)
        self.weight_bytes = np.empty(n)
        self.kv_read_bytes = np.empty(n)
        self.kv_write_bytes = np.empty(n)
        self.out_bytes = np.empty(n)
        in_bytes: list[float] = []
        self._deps: list[tuple[Dep, ...]] = []
        bounds_list = [b.tolist() for b in self.bounds]
        n_tiles = self.n_tiles.tolist()
        weigh = [_RowWeights.of(op) for op in ops]  # None but for grouped ops
        self._task_rows: dict[int, np.ndarray] = {}
        for i, op in enumerate(ops):
            s, e = int(self.op_first[i]), int(self.op_first[i + 1])
            b = self.bounds[i]
            f = np.diff(b) / op.out_size
            frac[s:e] = f
            w = weigh[i]
            fr = f if w is None else np.diff(w.at(b)) / op.out_size  # by rows x width in a grouped op
            self.flops[s:e] = op.flops * fr
            self.weight_bytes[s:e] = op.weight_bytes * f
            self.kv_read_bytes[s:e] = op.kv_read_bytes * f
            self.kv_write_bytes[s:e] = op.kv_write_bytes * f
            self.out_bytes[s:e] = op.out_bytes * fr
            if w is not None:
                self._task_rows[i] = w.rows_of(b[:-1])
            # inputs every tile needs whole (a matvec's vector): the same bytes and deps for each tile
            full = [(index[inp.op], ops[index[inp.op]]) for inp in op.inputs if inp.full]
            full_bytes = float(sum(prod.out_size * prod.elem_bytes for _, prod in full))
            full_deps = [(p, 0, n_tiles[p]) for p, _ in full]
            # a grouped op's task reads the rows of its group's tokens only
            nbytes = np.full(e - s, full_bytes) if w is None else full_bytes * (self._task_rows[i] / op.attrs["tokens"])
            # each other input's producer ranges, tiles and bytes, all of the op's tiles at once where the input
            # is one contiguous range a tile; the bytes added input by input, as one tile's sum would be
            columns = [_input_deps(inp, index[inp.op], ops, bounds_list, weigh, b, nbytes)
                       for inp in op.inputs if not inp.full]
            if not columns:  # every tile needs the same: one tuple for all
                same = _merge_deps(list(full_deps)) if len(full_deps) > 1 else tuple(full_deps)
                self._deps.extend([same] * (e - s))
            else:
                for t in range(e - s):
                    deps: list[Dep] = list(full_deps)
                    for col in columns:
                        d = col[t]
                        if d is None:
                            continue
                        if isinstance(d, list):
                            deps.extend(d)
                        else:
                            deps.append(d)
                    self._deps.append(_merge_deps(deps) if len(deps) > 1 else tuple(deps))
            in_bytes.extend(nbytes.tolist())
        self.in_bytes = np.array(in_bytes, dtype=float) if in_bytes else np.zeros(n)
        self.frac = frac

    @property
    def kv_bytes(self) -> np.ndarray:
        """KV cache bytes read and written, per task."""
        return self.kv_read_bytes + self.kv_write_bytes

    # -- queries --------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.op_first[-1])

    def task_id(self, op: str | int, tile: int) -> int:
        i = op if isinstance(op, int) else self.workload.index[op]
        if not 0 <= tile < self.n_tiles[i]:
            raise IndexError(f"op {self.ops[i].name} has {self.n_tiles[i]} tiles, not {tile + 1}")
        return int(self.op_first[i] + tile)

    def task_rows(self, op: int) -> np.ndarray | None:
        """The rows (tokens) of each task of op ``op`` where they differ by task (a grouped op: its
        group's ``group_rows``), else None (the op's ``attrs["rows"]`` hold for every task)."""
        return self._task_rows.get(op)

    def name(self, task: int) -> str:
        return f"{self.ops[self.op_of[task]].name}[{self.tile_of[task]}]"

    def deps(self, task: int) -> tuple[Dep, ...]:
        """Producer tile ranges task ``task`` waits for."""
        return self._deps[task]

    @property
    def all_deps(self) -> Sequence[tuple[Dep, ...]]:
        """Every task's :meth:`deps`, by task id (read-only): for a loop over many tasks."""
        return self._deps

    def dep_tasks(self, task: int) -> Iterator[int]:
        """Every producer task of ``task`` (expanded ranges)."""
        for p, t0, t1 in self._deps[task]:
            base = int(self.op_first[p])
            yield from range(base + t0, base + t1)

    def n_edges(self) -> int:
        return sum(t1 - t0 for d in self._deps for _, t0, t1 in d)

    def totals(self) -> dict[str, float]:
        return {"tasks": len(self), "edges": self.n_edges(), "flops": float(self.flops.sum()),
                "weight_bytes": float(self.weight_bytes.sum()), "kv_bytes": float(self.kv_bytes.sum()),
                "in_bytes": float(self.in_bytes.sum()), "out_bytes": float(self.out_bytes.sum())}

    def check_acyclic(self) -> None:
        """Raise :class:`WorkloadError` if some task (transitively) depends on itself."""
        n = len(self)
        indeg = {t: 0 for t in range(n)}
        users: dict[int, list[int]] = {t: [] for t in range(n)}
        for t in range(n):
            for d in self.dep_tasks(t):
                indeg[t] += 1
                users[d].append(t)
        stuck = unresolved(indeg, users)
        if stuck:
            names = [self.name(t) for t in sorted(stuck)[:4]]
            raise WorkloadError(f"the task graph has a cycle through {', '.join(names)}")


class _RowWeights:
    """The rows of a grouped op's elements, relative to its mean: ``at(x)`` is the row-weighted length
    of elements ``[0, x)`` (``out_size`` at the end), so a span's bytes and FLOPs go with its group's rows."""

    def __init__(self, rows: np.ndarray, width: int):
        self.rows, self.width = rows, width
        self.rel = rows / rows.mean()
        self.cum = np.concatenate([[0.0], np.cumsum(self.rel)])
        self._rel, self._cum, self._last = self.rel.tolist(), self.cum.tolist(), len(rows) - 1  # for span()

    @classmethod
    def of(cls, op: Op) -> _RowWeights | None:
        rows = op.attrs.get("group_rows")
        if rows is None:
            return None
        g = len(rows)
        if g < 1 or op.out_size % g:
            raise WorkloadError(f"op {op.name!r}: {g} groups do not divide its {op.out_size} outputs")
        return cls(np.asarray(rows, dtype=float), op.out_size // g)

    def group(self, x: np.ndarray) -> np.ndarray:
        return np.minimum(np.asarray(x) // self.width, len(self.rows) - 1)

    def at(self, x: np.ndarray) -> np.ndarray:
        g = self.group(x)
        return self.cum[g] * self.width + (np.asarray(x) - g * self.width) * self.rel[g]

    def span(self, a: int, z: int) -> float:
        """``at(z) - at(a)``, for one span (plain floats: called per task and input)."""
        w, last, rel, cum = self.width, self._last, self._rel, self._cum
        ga, gz = min(a // w, last), min(z // w, last)
        return (cum[gz] * w + (z - gz * w) * rel[gz]) - (cum[ga] * w + (a - ga * w) * rel[ga])

    def spans(self, a: np.ndarray, z: np.ndarray) -> np.ndarray:
        """:meth:`span` of each ``(a, z)``, the same arithmetic elementwise."""
        w, last = self.width, self._last
        ga, gz = np.minimum(a // w, last), np.minimum(z // w, last)
        return (self.cum[gz] * w + (z - gz * w) * self.rel[gz]) - (self.cum[ga] * w + (a - ga * w) * self.rel[ga])

    def rows_of(self, starts: np.ndarray) -> np.ndarray:
        return self.rows[self.group(starts)]


def _input_deps(inp: Input, p: int, ops: Sequence[Op], bounds_list: list[list[int]],
                weigh: list[_RowWeights | None], bounds: np.ndarray, nbytes: np.ndarray) -> list[Any]:
    """Each tile's dependencies on input ``inp`` (producer op ``p``) of an op tiled at ``bounds``, a list
    a tile (None where there is none), adding each tile's bytes read from it to ``nbytes``, range by range in
    the order of :meth:`Input.ranges`. All tiles at once where every tile's ranges, one a segment, are
    non-empty and apart (what ``ranges`` would neither drop nor merge); tile by tile otherwise."""
    prod, pb, pw = ops[p], bounds_list[p], weigh[p]
    segs = inp.gapless()
    if segs is not None:
        lo, hi = bounds[:-1], bounds[1:]
        k0, k1 = lo // inp.group, (hi - 1) // inp.group
        starts = [np.maximum(0, off + k0 * stride) for off, stride, _ in segs]
        ends = [np.minimum(prod.out_size, off + k1 * stride + width) for off, stride, width in segs]
        if len(segs) == 1 or (all(bool((a < z).all()) for a, z in zip(starts, ends, strict=True))
                              and all(bool((z < a).all()) for z, a in zip(ends, starts[1:], strict=False))):
            pb_arr = np.asarray(pb)
            cols = []
            for a, z in zip(starts, ends, strict=True):
                some = a < z  # only a lone segment's range can be empty here
                read = (z - a) if pw is None else pw.spans(a, z)
                nbytes += np.where(some, read * prod.elem_bytes, 0.0)
                t0 = (np.searchsorted(pb_arr, a, side="right") - 1).tolist()
                t1 = np.searchsorted(pb_arr, z, side="left").tolist()
                cols.append([(p, x, y) if ok else None for x, y, ok in zip(t0, t1, some.tolist(), strict=True)])
            if len(cols) == 1:
                return cols[0]
            return [list(ds) for ds in zip(*cols, strict=True)]
    col: list[Any] = []
    for t, (lo_t, hi_t) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
        deps = []
        for a_t, z_t in inp.ranges(lo_t, hi_t, prod.out_size):
            nbytes[t] += ((z_t - a_t) if pw is None else pw.span(a_t, z_t)) * prod.elem_bytes
            deps.append((p, bisect_right(pb, a_t) - 1, bisect_left(pb, z_t)))
        col.append(deps)
    return col


def _merge_deps(deps: list[Dep]) -> tuple[Dep, ...]:
    if len(deps) == 2:  # the most common: two producers, nothing to merge
        x, y = deps
        if x[0] != y[0]:
            return (x, y) if x < y else (y, x)
    deps.sort()
    out: list[Dep] = []
    for p, a, b in deps:
        if out and out[-1][0] == p and a <= out[-1][2]:
            out[-1] = (p, out[-1][1], max(out[-1][2], b))
        else:
            out.append((p, a, b))
    return tuple(out)

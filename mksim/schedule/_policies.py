"""Megakernel placement policies: which SM runs which task, in which order.

A policy is a small plug-in: subclass :class:`BasePolicy`, implement :meth:`place`, and
register it with :func:`register_policy` (in :data:`POLICIES`, a :class:`~mksim.registry.Registry`
of the classes). ``place`` is called once per schedule build, with the
task graph (tasks numbered in a topological order, op by op) and the GPU's rates; it
returns one queue of task ids per SM. Every task must appear exactly once; the order of a
queue is the order the SM executes it, so a policy must not put a task before one of its
(transitive) producers on the same SM — :meth:`Schedule.validate` rejects that as a
deadlock. Policies estimate task times with :func:`mksim.costs.task_costs`.

A search (:mod:`mksim.search`) asks a policy's class for its options (:meth:`BasePolicy.suggest`,
once per trial that picked it) and for the parameters of its baseline trial (``baseline``). A
policy a design brings (``BaseDesign.policies``) is searched only in a study with the design.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from typing import Any, ClassVar, TypeVar

import numpy as np

from hwmodels import GPUSpec
from mksim.costs import Rates, task_costs
from mksim.errors import ScheduleError, UnknownNameError
from mksim.registry import Registry
from mksim.workload import TaskGraph

ORDERS = ("op", "level")


def task_order(graph: TaskGraph, order: str = "op") -> list[int]:
    """The order tasks are placed in: ``op`` is op by op (task ids); ``level`` groups ops by
    their depth in the op graph and interleaves the tiles of ops at one depth (separate q, k and
    v projections, say) by their position in the op, so independent ops progress together.
    Both are topological: a task comes after every task it depends on."""
    if order not in ORDERS:
        raise ScheduleError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if order == "op":
        return list(range(len(graph)))
    level = [0] * len(graph.ops)
    index = graph.workload.index
    for i, op in enumerate(graph.ops):
        level[i] = 1 + max((level[index[inp.op]] for inp in op.inputs), default=-1)
    n_tiles = graph.n_tiles.tolist()
    op_of, tile_of = graph.op_of.tolist(), graph.tile_of.tolist()
    return sorted(range(len(graph)), key=lambda t: (level[op_of[t]], tile_of[t] / n_tiles[op_of[t]], op_of[t]))


class BasePolicy(ABC):
    """Places tasks on SMs. Subclasses set ``name`` and implement :meth:`place`."""

    name: str = ""
    baseline: ClassVar[dict[str, Any]] = {}  # a search's baseline trial of the policy: its parameters

    def __init__(self, **params: Any):
        unknown = set(params) - set(self.params())
        if unknown:
            raise ScheduleError(f"policy {self.name!r} has no option {sorted(unknown)[0]!r}; options: "
                                f"{', '.join(self.params()) or 'none'}")
        self.options = {**self.params(), **params}

    @classmethod
    def params(cls) -> dict[str, Any]:
        """Options and their defaults."""
        return {}

    @classmethod
    def suggest(cls, trial: Any, gpu: GPUSpec) -> dict[str, Any]:
        """The policy's options a search trial (an Optuna trial) samples (its parameter names and
        order are the study's: keep them). None by default."""
        return {}

    @abstractmethod
    def place(self, graph: TaskGraph, r: Rates, n_sms: int) -> list[list[int]]:
        """One queue of task ids per SM (``n_sms`` queues)."""


def suggest_order(trial: Any) -> dict[str, Any]:
    """``order`` (:data:`ORDERS`) as a search samples it; ``op``, the default, is left out."""
    order = trial.suggest_categorical("order", ORDERS)
    return {"order": order} if order != "op" else {}


class RoundRobin(BasePolicy):
    """Task ``i`` of the topological order (``order``: see :func:`task_order`) goes to SM ``i mod n``."""

    name = "rr"
    baseline = {"order": "op"}

    @classmethod
    def params(cls) -> dict[str, Any]:
        return {"order": "op"}

    @classmethod
    def suggest(cls, trial: Any, gpu: GPUSpec) -> dict[str, Any]:
        return suggest_order(trial)

    def place(self, graph: TaskGraph, r: Rates, n_sms: int) -> list[list[int]]:
        q: list[list[int]] = [[] for _ in range(n_sms)]
        for i, t in enumerate(task_order(graph, self.options["order"])):
            q[i % n_sms].append(t)
        return q


class ZigZag(BasePolicy):
    """Round-robin that reverses direction at every op, so the SMs that took an op's last
    tiles take the next op's first ones (they are free first)."""

    name = "zigzag"

    def place(self, graph: TaskGraph, r: Rates, n_sms: int) -> list[list[int]]:
        q: list[list[int]] = [[] for _ in range(n_sms)]
        pos, step = 0, 1
        for i in range(len(graph.ops)):
            for t in range(int(graph.op_first[i]), int(graph.op_first[i + 1])):
                q[pos].append(t)
                nxt = pos + step
                if not 0 <= nxt < n_sms:
                    step = -step
                    nxt = pos  # bounce: the edge SM takes two in a row
                pos = nxt
        return q


class Wave(BasePolicy):
    """Per op, longest-processing-time packing onto the least-loaded SMs."""

    name = "wave"

    def place(self, graph: TaskGraph, r: Rates, n_sms: int) -> list[list[int]]:
        cost = task_costs(graph, r)
        load = [(0.0, s) for s in range(n_sms)]
        q: list[list[int]] = [[] for _ in range(n_sms)]
        for i in range(len(graph.ops)):
            s, e = int(graph.op_first[i]), int(graph.op_first[i + 1])
            order = sorted(range(s, e), key=lambda t: -cost[t])
            heap = list(load)
            heapq.heapify(heap)
            placed = []
            for t in order:
                ld, sm = heapq.heappop(heap)
                placed.append((sm, t))
                heapq.heappush(heap, (ld + cost[t], sm))
            for sm, t in sorted(placed, key=lambda p: p[1]):  # keep tile order within an SM
                q[sm].append(t)
            load = heap
        return q


class DagList(BasePolicy):
    """Greedy list scheduling: tasks in topological order, each on the SM where it can
    start earliest given when its producers are estimated to finish."""

    name = "dag"
    baseline = {"order": "op", "dag_sync_scale": 1.0}

    @classmethod
    def params(cls) -> dict[str, Any]:
        # sync_us: dependency latency assumed (default: the GPU's flag latency); order: task_order
        return {"sync_us": None, "order": "op"}

    @classmethod
    def suggest(cls, trial: Any, gpu: GPUSpec) -> dict[str, Any]:
        """``order``, and ``dag_sync_scale``: the latency planned with, in units of the GPU's flag latency."""
        popts = suggest_order(trial)
        scale = trial.suggest_float("dag_sync_scale", 0.0, 3.0)
        if scale != 1.0:
            popts["sync_us"] = round(scale * gpu.sync.flag_latency_ns / 1e3, 6)
        return popts

    def place(self, graph: TaskGraph, r: Rates, n_sms: int) -> list[list[int]]:
        cost = task_costs(graph, r)
        sync = self.options["sync_us"] if self.options["sync_us"] is not None else r.flag_latency_us
        return _list_schedule(graph, cost, list(range(n_sms)), task_order(graph, self.options["order"]), sync,
                              n_sms)


class Pools(BasePolicy):
    """Separate SM pools for memory-bound and compute-bound tasks (by arithmetic intensity
    against the GPU's ridge point); each pool list-schedules its own tasks."""

    name = "pool"
    baseline = {"pool_compute_fraction": 0.25}

    @classmethod
    def params(cls) -> dict[str, Any]:
        return {"compute_fraction": 0.25}

    @classmethod
    def suggest(cls, trial: Any, gpu: GPUSpec) -> dict[str, Any]:
        return {"compute_fraction": trial.suggest_float("pool_compute_fraction", 0.05, 0.5)}

    def place(self, graph: TaskGraph, r: Rates, n_sms: int) -> list[list[int]]:
        frac = self.options["compute_fraction"]
        if not 0 < frac < 1:
            raise ScheduleError(f"pool: compute_fraction must be between 0 and 1, got {frac}")
        cost = task_costs(graph, r)
        ridge = r.tensor_per_sm["bf16"] / (r.hbm_Bpus / r.n_sms)
        bytes_ = graph.weight_bytes + graph.kv_read_bytes + graph.in_bytes + graph.out_bytes
        intensity = graph.flops / np.maximum(bytes_, 1.0)
        compute = intensity >= ridge / 2
        if compute.all() or not compute.any():
            return _list_schedule(graph, cost, list(range(n_sms)), range(len(graph)), r.flag_latency_us,
                                  n_sms)
        n_c = max(1, min(n_sms - 1, round(n_sms * frac)))
        pools = {True: list(range(n_sms - n_c, n_sms)), False: list(range(n_sms - n_c))}
        # one list schedule over both pools so estimated ready times cross between them
        return _list_schedule(graph, cost, None, range(len(graph)), r.flag_latency_us, n_sms,
                              pool_of=lambda t: pools[bool(compute[t])])


def _list_schedule(graph: TaskGraph, cost: np.ndarray, sms: list[int] | None, order, sync_us: float,
                   n_sms: int, pool_of=None) -> list[list[int]]:
    """Each task on the SM of its pool that frees first (ties: lowest SM id)."""
    # plain lists: this loop runs once per task, and numpy scalars cost more than floats
    cost_l: list[float] = cost.tolist()
    op_of: list[int] = graph.op_of.tolist()
    n_tiles: list[int] = graph.n_tiles.tolist()
    op_first: list[int] = graph.op_first.tolist()
    deps_of, heappop, heappush = graph.all_deps, heapq.heappop, heapq.heappush
    finish = [0.0] * len(graph)
    op_max = [0.0] * len(graph.ops)  # running max of finish per op, for whole-op deps
    q: list[list[int]] = [[] for _ in range(n_sms)]
    # The SMs by when they free up: a heap of the distinct times, each with a heap of its SMs (the
    # order of one heap of (time, sm) pairs, whose ties on time, the rule here, cost a tuple
    # comparison each), per pool.
    free_at: dict[int, tuple[list[float], dict[float, list[int]]]] = {}
    times: list[float] = [0.0]
    at: dict[float, list[int]] = {0.0: sorted(sms or ())}
    last_deps: Any = None
    ready = 0.0
    for t in order:
        deps = deps_of[t]
        # the same dependencies (one tuple) as the task placed last: the same ready time, as that task
        # cannot be one of them (it would depend on itself)
        if deps is not last_deps:
            last_deps = deps
            ready = 0.0
            for p, t0, t1 in deps:
                n = t1 - t0
                if n == n_tiles[p]:
                    e = op_max[p]
                elif n == 1:
                    e = finish[op_first[p] + t0]
                else:
                    e = max(finish[op_first[p] + t0:op_first[p] + t1])
                if e > ready:
                    ready = e
            ready += sync_us
        if pool_of:
            pool = pool_of(t)
            got = free_at.get(id(pool))
            if got is None:
                got = free_at[id(pool)] = ([0.0], {0.0: sorted(pool)})
            times, at = got
        free = times[0]
        sm_heap = at[free]
        best = heappop(sm_heap)
        if not sm_heap:
            heappop(times)
            del at[free]
        f = (free if free >= ready else ready) + cost_l[t]
        later = at.get(f)
        if later is None:
            at[f] = [best]
            heappush(times, f)
        else:
            heappush(later, best)
        finish[t] = f
        p = op_of[t]
        if f > op_max[p]:
            op_max[p] = f
        q[best].append(t)
    return q


POLICIES: Registry[type[BasePolicy]] = Registry("policy")
P = TypeVar("P", bound=type[BasePolicy])


def register_policy(cls: P) -> P:
    """Class decorator: register a placement policy's class under ``cls.name``. Returns the class."""
    if not cls.name:
        raise ValueError("a policy needs a name")
    POLICIES.register(cls.name, cls)
    return cls


for _p in (RoundRobin, ZigZag, Wave, DagList, Pools):
    register_policy(_p)


def get_policy(name: str, **params: Any) -> BasePolicy:
    """An instance of the registered policy ``name`` with ``params``; one line naming the known ones otherwise."""
    cls = POLICIES.get(name, None)
    if cls is None:
        raise UnknownNameError("policy", name, sorted(POLICIES))
    return cls(**params)

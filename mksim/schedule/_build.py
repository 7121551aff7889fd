"""``build_schedule``: a workload, a GPU and a mode → a validated :class:`Schedule`."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import hwmodels
from hwmodels import GPUSpec
from mksim import models
from mksim.errors import ScheduleError, UnknownNameError, WorkloadError
from mksim.sim._costs import rates
from mksim.sim._engine import gc_paused, mark_validated
from mksim.workload import TaskGraph, Tiling, Workload

from ._policies import POLICIES, get_policy
from ._schedule import CHAIN_MODES, MODES, Options, Schedule, dispatch_layout

# Defaults per mode: chains launch a few blocks per SM (as libraries do) and have no
# cross-kernel prefetch except PDL's prologue; persistent modes run one block per SM.
MODE_DEFAULTS: dict[str, dict[str, Any]] = {
    "stream": {"tasks_per_sm": 2.0, "blocks_per_sm": 2, "prefetch_depth": 0},
    "graph": {"tasks_per_sm": 2.0, "blocks_per_sm": 2, "prefetch_depth": 0},
    "graph_pdl": {"tasks_per_sm": 2.0, "blocks_per_sm": 2, "prefetch_depth": 2},
    "persistent_barrier": {"tasks_per_sm": 1.0, "blocks_per_sm": 1, "prefetch_depth": 0},
    "megakernel": {"tasks_per_sm": 1.0, "blocks_per_sm": 1, "prefetch_depth": 4},
}
DEFAULT_POLICY = "dag"
WORKLOAD_KEYS = ("batch", "kv_len", "phase", "prefill_tokens", "weight_dtype", "kv_splits", "fuse_norm", "split_qkv",
                 "split_gate_up")


def workload_from_spec(spec: dict[str, Any]) -> Workload:
    """Rebuild a workload from the spec stored in a schedule file."""
    if not isinstance(spec, dict) or "model" not in spec:
        raise ScheduleError("schedule workload must be an object with a 'model' (name or HF config)")
    params = {k: spec[k] for k in WORKLOAD_KEYS if k in spec and spec[k] is not None}
    if "n_sms" in spec:
        params["n_sms"] = spec["n_sms"]
    model = spec["model"]
    if isinstance(model, dict):
        return models.from_hf_config(model, **params)
    return models.workload(model, **params)


def build_schedule(workload: Workload | str, gpu: GPUSpec | str, mode: str, *, policy: str | None = None,
                   policy_options: dict[str, Any] | None = None, tiling: Tiling | None = None,
                   queues: list[list[int]] | None = None, **options: Any) -> Schedule:
    """Place ``workload`` on ``gpu`` in ``mode`` and validate the result.

    ``workload`` is a :class:`Workload` or a built-in model name (decode, batch 1, KV 1024).
    ``options`` are :class:`Options` fields (``prefetch_depth=2``, ``sync="flag"``, ...);
    ``policy`` (megakernel) is one of ``rr``, ``zigzag``, ``wave``, ``dag``, ``pool``.

    Example::

        >>> import mksim
        >>> s = mksim.build_schedule("llama-3.2-1b", "h200", "megakernel", policy="rr")
        >>> len(s.queues), s.options.prefetch_depth
        (132, 4)
    """
    with gc_paused():  # a graph and its queues are tens of thousands of small objects
        return _build(workload, gpu, mode, policy, policy_options, tiling, queues, options)


def _build(workload: Workload | str, gpu: GPUSpec | str, mode: str, policy: str | None,
           policy_options: dict[str, Any] | None, tiling: Tiling | None, queues: list[list[int]] | None,
           options: dict[str, Any]) -> Schedule:
    if mode not in MODES:
        raise UnknownNameError("mode", mode, MODES)
    g = hwmodels.load(gpu) if isinstance(gpu, str) else gpu
    if isinstance(workload, str):
        workload = models.workload(workload, n_sms=g.sm.count)
    known = {f.name for f in fields(Options)}
    bad = set(options) - known
    if bad:
        raise ScheduleError(f"unknown schedule option {sorted(bad)[0]!r}; known: {', '.join(sorted(known))}")
    opts = Options(**{**MODE_DEFAULTS[mode], **options})
    if opts.movement == "native" and mode not in CHAIN_MODES and "prefetch_depth" not in options:
        # a kernel of its generation fills the shared memory left beside its reserve with pages
        room = g.sm.shared_memory_per_block_KiB - opts.smem_reserve_KiB
        opts = replace(opts, prefetch_depth=max(0, int(room // opts.page_KiB)))
    if opts.tasks_per_sm <= 0:
        raise ScheduleError(f"tasks_per_sm must be positive, got {opts.tasks_per_sm}")
    tile_sms = g.sm.count  # dynamic dispatch cuts each op for the worker SMs
    if opts.dispatch == "dynamic" and mode == "megakernel":
        tile_sms = dispatch_layout(g, opts.schedulers)[0]
    try:
        graph = _task_graph(workload, tiling or Tiling.for_sms(tile_sms, opts.tasks_per_sm))
    except WorkloadError as exc:
        raise ScheduleError(str(exc)) from None
    spec = _spec(workload, g) if workload.model is not None else {}
    sched = Schedule(mode=mode, gpu=g, workload=workload, graph=graph, options=opts, workload_spec=spec)
    if mode in CHAIN_MODES:
        if policy:
            raise ScheduleError(f"mode {mode} runs one kernel per op; policies apply to megakernel only")
        return mark_validated(sched.validate())
    if queues is None:
        n_place = g.sm.count
        if mode == "persistent_barrier":
            pol = get_policy(policy or "rr", **(policy_options or {}))
        elif opts.dispatch == "dynamic":  # the worker SMs, in MPK's round robin unless told otherwise
            sched.validate_options()
            n_place = dispatch_layout(g, opts.schedulers)[0]
            pol = get_policy(policy or "rr", **(policy_options or {}))
        else:
            pol = get_policy(policy or DEFAULT_POLICY, **(policy_options or {}))
        queues = pol.place(graph, rates(g), n_place)
        sched.policy, sched.policy_options = pol.name, dict(pol.options)
    sched.queues = queues
    return mark_validated(sched.validate())  # simulate() need not check it again


_RECENT_GRAPHS: list[tuple[Workload, Tiling, TaskGraph]] = []


def _task_graph(workload: Workload, tiling: Tiling) -> TaskGraph:
    """``TaskGraph(workload, tiling)``, reusing one of the last two built: comparing modes
    builds the same graph for several of them, and a graph is never changed once built."""
    for wl, tl, graph in _RECENT_GRAPHS:
        if tl == tiling and (wl is workload or wl == workload):
            return graph
    graph = TaskGraph(workload, tiling)
    _RECENT_GRAPHS[:] = [(workload, tiling, graph), *_RECENT_GRAPHS[:1]]
    return graph


def _spec(wl: Workload, gpu: GPUSpec) -> dict[str, Any]:
    cfg = wl.model
    builtin = cfg is not None and cfg.name in models.names() and models.get(cfg.name) == cfg
    model: Any = cfg.name if builtin else _hf_dict(cfg)
    attn = next((op for op in wl.ops if op.kind == "attn_partial"), None)
    return {"model": model, "batch": wl.batch, "kv_len": wl.kv_len, "phase": wl.phase,
            "prefill_tokens": wl.prefill_tokens or None, "weight_dtype": wl.weight_dtype,
            "kv_splits": attn.attrs["kv_splits"] if attn else None, "fuse_norm": wl.fuse_norm,
            "split_qkv": wl.split_qkv, "split_gate_up": wl.split_gate_up}


def _hf_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        raise ScheduleError("this workload has no model config (from_torch?); it cannot be saved as a schedule")
    return {"model_type": cfg.model_type, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
            "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": cfg.attention_bias,
            "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
            "max_position_embeddings": cfg.max_position_embeddings, "_name_or_path": cfg.name}


__all__ = ["MODE_DEFAULTS", "POLICIES", "build_schedule", "workload_from_spec"]

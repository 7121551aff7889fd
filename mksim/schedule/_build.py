"""``build_schedule``: a workload, a GPU and a mode → a validated :class:`Schedule`."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

from hwmodels import GPUSpec
from mksim import models
from mksim.errors import ScheduleError, WorkloadError
from mksim.target import gpu_spec
from mksim.workload import (
    ROLES,
    SWITCHES,
    TaskGraph,
    Tiling,
    Workload,
    expand_kernels,
    kernels_per_op,
    rank_view,
    resolved_kv_splits,
)

from ._designs import active_designs, with_defaults
from ._modes import MODE_DEFAULTS, PersistentMode, get_mode
from ._policies import get_policy
from ._schedule import Options, Schedule, check_fits

DEFAULT_POLICY = "dag"  # the megakernel's (PersistentMode.default_policy)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off Python's cycle collector while building or simulating. A run allocates a few
    objects per task that reference counting frees at once; the collector would still walk the
    whole (growing) heap every few ten thousand of them, and wall time would grow faster than the
    number of tasks."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def build_schedule(workload: Workload | str, gpu: GPUSpec | str, mode: str, *, policy: str | None = None,
                   policy_options: dict[str, Any] | None = None, tiling: Tiling | None = None,
                   queues: list[list[int]] | None = None, **options: Any) -> Schedule:
    """Place ``workload`` on ``gpu`` in ``mode`` and validate the result.

    ``workload`` is a :class:`Workload` or a built-in model name (decode, batch 1, KV 1024).
    ``options`` are :class:`Options` fields (``prefetch_depth=2``, ``sync="flag"``, ...);
    ``policy`` (megakernel) is one of ``rr``, ``zigzag``, ``wave``, ``dag``, ``pool``.

    Example::

        >>> import mksim
        >>> s = mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel", policy="rr")
        >>> len(s.queues), s.options.prefetch_depth
        (132, 4)
    """
    with gc_paused():  # a graph and its queues are tens of thousands of small objects
        return _build(workload, gpu, mode, policy, policy_options, tiling, queues, options)


def _build(workload: Workload | str, gpu: GPUSpec | str, mode_name: str, policy: str | None,
           policy_options: dict[str, Any] | None, tiling: Tiling | None, queues: list[list[int]] | None,
           options: dict[str, Any]) -> Schedule:
    mode = get_mode(mode_name)  # UnknownNameError
    g = gpu_spec(gpu)
    if isinstance(workload, str):
        workload = models.workload(workload, n_sms=g.sm.count)
    opts = with_defaults(Options.checked(options, MODE_DEFAULTS[mode_name]), g, mode_name, set(options))
    if not 0 < opts.tasks_per_sm < float("inf"):
        raise ScheduleError(f"tasks_per_sm must be a positive finite number, got {opts.tasks_per_sm}")
    if policy_options is not None and not isinstance(policy_options, dict):
        raise ScheduleError(f"policy_options must be a dict of name: value, got {policy_options!r}")
    check_fits(workload, g)  # before the task graph, which grows with the batch
    if not isinstance(mode, PersistentMode):  # a stack's profile: an op of k kernels is k kernels
        workload = expand_kernels(workload, kernels_per_op(g.kernels.per_kind))
    tile_sms = g.sm.count
    for d in active_designs(mode_name, opts):  # dynamic dispatch cuts each op for the worker SMs
        tile_sms = d.tile_sms(g, opts, tile_sms)
    try:
        graph = _task_graph(workload, tiling or Tiling.for_sms(tile_sms, opts.tasks_per_sm))
    except WorkloadError as exc:
        raise ScheduleError(str(exc)) from None
    spec = _spec(workload, g) if workload.model is not None else {}
    sched = Schedule(mode=mode_name, gpu=g, workload=workload, graph=graph, options=opts, workload_spec=spec)
    if not isinstance(mode, PersistentMode):
        if policy:
            raise ScheduleError(f"mode {mode_name} runs one kernel per op; policies apply to megakernel only")
        return sched.validate().mark_validated()
    if queues is None:
        n_place, default = g.sm.count, mode.default_policy
        for d in active_designs(mode_name, opts):
            n_place, default = d.placement(sched, n_place, default)
        pol = get_policy(policy or default, **(policy_options or {}))
        queues = mode.place(sched, sched.rates, pol, n_place)
        sched.policy, sched.policy_options = pol.name, dict(pol.options)
    sched.queues = queues
    return sched.validate().mark_validated()  # simulate() need not check it again


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
    """What a schedule file stores to rebuild ``wl``: its model, step and build choices, with the KV split
    it resolved (:func:`~mksim.workload.resolved_kv_splits`), so the rebuilt one needs no GPU."""
    cfg = wl.model
    builtin = cfg is not None and cfg.name in models.names() and models.get(cfg.name) == cfg
    model: Any = cfg.name if builtin else _hf_dict(cfg)
    kv_splits: int | None
    if wl.step is not None and wl.build is not None:
        kv_splits = resolved_kv_splits(*rank_view(cfg, wl.step), wl.build)
    else:  # made by hand around a config: what its attention ops say
        attn = next((op for op in wl.ops if op.kind == "attn_partial"), None)
        kv_splits = attn.attrs["kv_splits"] if attn else None
    step = wl.step  # a mixture of experts' routing, where it is not the default
    routed = {"routing": step.routing, "routing_seed": step.routing_seed} if step is not None and wl.routing and (
        step.routing != "uniform" or step.routing_seed) else {}
    split = {k: getattr(step, k) for k in ("tp", "ep") if step is not None and getattr(step, k) > 1}
    return {"model": model, **split, "batch": wl.batch, "kv_len": wl.kv_len, "phase": wl.phase,
            "prefill_tokens": wl.prefill_tokens or None, "weight_dtype": wl.weight_dtype, "kv_splits": kv_splits,
            **routed, **{k: getattr(wl, k) for k in SWITCHES}, **dict(wl.options)}


def _hf_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        raise ScheduleError("this workload has no model config (from_torch?); it cannot be saved as a schedule")
    window: dict[str, Any] = {}
    if getattr(cfg, "sliding_window", None) is not None:  # as Hugging Face writes it, read back the same
        window = {"sliding_window": cfg.sliding_window}
        if cfg.model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
            window.update(use_sliding_window=True, max_window_layers=cfg.full_attention_layers)
    # blocks other than a config's defaults, under mksim's own key (the importer reads it back)
    chosen = {role: getattr(cfg, f"{role}_block") for role in ROLES}
    default = {role: f.default for role in ROLES for f in fields(models.ModelConfig) if f.name == f"{role}_block"}
    blocks = {"mksim_blocks": {r: n for r, n in chosen.items() if n != default[r]}} if chosen != default else {}
    return {**window, **blocks, **models.moe_hf_keys(cfg), "model_type": cfg.model_type, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
            "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": cfg.attention_bias,
            "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
            "max_position_embeddings": cfg.max_position_embeddings, "_name_or_path": cfg.name}


__all__ = ["build_schedule", "check_fits", "gc_paused"]

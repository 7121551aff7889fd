"""Hardware for the explorer: every hardware file's numbers side by side, and what-if overrides.

Plain data (no Dash, no plotly), as :mod:`explorer.data`. A what-if is a new frozen
:class:`hwmodels.GPUSpec` made with :func:`dataclasses.replace`; nothing loaded is changed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from hwmodels import UNITS, unit_of
from mksim.errors import MksimError
from mksim.target import GPUS, gpu_spec


@dataclass(frozen=True)
class WhatIf:
    """Hardware overrides for a what-if comparison: each field scales (or sets) numbers of a GPU.

    - ``launch_scale`` multiplies every kernel-launch cost (``launch.stream_launch_us``,
      ``graph_node_us``, ``pdl_node_us``, ``stream_gap_us``, ``launch_latency_us``,
      ``block_setup_us``); 0 makes launches free. ``launch.first_load_us`` is a memory latency
      and stays.
    - ``hbm_scale`` multiplies ``dram.bandwidth_spec_GBps`` (the reachable fraction stays).
    - ``sync_scale`` multiplies the persistent kernels' synchronisation: ``sync.grid_barrier_us``
      and ``sync.flag_latency_ns``.
    - ``sm_count`` replaces ``sm.count``; each SM keeps its share of compute and L2 bandwidth
      (both scale with the count), HBM bandwidth does not.

    >>> import hwmodels
    >>> g = WhatIf(launch_scale=0.0, sm_count=66).apply(hwmodels.load("h200-datasheet"))
    >>> g.name, g.launch.graph_node_us, g.sm.count, g.compute.tensor_bf16_dense_TFLOPs
    ('h200-datasheet (what-if)', 0.0, 66, 494.75)
    """
    launch_scale: float = 1.0
    hbm_scale: float = 1.0
    sync_scale: float = 1.0
    sm_count: int | None = None

    def is_identity(self, gpu: Any) -> bool:
        return (self.launch_scale == self.hbm_scale == self.sync_scale == 1.0
                and self.sm_count in (None, gpu.sm.count))

    def apply(self, gpu: Any) -> Any:
        """A new :class:`hwmodels.GPUSpec` with the overrides (``gpu`` itself when there are none)."""
        for key in ("launch_scale", "sync_scale"):
            if not getattr(self, key) >= 0:
                raise MksimError(f"{key} must be 0 or more, got {getattr(self, key)}")
        if not self.hbm_scale > 0:
            raise MksimError(f"hbm_scale must be positive, got {self.hbm_scale}")
        if self.sm_count is not None and (isinstance(self.sm_count, bool) or int(self.sm_count) != self.sm_count
                                          or self.sm_count < 1):
            raise MksimError(f"sm_count must be a positive integer, got {self.sm_count}")
        if self.is_identity(gpu):
            return gpu

        def scaled(obj: Any, names: tuple[str, ...], k: float) -> Any:
            return replace(obj, **{n: getattr(obj, n) * k for n in names if getattr(obj, n) is not None})

        launch = scaled(gpu.launch, ("stream_launch_us", "graph_node_us", "pdl_node_us", "stream_gap_us",
                                     "launch_latency_us", "block_setup_us"), self.launch_scale)
        sync = scaled(gpu.sync, ("grid_barrier_us", "flag_latency_ns"), self.sync_scale)
        dram = replace(gpu.dram, bandwidth_spec_GBps=gpu.dram.bandwidth_spec_GBps * self.hbm_scale)
        n = int(self.sm_count or gpu.sm.count)
        k = n / gpu.sm.count
        compute = scaled(gpu.compute, tuple(f.name for f in fields(gpu.compute)), k)
        return replace(gpu, name=f"{gpu.name} (what-if)", launch=launch, sync=sync, dram=dram,
                       sm=replace(gpu.sm, count=n), compute=compute,
                       l2=replace(gpu.l2, bandwidth_GBps=gpu.l2.bandwidth_GBps * k))


def whatif_changes(base: Any, new: Any) -> list[dict[str, Any]]:
    """The numbers that differ between two GPU specs: ``key unit base new``, in file order."""
    a, b = base.numbers(), new.numbers()
    return [{"key": key, "unit": UNITS.get(unit_of(key), unit_of(key)), "base": a[key], "new": b[key]}
            for key in a if a[key] != b[key]]


def hardware_table(names: list[str] | None = None) -> dict[str, Any]:
    """Every number of the chosen hardware files (all by default), side by side, each with its source.

    ``gpus``: ``name full_name vendor architecture extends`` per GPU. ``rows``: per dotted key its
    ``key unit`` and ``cells`` (GPU name -> ``value ref estimate overlay`` or ``None`` where the
    file has no such number; ``overlay`` marks a number a calibrated overlay changed from its
    base). ``sources``: ``ref gpu kind date title url note``, numbered as the cells cite them.
    """
    known = GPUS
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) and n in known
                                                                      for n in names)):
        raise MksimError(f"GPUs: choose among {', '.join(known)}")
    gpus = [gpu_spec(n) for n in dict.fromkeys(names or known)]
    bases = {g.name: gpu_spec(g.extends).numbers() if g.extends else {} for g in gpus}
    numbers = {g.name: g.numbers() for g in gpus}
    refs: dict[tuple[str, str], int] = {}
    rows = []
    for key in dict.fromkeys(k for g in gpus for k in numbers[g.name]):  # op kinds differ between files
        cells: dict[str, Any] = {}
        for g in gpus:
            v = numbers[g.name].get(key)
            if v is None:
                cells[g.name] = None
                continue
            src = g.source_of(key)
            cells[g.name] = {"value": v, "ref": refs.setdefault((g.name, src.id), len(refs) + 1),
                             "estimate": src.kind == "estimate",
                             "overlay": bool(bases[g.name]) and bases[g.name].get(key) != v}
        leaf = key.rsplit(".", 1)[-1]
        rows.append({"key": key, "unit": UNITS.get(unit_of(leaf), unit_of(leaf)), "cells": cells})
    by_name = {g.name: g for g in gpus}
    sources = []
    for (gname, sid), ref in refs.items():
        s = by_name[gname].sources[sid]
        sources.append({"ref": ref, "gpu": gname, "kind": s.kind, "date": s.date, "title": s.title,
                        "url": s.url, "note": s.note})
    return {"gpus": [{"name": g.name, "full_name": g.full_name, "vendor": g.vendor,
                      "architecture": g.architecture, "extends": g.extends} for g in gpus],
            "rows": rows, "sources": sources}

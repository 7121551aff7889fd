"""The suite's searched megakernel schedules: ``mksim search`` with the kernel's options fixed,
stored under ``validation/schedules/``, and their table for docs/validation.md."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import hwmodels
from mksim.errors import MksimError
from mksim.schedule import Schedule
from mksim.search import ring_fixed, search

from .core import BATCHES, GPU, KV_LEN, MODELS, SCHEDULES, Refused, _f, predicted_us, search_fixed

__all__ = ["SCHEDULES", "describe", "schedules_table", "search_schedules"]


def search_schedules(only: list[str] | None = None, *, trials: int = 200, seed: int = 0, storage: str = "memory",
                     workers: int = 1, out_dir: Path | str = SCHEDULES, gpu: str = GPU,
                     say: Callable[[str], None] = lambda _msg: None) -> list[dict]:
    """Run ``mksim search`` for each model and batch of the suite with the kernel's options fixed
    (:func:`search_fixed`, and the page ring where the profile has no cost per page:
    :func:`mksim.search.ring_fixed`); write ``<model>-b<batch>.json`` (the best schedule) and
    ``<model>-b<batch>.search.json`` (the study's outcome) into ``out_dir``. A model and batch the
    kernels refuse (:class:`~validation.suite.Refused`) is said so and skipped."""
    pairs = [(m, b) for m in MODELS for b in BATCHES]
    if only:
        pairs = [(m, b) for m, b in pairs if any(s in f"{m}/b{b}" for s in only)]
        if not pairs:
            raise MksimError(f"no model and batch matches --only {' '.join(only)}; they look like {MODELS[0]}/b1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for model, batch in pairs:
        try:
            fixed = ring_fixed(hwmodels.load(gpu), search_fixed(model, batch, KV_LEN, gpu))
        except Refused as exc:
            say(f"{model} batch {batch}: refused, no search ({exc})")
            continue
        path = out / f"{model}-b{batch}.json"
        res = search(model, gpu, batch=batch, kv_len=KV_LEN, trials=trials, seed=seed, storage=storage,
                     workers=workers, out=path, fixed=fixed, best_mode="megakernel")
        info = {"model": model, "batch": batch, "kv_len": KV_LEN, "gpu": gpu, "trials": trials, "seed": seed,
                "fixed": fixed, "schedule": path.name, "predicted_us": predicted_us(Schedule.from_json(path)),
                "latency_us": res.best["latency_us"], "candidate": res.best["candidate"],
                "baselines_latency_us": {k: v["latency_us"] for k, v in sorted(res.baselines.items())},
                "speedup_vs_baseline": dict(sorted(res.improvement().items())),
                "study": {"complete": res.n_complete, "pruned": res.n_pruned, "failed": res.n_failed}}
        path.with_name(path.stem + ".search.json").write_text(json.dumps(info, indent=1) + "\n")
        made.append(info)
        base = ", ".join(f"{k} {info['baselines_latency_us'][k]:.1f}" for k in ("graph_pdl", "megakernel:dag")
                         if k in info["baselines_latency_us"])
        say(f"{model} batch {batch}: best {res.best['latency_us']:.1f} µs ({base}) -> {path}")
    return made


def schedules_table(folder: Path | str = SCHEDULES, gpu: str = GPU) -> str:
    """The searched schedules against the default megakernel and graph_pdl (predicted µs, as the
    suite predicts: launch latency left out), from the ``.search.json`` files in ``folder``."""
    launch = hwmodels.load(gpu).launch.launch_latency_us
    lines = ["| model | batch | searched µs | default megakernel (dag) µs | graph_pdl µs | vs default | vs graph_pdl "
             "| searched schedule | kernel options fixed | trials complete/pruned |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for model in MODELS:
        for batch in BATCHES:
            p = Path(folder) / f"{model}-b{batch}.search.json"
            if not p.is_file():
                continue
            d = json.loads(p.read_text())
            base = {k: v - launch for k, v in d["baselines_latency_us"].items()}
            best, mk, pdl = d["predicted_us"], base.get("megakernel:dag"), base.get("graph_pdl")
            lines.append(f"| {model} | {batch} | {best:.1f} | {_f(mk, '.1f')} | {_f(pdl, '.1f')} | "
                         f"{_f(mk and mk / best, '.3f')}× | {_f(pdl and pdl / best, '.3f')}× | "
                         f"{describe(d['candidate'])} | "
                         f"{', '.join(f'{k}={v:g}' for k, v in d['fixed'].items())} | "
                         f"{d['study']['complete']}/{d['study']['pruned']} |")
    return "\n".join(lines) + "\n"


def describe(c: dict) -> str:
    """A searched candidate in a few words."""
    o = c["options"]
    parts = [f"{c['policy']}" + (" (level order)" if c["policy_options"].get("order") == "level" else ""),
             f"{o['prefetch_depth']}×{o['page_KiB']:g} KiB pages", o["sync"]]
    if c["grain"]:
        parts.append("grain " + ", ".join(f"{k} {v:g}" for k, v in c["grain"].items()))
    if c["small_grain"] != 1.0:
        parts.append(f"small ops {c['small_grain']:g}")
    if c["kv_split_mult"] != 1.0:
        parts.append(f"KV splits ×{c['kv_split_mult']:g}")
    parts += [w for w, on in (("norms fused", c["fuse_norm"]), ("RoPE fused", c.get("fuse_rope", False)),
                              ("SiLU fused", c.get("fuse_silu", False)),
                              ("reduction fused", c.get("fuse_reduce", False)), ("q/k/v split", c["split_qkv"]),
                              ("gate/up split", c["split_gate_up"])) if on]
    return ", ".join(parts)

"""Are the engine's predictions unchanged? A hash of every result field that tests and docs read, for a
matrix of cases, compared with the same hashes from a reference checkout.

Run (the reference: any checkout of the commit to compare against, e.g. ``git worktree add /tmp/ref main``
or ``git archive main | tar -x -C /tmp/ref``)::

    python benchmarks/sim_equal.py --ref /tmp/ref            # prints "identical: N cases" or the first diff
    python benchmarks/sim_equal.py --ref /tmp/ref --quick    # a fifth of the cases, for the edit loop
    python benchmarks/sim_equal.py --write hashes.json       # this tree's hashes, to compare later
    python benchmarks/sim_equal.py --against hashes.json

``--ref`` runs this script under the reference's code (``PYTHONPATH``) in a subprocess and keeps its
hashes in ``--cache`` (by default ``/tmp/mksim-sim-equal-<digest of the reference's mksim/>.json``), so a
reference is simulated once. Both runs use this file's matrix.

The matrix: llama-3.2-1b, llama-3.1-8b, qwen3-8b and mistral-7b at batch 1 and 8 and KV 1024 and 4096,
in every mode of :data:`mksim.schedule.MODES`; in the megakernel, every sync, every placement policy and
every design's compare rows (:func:`mksim.schedule.design_rows`), and an L2 prefetcher, at two of
those steps; chain-mode options (two blocks per SM, each PDL trigger, finer tiles); prefill; and the
GPUs whose files reach other parts of the engine (h200-calibrated: the loaded-latency knee;
``+mksim`` and ``+torch``: device functions and page rings; b200 and mi300x: dies; a100: no PDL). The
hash covers ``latency_us``, ``dram_bytes``, the breakdown, the per-op times, per-task start, end and
lane, the timeline and its task names, the HBM rate log and the designs' stats; a second run with
``timeline=False`` must give the same latency, breakdown, per-op and per-task times.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODELS = ("llama-3.2-1b", "llama-3.1-8b", "qwen3-8b", "mistral-7b")
STEPS = ((1, 1024), (1, 4096), (8, 1024), (8, 4096))
VARIANT_STEPS = ((1, 1024), (8, 4096))  # where the megakernel's variants run


def cases() -> list[tuple[str, dict[str, Any]]]:
    """``(name, spec)`` for every case; a spec is what :func:`run_case` builds."""
    from mksim.schedule import MODES, POLICIES, SYNCS, design_names, get_design

    out: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()

    def add(model: str, batch: int, kv: int, mode: str, gpu: str = "h200", policy: str | None = None,
            phase: str = "decode", **opts: Any) -> None:
        spec = {"model": model, "batch": batch, "kv": kv, "mode": mode, "gpu": gpu, "policy": policy,
                "phase": phase, "opts": opts}
        tag = " ".join(f"{k}={v}" for k, v in sorted(opts.items()))
        name = f"{model} {phase} b{batch} kv{kv} {gpu} {mode}" + (f" policy={policy}" if policy else "")
        name += f" {tag}" if tag else ""
        if name not in seen:  # a design's row may be a sync's or a policy's case too
            seen.add(name)
            out.append((name, spec))

    variants: list[tuple[str | None, dict[str, Any]]] = [(None, {"sync": s}) for s in SYNCS if s != "counter"]
    variants += [(p, {}) for p in POLICIES if p != "dag"]
    for d in design_names():
        for _label, opts in get_design(d).compare_rows:
            o = dict(opts)
            pol = o.pop("policy", None)
            variants.append((pol, o))
    variants += [(None, {"dispatch": "dynamic", "prelaunch": 0}), (None, {"l2_prefetch_KiB": 256.0})]
    for model in MODELS:
        for batch, kv in STEPS:
            for mode in MODES:
                add(model, batch, kv, mode)
            if (batch, kv) in VARIANT_STEPS:
                for pol, o in variants:
                    add(model, batch, kv, "megakernel", policy=pol, **o)
    for model in ("llama-3.2-1b", "llama-3.1-8b"):
        for mode in MODES:
            add(model, 1, 1024, mode, phase="prefill")
        add(model, 1, 1024, "graph", blocks_per_sm=2)
        add(model, 1, 1024, "graph_pdl", pdl_trigger="late")
        add(model, 1, 1024, "graph_pdl", pdl_trigger="never")
        add(model, 1, 1024, "graph", tasks_per_sm=8.0)
        add(model, 1, 1024, "megakernel", tasks_per_sm=4.0)
        add(model, 8, 4096, "megakernel", prefetch_depth=2)
    for gpu in ("h200-calibrated", "h200-calibrated+mksim", "h200-calibrated+torch", "b200", "mi300x", "a100"):
        for batch, kv in VARIANT_STEPS:
            for mode in MODES:
                add("llama-3.2-1b", batch, kv, mode, gpu=gpu)
            for pol, o in variants:
                add("llama-3.2-1b", batch, kv, "megakernel", gpu=gpu, policy=pol, **o)
    add("llama-3.1-8b", 1, 1024, "megakernel", gpu="h200-calibrated+mksim")
    add("llama-3.1-8b", 1, 1024, "graph", gpu="h200-calibrated+torch")
    add("llama-3.2-1b", 1, 1024, "megakernel", gpu="h200-calibrated+mksim", l2_prefetch_KiB=256.0)
    add("llama-3.2-1b", 1, 1024, "megakernel", gpu="h200-calibrated+mksim", movement="native")
    return out


def _h(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def run_case(spec: dict[str, Any]) -> str:
    """The case's hash; ``"error: ..."`` where it is refused (a mode or a design the GPU cannot take)."""
    import numpy as np

    import mksim
    from mksim.errors import MksimError
    from mksim.schedule import build_schedule

    try:
        wl = mksim.models.workload(spec["model"], batch=spec["batch"], kv_len=spec["kv"], phase=spec["phase"],
                                   **({"prefill_tokens": 64} if spec["phase"] == "prefill" else {}))
        s = build_schedule(wl, spec["gpu"], spec["mode"], policy=spec["policy"], **spec["opts"])
    except MksimError as exc:
        return f"error: {type(exc).__name__}: {exc}"
    full = mksim.simulate(s)
    lean = mksim.simulate(s, timeline=False)

    def numbers(r: mksim.SimResult) -> tuple:
        return (repr(r.latency_us), repr(r.dram_bytes), repr(sorted(r.breakdown_us.items())), repr(r.per_op),
                np.asarray(r.task_start_us).tobytes(), np.asarray(r.task_end_us).tobytes(),
                np.asarray(r.task_lane).tobytes(), repr(sorted(r.design_stats.items())))

    if numbers(lean) != numbers(full):
        return "error: timeline=False differs from timeline=True"
    return _h(repr(full.latency_us)) + ":" + _h(numbers(full), repr(full.timeline), full.task_names,
                                                  repr(full.hbm_log))


def compute(quick: bool, only: str | None = None) -> dict[str, str]:
    """Every case's hash (a fifth of them with ``quick``), by name."""
    todo = cases()
    if quick:
        todo = todo[::5]
    if only:
        todo = [(n, s) for n, s in todo if only in n]
    return {name: run_case(spec) for name, spec in todo}


def _reference(ref: Path, quick: bool, only: str | None, cache: Path | None) -> dict[str, str]:
    if cache is None:
        digest = hashlib.sha256()
        for p in sorted((ref / "mksim").rglob("*.py")) + sorted((ref / "hwmodels").rglob("*.toml")):
            digest.update(str(p.relative_to(ref)).encode() + p.read_bytes())
        digest.update(Path(__file__).read_bytes())
        cache = Path(f"/tmp/mksim-sim-equal-{digest.hexdigest()[:12]}.json")
    got: dict[str, str] = json.loads(cache.read_text()) if cache.exists() else {}
    want = [n for n, _ in cases()]
    if quick:
        want = want[::5]
    if only:
        want = [n for n in want if only in n]
    if any(n not in got for n in want):
        env = dict(os.environ, PYTHONPATH=str(ref))
        args = [sys.executable, __file__, "--write", str(cache) + ".part"] + (["--quick"] if quick else [])
        args += ["--only", only] if only else []
        subprocess.run(args, env=env, check=True)
        got |= json.loads(Path(str(cache) + ".part").read_text())
        cache.write_text(json.dumps(got, indent=0))
    return {n: got[n] for n in want if n in got}  # a case the reference cannot make (a newer design) is not in it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", type=Path, help="a checkout of the reference commit")
    ap.add_argument("--cache", type=Path, help="where the reference's hashes are kept")
    ap.add_argument("--against", type=Path, help="compare with hashes written by --write")
    ap.add_argument("--write", type=Path, help="write this tree's hashes here")
    ap.add_argument("--quick", action="store_true", help="every fifth case")
    ap.add_argument("--only", help="the cases whose name contains this")
    args = ap.parse_args()
    if args.ref is None and args.against is None and args.write is None:
        ap.error("give --ref, --against or --write")
    ref = None
    if args.ref is not None:
        ref = _reference(args.ref, args.quick, args.only, args.cache)
    elif args.against is not None:
        ref = json.loads(args.against.read_text())
    t0 = time.perf_counter()
    mine = compute(args.quick, args.only)
    took = time.perf_counter() - t0
    if args.write is not None:
        args.write.write_text(json.dumps(mine, indent=0))
    if ref is None:
        print(f"wrote {len(mine)} cases in {took:.0f} s")
        return
    new = [name for name in mine if name not in ref]
    for name in new:  # rows of a design the reference does not have
        print(f"not in the reference (compared: none): {name}")
    for name, h in mine.items():
        if name in new:
            continue
        if ref[name] != h:
            what = "latency_us" if ref[name].split(":")[0] != h.split(":")[0] else "timeline or other fields"
            print(f"differs ({what}): {name}\n  reference {ref[name]}\n  this tree {h}")
            sys.exit(1)
    only = f"; {len(new)} only in this tree" if new else ""
    print(f"identical: {len(mine) - len(new)} cases ({took:.0f} s){only}")


if __name__ == "__main__":
    main()

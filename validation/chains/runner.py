"""Measure the chains on the GPU: mksim's generated kernels and torch's ``F.linear`` (cuBLAS).

For each case of :func:`.cases.case_list`: the chain is checked (every op's output against an fp32
reference from the same input, relative error <= 1e-2), then replayed ``reps`` times after a
warm-up, each replay preceded by a 256 MiB write (the L2 holds 60 MB: every weight comes from
DRAM) and a synchronisation, so that each replay starts on an idle GPU with its launches not yet
queued (a stream of launches is paced by the host, as in use). Median, p10, p90 of the replays.

mksim's side runs :class:`validation.megakernel.gpu.Runner` unchanged (``graph_pdl`` compiled with
the trigger early or late); torch's side is ``y = F.linear(y, W_i)`` on bf16 tensors, as a plain
stream of launches and captured in one CUDA graph. Singles (the calibration set): every distinct
shape of the chains and a size sweep of weights (64 KiB .. 256 MiB at K = 2048), both
implementations, each timed in CUDA graphs (:func:`single_record`): ``copies`` copies on distinct
weights, one alone, and one empty kernel, every replay cold; torch.profiler records which kernels
cuBLAS launches for each. (The first run, 2026-12-01, timed each single as one launch from Python
between events on an idle GPU: that includes the host's submission of the launch after the start
event, 8-9 µs for mksim's ctypes launch and ~24 µs for ``F.linear``; ``event`` keeps that number.)

The chains themselves are timed as the first run timed them: each replay's start event is
recorded on an idle GPU before the host submits the step, so every chain includes one host
submission (a graph launch, a persistent kernel's launch or the stream's first launch).

GPU only (torch, CuPy); ``python -m validation chains run --out DIR`` calls :func:`run`.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from mksim.errors import MksimError
from validation.megakernel import gpu as mkgpu

from . import cases as C

FLUSH_B = 256 << 20
SINGLES_METHOD = "graph"  # singles: graph replays (single_record); the first run's were "event" (host included)
SINGLE_COPIES = 8
SINGLE_COPIES_BYTES = 1 << 30
EMPTY_KERNEL = 'extern "C" __global__ void mk_empty() {}'
REL_ERR_MAX = 1e-2
FORMAT = "mksim-chains-raw"
RAW = "chains.json"


def _log(msg: str) -> None:
    print(msg, flush=True)


def stats(times_us: list[float]) -> dict:
    """Median, p10 and p90 of a list of µs."""
    q = np.percentile(times_us, [10, 50, 90])
    return {"measured_us": float(q[1]), "p10_us": float(q[0]), "p90_us": float(q[2]),
            "times_us": [round(t, 3) for t in times_us]}


def commit() -> str | None:
    """The checkout's commit (``MKSIM_COMMIT`` where the tree was copied without its git directory)."""
    try:
        r = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode == 0:
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("MKSIM_COMMIT")


def sources() -> dict[str, str]:
    """The git blob id of each source the run compiles or runs (``git log --all --find-object=BLOB``
    finds the commits holding it), computed without git: the device gets a copy of the tree."""
    root = Path(__file__).resolve().parents[2]
    files = [*mkgpu.SOURCES, *sorted(Path(__file__).resolve().parent.glob("*.py"))]
    out = {}
    for f in files:
        data = f.read_bytes()
        out[f.relative_to(root).as_posix()] = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return out


# -- mksim's generated kernels ---------------------------------------------------------------------
def _mk_wait(r, e1, watchdog_s: float, what: str) -> None:
    t0 = time.monotonic()
    while not e1.done:
        if time.monotonic() - t0 > watchdog_s:
            raise MksimError(f"{what} ran over {watchdog_s:g} s (hung)")
        time.sleep(2e-5)
    code = int(r.error[0])
    if code:
        raise MksimError(f"{what} failed: {mkgpu.ERRORS.get(code, f'error code {code}')}")


def mk_chain_times(r, flush, reps: int, watchdog_s: float) -> list[float]:
    """``reps`` cold replays of a Runner's step (after 3 warm ones)."""
    for _ in range(3):
        r.run_once(watchdog_s)
    out = []
    for i in range(reps):
        with r.stream:
            flush.fill(i + 1)
        r.stream.synchronize()
        out.append(r.run_once(watchdog_s))
    return out


def mk_case(case: C.Case, flush, reps: int, watchdog_s: float) -> dict:
    wl = C.chain_workload(case.sequence, case.batch)
    s = C.build_schedule(wl, case.mode)
    r = mkgpu.Runner(s, pdl_trigger=case.trigger or "early")
    try:
        errs, e2e = r.check(watchdog_s)
        times = mk_chain_times(r, flush, reps, watchdog_s)
        kernel = {"threads": mkgpu.P.THREADS, "smem_B": r.plan.smem_B, "page_B": r.plan.page_B,
                  "depth": r.plan.depth, "grid": [int(n) for n in s.graph.n_tiles] if s.queues is None
                  else len(s.queues)}
    finally:
        r.close()
    worst = max(errs.values())
    return {**stats(times), "checked": bool(worst <= REL_ERR_MAX), "rel_err": worst, "e2e_rel_err": max(e2e.values()),
            "kernel": kernel}


def graph_times(launch_graph, sync, record, flush_fill, reps: int, wait) -> list[float]:
    """``reps`` cold replays of a captured graph (after 2 warm ones): ``flush_fill(i)`` evicts the
    L2 and ``sync`` drains the GPU before each; ``record()`` gives a started event pair's end-recorder
    and elapsed-time reader around ``launch_graph()``; ``wait(e1)`` waits (watchdog) for the end."""
    out = []
    for rep in range(reps + 2):
        flush_fill(rep + 1)
        sync()
        stop, elapsed = record()
        launch_graph()
        e1 = stop()
        wait(e1)
        if rep >= 2:
            out.append(elapsed())
    return out


def single_record(implementation: str, batch: int, k: int, n: int, grid, graph_n_us: list[float],
                  graph_1_us: list[float], event_us: list[float], empty_us: list[float], copies: int,
                  checked: bool, rel_err: float) -> dict:
    """One single kernel's row (:data:`SINGLE_KEYS`), timed as :data:`SINGLES_METHOD` says:

    - ``kernel_us``: its cost as one node of a graph of ``copies`` copies on distinct weights
      (every copy cold), ``(replay(copies) - replay(1)) / (copies - 1)`` on the medians;
    - ``alone_us`` (also ``measured_us``): a graph of it alone less a graph of one empty kernel,
      each replayed the same way: its time beyond an empty kernel's, without the host's launch;
    - ``event_us``: one launch from Python between CUDA events on an idle GPU, as the first run
      measured singles: includes the host's submission after the start event (see README).

    >>> r = single_record("mksim", 1, 2048, 16, 1, [21.0] * 3, [7.0] * 3, [12.0] * 3, [5.0] * 3, 8, True, 0.0)
    >>> r["kernel_us"], r["alone_us"], r["measured_us"]
    (2.0, 2.0, 2.0)
    """
    if copies < 2:
        raise MksimError(f"a single kernel's marginal cost needs at least 2 copies, not {copies}")
    g_n, g_1, e = (float(np.median(x)) for x in (graph_n_us, graph_1_us, empty_us))
    alone = g_1 - e
    return {"implementation": implementation, "batch": batch, "K": k, "N": n, "weight_B": 2 * k * n, "grid": grid,
            "method": SINGLES_METHOD, "copies": copies, "kernel_us": (g_n - g_1) / (copies - 1),
            "alone_us": alone, "measured_us": alone, "graph_n": stats(graph_n_us), "graph_1": stats(graph_1_us),
            "event": stats(event_us), "empty_graph_us": e, "checked": checked, "rel_err": rel_err}


def copies_for(weight_B: int) -> int:
    """Copies of a single kernel in its graph: :data:`SINGLE_COPIES`, fewer for the largest weights
    (at least 2, and at most :data:`SINGLE_COPIES_BYTES` of weights per shape)."""
    return max(2, min(SINGLE_COPIES, SINGLE_COPIES_BYTES // max(weight_B, 1)))


def _cp_timer(cp, stream):
    def record():
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)

        def stop():
            e1.record(stream)
            return e1
        return stop, lambda: cp.cuda.get_elapsed_time(e0, e1) * 1e3
    return record


def mk_singles(batch: int, shapes: list[tuple[int, int]], flush, reps: int, watchdog_s: float) -> tuple[list, dict]:
    """Each shape as :func:`single_record` times it, with mksim's graph-mode kernel (one launch of
    ``mk_chain`` per op, one block per tile); and the kernel's registers and launch shape."""
    import cupy as cp

    counts = [copies_for(2 * k * n) for k, n in shapes]
    seq = C.Sequence("singles", "llama-3.2-1b", tuple(sh for sh, c in zip(shapes, counts, strict=True)
                                                      for _ in range(c)))
    wl = C.chain_workload(seq, batch, independent=True)
    s = C.build_schedule(wl, "graph")
    r = mkgpu.Runner(s)
    out = []
    try:
        errs, _ = r.check(watchdog_s)
        empty = cp.RawKernel(EMPTY_KERNEL, "mk_empty")
        record = _cp_timer(cp, r.stream)

        def capture(fns):
            r.stream.begin_capture()
            for f in fns:
                f()
            return r.stream.end_capture()

        def flush_fill(i):
            with r.stream:
                flush.fill(i)

        def wait(e1):
            _mk_wait(r, e1, watchdog_s, "a single kernel")

        def times(fn):
            return graph_times(fn, r.stream.synchronize, record, flush_fill, reps, wait)

        def launch_empty():
            with r.stream:
                empty((1,), (1,), ())

        launch_empty()  # compiled and loaded before any capture (a module load may not run in one)
        r.stream.synchronize()
        g_empty = capture([launch_empty])
        empty_us = times(lambda: g_empty.launch(r.stream))
        first = 0
        for (k, n), c in zip(shapes, counts, strict=True):
            ops = wl.ops[first:first + c]
            g_n = capture(r.launches[first:first + c])
            g_1 = capture(r.launches[first:first + 1])
            t_n = times(lambda g=g_n: g.launch(r.stream))
            t_1 = times(lambda g=g_1: g.launch(r.stream))
            t_e = times(r.launches[first])
            worst = max(errs[op.name] for op in ops)
            out.append(single_record("mksim", batch, k, n, int(s.graph.n_tiles[first]), t_n, t_1, t_e, empty_us, c,
                                     bool(worst <= REL_ERR_MAX), worst))
            first += c
        kernel = {"implementation": "mksim", "batch": batch, "name": "mk_chain", "block": [mkgpu.P.THREADS, 1, 1],
                  "registers": int(r.k_chain.num_regs), "smem_B": r.plan.smem_B,
                  "grid": "one block per tile of the op (singles' grid)"}
    finally:
        r.close()
    return out, kernel


# -- torch / cuBLAS ---------------------------------------------------------------------------------
def weights(shapes, batch: int, seed: int, device: str = "cuda"):
    """Random bf16 weights ``[N, K]`` (scaled by K^-0.5, so activations stay near 1) and an input."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    ws = [(torch.randn(n, k, device=device, generator=g) * k ** -0.5).to(torch.bfloat16) for k, n in shapes]
    x = torch.randn(batch, shapes[0][0], device=device, generator=g).to(torch.bfloat16)
    return ws, x


def rel_err(got, ref) -> float:
    """``|got - ref| / |ref|`` (torch tensors); inf where ``got`` is not finite."""
    import torch

    g, r = got.float(), ref.float()
    if not torch.isfinite(g).all():
        return float("inf")
    return (torch.linalg.vector_norm(g - r) / torch.linalg.vector_norm(r).clamp_min(1e-30)).item()


def torch_check(ws, x) -> float:
    """The largest relative error of one op of the chain against fp32 from the same input."""
    import torch
    import torch.nn.functional as F

    worst, y = 0.0, x
    for w in ws:
        got = F.linear(y, w)
        worst = max(worst, rel_err(got, (y.float() @ w.float().t()).to(torch.bfloat16)))
        y = got
    return worst


def torch_times(fn, flush, reps: int, watchdog_s: float) -> list[float]:
    """``reps`` cold runs of ``fn`` (after 3 warm ones), each between CUDA events on an idle GPU."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for i in range(reps):
        flush.fill_(i + 1)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        t0 = time.monotonic()
        while not e1.query():
            if time.monotonic() - t0 > watchdog_s:
                raise MksimError(f"a torch chain ran over {watchdog_s:g} s (hung)")
            time.sleep(2e-5)
        out.append(e0.elapsed_time(e1) * 1e3)
    return out


def torch_case(case: C.Case, flush, reps: int, watchdog_s: float) -> dict:
    import torch
    import torch.nn.functional as F

    shapes = C.SEQUENCES[case.sequence].shapes
    ws, x = weights(shapes, case.batch, seed=1)

    def step():
        y = x
        for w in ws:
            y = F.linear(y, w)
        return y

    err = torch_check(ws, x)
    fn = step
    if case.mode == "graph":
        g, out_g = torch_capture(torch, step)
        g.replay()
        eager = step().float()
        torch.cuda.synchronize()  # the replay's output is the eager chain's (cuBLAS may pick other kernels)
        err = max(err, rel_err(out_g, eager))
        fn = g.replay
    times = torch_times(fn, flush, reps, watchdog_s)
    return {**stats(times), "checked": bool(err <= REL_ERR_MAX), "rel_err": err}


def _torch_timer(torch):
    def record():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()

        def stop():
            e1.record()
            return e1
        return stop, lambda: e0.elapsed_time(e1) * 1e3
    return record


def _torch_wait(watchdog_s: float):
    def wait(e1) -> None:
        t0 = time.monotonic()
        while not e1.query():
            if time.monotonic() - t0 > watchdog_s:
                raise MksimError(f"a torch kernel ran over {watchdog_s:g} s (hung)")
            time.sleep(2e-5)
    return wait


def torch_capture(torch, fn):
    """``fn`` captured in a CUDA graph (warmed up on a side stream first, as torch asks): the graph
    and what ``fn`` returned while captured (its output buffers, which every replay rewrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    torch.cuda.synchronize()
    return g, out


def torch_graph(torch, fn):
    """``fn`` captured in a CUDA graph (:func:`torch_capture`), its output not needed."""
    return torch_capture(torch, fn)[0]


def torch_singles(batch: int, shapes: list[tuple[int, int]], flush, reps: int, watchdog_s: float) -> list[dict]:
    """Each shape as :func:`single_record` times it, with ``F.linear`` (cuBLAS): ``copies`` distinct
    weights in one graph, one alone, and a graph of one empty kernel (a one-element fill: torch
    launches no empty kernel)."""
    import torch
    import torch.nn.functional as F

    record, wait = _torch_timer(torch), _torch_wait(watchdog_s)

    def times(fn):
        return graph_times(fn, torch.cuda.synchronize, record, flush.fill_, reps, wait)

    z = torch.zeros(1, device="cuda")
    g_empty = torch_graph(torch, z.zero_)
    empty_us = times(g_empty.replay)
    out = []
    for k, n in shapes:
        c = copies_for(2 * k * n)
        ws, x = weights([(k, n)] * c, batch, seed=2)
        err = torch_check(ws[:1], x)
        g_n = torch_graph(torch, lambda ws=ws, x=x: [F.linear(x, w) for w in ws])
        g_1 = torch_graph(torch, lambda w=ws[0], x=x: F.linear(x, w))
        t_n, t_1 = times(g_n.replay), times(g_1.replay)
        t_e = times(functools.partial(F.linear, x, ws[0]))
        out.append(single_record("cublas", batch, k, n, None, t_n, t_1, t_e, empty_us, c,
                                 bool(err <= REL_ERR_MAX), err))
        del g_n, g_1, ws
    return out


def profile_kernels(batch: int, shapes: list[tuple[int, int]]) -> list[dict]:
    """Which kernels one ``F.linear`` of each shape launches (torch.profiler, after a warm-up):
    name, grid, block, registers, shared memory, duration. Each call is marked with a
    record_function range; a kernel belongs to the range its launch call lies in."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function

    pairs = []
    for k, n in shapes:
        ws, x = weights([(k, n)], batch, seed=3)
        for _ in range(3):
            F.linear(x, ws[0])
        pairs.append(((k, n), ws[0], x))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for (k, n), w, x in pairs:
            with record_function(f"chains:{k}x{n}"):
                F.linear(x, w)
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return kernels_from_trace(events, batch)


def kernels_from_trace(events: list[dict], batch: int) -> list[dict]:
    """The kernels of a chrome trace, each assigned to the ``chains:KxN`` range its launch lies in."""
    ranges = [(e["ts"], e["ts"] + e.get("dur", 0), e["name"].split(":", 1)[1]) for e in events
              if e.get("ph") == "X" and str(e.get("name", "")).startswith("chains:")
              and e.get("cat") in ("user_annotation", "cpu_op")]
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    out = []
    for e in events:
        if e.get("cat") != "kernel":
            continue
        a = e.get("args", {})
        ts = launch_ts.get(a.get("correlation"))
        shape = next((s for t0, t1, s in ranges if ts is not None and t0 <= ts <= t1), None)
        if shape is None:
            continue
        k, n = (int(v) for v in shape.split("x"))
        out.append({"implementation": "cublas", "batch": batch, "K": k, "N": n, "name": e["name"],
                    "grid": a.get("grid"), "block": a.get("block"), "registers": a.get("registers per thread"),
                    "smem_B": a.get("shared memory"), "duration_us": e.get("dur")})
    return out


# -- the run ----------------------------------------------------------------------------------------
CASE_KEYS = ("name", "sequence", "implementation", "mode", "trigger", "batch", "shapes", "n_ops", "n_kernels",
             "measured_us", "p10_us", "p90_us", "times_us", "checked", "rel_err")
DOC_KEYS = ("format", "gpu", "date", "commit", "sources", "command", "quick", "reps", "flush_B", "singles_method",
            "sequences", "cases", "singles", "kernels", "errors", "skipped")
SINGLE_KEYS = ("implementation", "batch", "K", "N", "weight_B", "grid", "method", "copies", "kernel_us", "alone_us",
               "measured_us", "graph_n", "graph_1", "event", "empty_graph_us", "checked", "rel_err")


def new_doc(seqs: list[str], quick: bool, reps: int) -> dict[str, Any]:
    """The raw file before any measurement (:data:`DOC_KEYS`)."""
    return {"format": FORMAT, "gpu": device_name(), "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "commit": commit(), "sources": sources(),
            "command": " ".join(["python -m validation", *sys.argv[1:]]),  # sys.argv[1] is the verb
            "quick": quick, "reps": reps, "flush_B": FLUSH_B, "singles_method": SINGLES_METHOD,
            "sequences": {s: {"model": C.SEQUENCES[s].model, "shapes": [list(x) for x in C.SEQUENCES[s].shapes],
                              "about": C.SEQUENCES[s].about} for s in seqs},
            "cases": [], "singles": [], "kernels": [], "errors": [], "skipped": []}


def case_record(case: C.Case) -> dict[str, Any]:
    """What a case's row says before its measurement is added (:data:`CASE_KEYS` once it is).
    ``n_kernels``: launches of the chain (one per op; cuBLAS may launch more per op: ``kernels``)."""
    shapes = C.SEQUENCES[case.sequence].shapes
    return {"name": case.name, "sequence": case.sequence, "implementation": case.implementation, "mode": case.mode,
            "trigger": case.trigger, "batch": case.batch, "shapes": [list(x) for x in shapes], "n_ops": len(shapes),
            "n_kernels": 1 if case.mode in ("megakernel", "persistent_barrier") else len(shapes)}


def device_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # no torch or no GPU: the first measurement says so
        return None


def run(out_dir: Path, timeout_s: float, quick: bool = False, reps: int | None = None,
        watchdog_s: float = 20.0, sequences: list[str] | None = None) -> dict:
    """Measure every case and the singles; write ``out_dir/chains.json`` after each step. Past
    ``timeout_s`` the rest is skipped (listed in ``skipped``); a hang ends the process (exit 3)
    with what was measured written."""
    import cupy as cp
    import torch

    t_start = time.monotonic()
    deadline = t_start + timeout_s
    reps = reps or (10 if quick else 25)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RAW
    seqs = sequences or (list(C.QUICK_SEQUENCES) if quick else list(C.SEQUENCES))
    doc = new_doc(seqs, quick, reps)
    lock = threading.Lock()

    def write() -> None:
        with lock:
            text = json.dumps(doc, separators=(",", ":"))
        path.write_text(text + "\n")

    def hung() -> None:  # the last resort: a kernel that the watchdogs did not stop
        doc["errors"].append(f"the run passed {timeout_s + 30:g} s; stopped")
        write()
        _log("error: the run hung; partial results written")
        os._exit(3)

    timer = threading.Timer(timeout_s + 30, hung)
    timer.daemon = True
    timer.start()
    flush_cp = cp.empty(FLUSH_B // 4, dtype=cp.float32)
    flush_t = torch.empty(FLUSH_B // 4, dtype=torch.float32, device="cuda")

    def left() -> bool:
        return time.monotonic() < deadline

    todo = C.case_list(seqs)
    for case in todo:
        if not left():
            doc["skipped"].append(case.name)
            continue
        t0 = time.monotonic()
        rec = case_record(case)
        try:
            res = (mk_case(case, flush_cp, reps, watchdog_s) if case.implementation == "mksim"
                   else torch_case(case, flush_t, reps, watchdog_s))
        except Exception as exc:  # one line per failed case; the others go on
            msg = f"{case.name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            doc["errors"].append(msg)
            _log(f"error: {msg}")
            continue
        finally:
            torch.cuda.empty_cache()
            cp.get_default_memory_pool().free_all_blocks()
        rec.update(res)
        with lock:
            doc["cases"].append(rec)
        _log(f"{case.name:38s} {rec['measured_us']:9.2f} us (p10 {rec['p10_us']:.2f}, p90 {rec['p90_us']:.2f}) "
             f"checked={rec['checked']} rel_err={rec['rel_err']:.1e}  [{time.monotonic() - t0:.1f} s]")
        write()

    chain_shapes = sorted({sh for s in seqs for sh in C.SEQUENCES[s].shapes})
    sweep = C.sweep_shapes(quick)
    for batch in C.BATCHES:
        shapes = list(dict.fromkeys(chain_shapes + sweep))
        mk_shapes = [sh for sh in shapes if C.fits_kernel([sh], batch)]
        for what in ("mksim singles", "cublas singles", "cublas kernels"):
            if not left():
                doc["skipped"].append(f"{what} b{batch}")
                continue
            t0 = time.monotonic()
            singles: list[dict] = []
            kernels: list[dict] = []
            try:
                if what == "mksim singles":
                    singles, kernel = mk_singles(batch, mk_shapes, flush_cp, reps, watchdog_s)
                    kernels = [kernel]
                elif what == "cublas singles":
                    singles = torch_singles(batch, shapes, flush_t, reps, watchdog_s)
                else:
                    kernels = profile_kernels(batch, shapes)
            except Exception as exc:
                msg = f"{what} b{batch}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
                doc["errors"].append(msg)
                _log(f"error: {msg}")
                continue
            finally:
                torch.cuda.empty_cache()
                cp.get_default_memory_pool().free_all_blocks()
            with lock:
                doc["singles"].extend(singles)
                doc["kernels"].extend(kernels)
            _log(f"{what} b{batch}: {len(singles)} singles, {len(kernels)} kernels [{time.monotonic() - t0:.1f} s]")
            write()
    timer.cancel()
    doc["wall_s"] = round(time.monotonic() - t_start, 1)
    write()
    _log(f"wrote {path}: {len(doc['cases'])} cases, {len(doc['singles'])} singles, {len(doc['kernels'])} kernels, "
         f"{len(doc['errors'])} errors, {len(doc['skipped'])} skipped, {doc['wall_s']} s")
    return doc

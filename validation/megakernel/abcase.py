"""One case of a generated kernel's A/B runs (``mk_speed``, ``moe_speed``, ``moe_ops``): its schedule built and
predicted, its kernel built with the case's defines, checked against torch, timed, and what the caller measures
beside the time; every failure one line in the record, never an exception.

:func:`run_case` fills a record in this order (the keys a run's JSON shows)::

    predicted_us                                      the simulator's µs (the caller's ``predict``)
    tasks                                             --dry-run only: the plan's task count, then return
    refused                                           the schedule or the kernel's build failed: return
    recycled_max_rel_err                              ``recycled`` (sentinel sync): the second check's worst
    ok, max_rel_err, worst_op, <checked(local)>       the check (every op's relative error <= ``rel_err_max``)
    <measured(runner, schedule, times)>               after ``reps`` timed steps: spread, trace, phases, ...
    failed, traceback                                 anything after the build raised
    wall_s                                            always, the case's seconds

The runner (:class:`validation.megakernel.gpu.Runner`) is built in :func:`runner` (the defines set while it
compiles) and always closed. :func:`precompile` builds many kernels at once first (cupy's cache), one child each.
"""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import gpu
from . import program as P

#: the seconds :func:`precompile` waits for its children
COMPILE_S = 240.0


def one_line(exc: BaseException) -> str:
    """An exception's message on one line, at most 300 characters."""
    return " ".join(str(exc).split())[:300]


def runner(s: Any, defines: str) -> Any:
    """The GPU runner of schedule ``s``, its kernel built with the extra ``defines`` (``MKSIM_KERNEL_DEFINES``)."""
    with gpu.kernel_defines(defines):
        return gpu.Runner(s)


def commit() -> str:
    """The checkout's commit (empty where git cannot tell)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def device() -> str:
    """The name of GPU 0 (empty without CuPy or a GPU)."""
    try:
        import cupy as cp

        return cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:
        return ""


def run_case(rec: dict[str, Any], make: Callable[[], Any], defines: str, dry: bool, *,
             predict: Callable[[Any], float], reps: int, watchdog_s: float,
             measured: Callable[[Any, Any, list[float]], dict[str, Any]], rel_err_max: float = 1e-2,
             recycled: bool = False, prepare: Callable[[Any], None] | None = None,
             checked: Callable[[dict[str, float]], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Fill ``rec`` (the module's docstring says in what order) for the schedule ``make()`` run with ``defines``:
    ``prepare(schedule)`` may refuse it before any build, ``checked(local)`` adds to the check's keys from every
    op's relative error, ``measured(runner, schedule, times)`` returns what is kept beside the ``reps`` times."""
    t0 = time.monotonic()
    try:
        s = make()
        rec["predicted_us"] = predict(s)
        if prepare is not None:
            prepare(s)
        if dry:
            rec["tasks"] = len(P.plan(s).program.tasks)
            return rec
        r = runner(s, defines)
    except Exception as exc:
        rec["refused"] = one_line(exc)
        return rec
    try:
        local, _ = r.check(watchdog_s)
        if recycled:  # and on the outputs that only the kernel reset (a sentinel step)
            again, _ = r.check_recycled(watchdog_s)
            rec["recycled_max_rel_err"] = max(again.values())
            local = {k: max(v, again[k]) for k, v in local.items()}
        worst = max(local, key=local.__getitem__)
        rec.update(ok=local[worst] <= rel_err_max, max_rel_err=local[worst], worst_op=worst)
        if checked is not None:
            rec.update(checked(local))
        times = r.time(reps, watchdog_s)
        rec.update(measured(r, s, times))
    except Exception as exc:
        rec["failed"] = one_line(exc)
        rec["traceback"] = traceback.format_exc()[-1500:]
    finally:
        r.close()
        rec["wall_s"] = round(time.monotonic() - t0, 1)
    return rec


def _compile_one(options: tuple[str, ...]) -> None:  # a child process: fills cupy's kernel cache
    import cupy as cp

    cp.RawModule(code=gpu.SOURCES[0].read_text(), options=options).get_function("mk_persistent")


def precompile(option_sets: list[tuple[str, ...]], timeout_s: float = COMPILE_S) -> dict:
    """Compile every option set at once, one child process each (NVRTC is single-threaded), so that the
    runners find their modules in cupy's cache. Children still running after ``timeout_s`` are ended
    (the runners then compile what is missing themselves)."""
    t0 = time.monotonic()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_compile_one, args=(o,)) for o in option_sets]
    for p in procs:
        p.start()
    for p in procs:
        p.join(max(0.0, timeout_s - (time.monotonic() - t0)))
    codes = []
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5)
        codes.append(p.exitcode)
    return {"builds": len(procs), "exit_codes": codes, "wall_s": round(time.monotonic() - t0, 1)}

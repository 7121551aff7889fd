"""Calibration: microbenchmarks that measure a GPU and write a calibrated hardware overlay.

``mksim calibrate`` (or ``python -m validation calibrate``) runs every benchmark in one process,
writes the raw results as JSON, fits the simulator's parameters and writes an overlay TOML that
extends the built-in model of that GPU. ``finish()`` redoes the fitting from saved raw files (any
machine, no GPU), merging several runs into one overlay with each value's spread.

The GPU side lives in :mod:`._gpu` (CuPy kernels from ``kernels.cu``, a C++ launch harness
``launch_bench.cu`` built with nvcc); the fitting is pure (:mod:`.fit`, :mod:`._params`).
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import hwmodels
from hwmodels.files import parse_json, read_bytes
from mksim.errors import MksimError
from validation.mechanisms.analysis import RawError
from validation.mechanisms.runner import BuildError, run_all

from ._gpu import Gpu, launch_harness
from ._params import RENAMED, Param, base_model, combine, overlay_text, params, run_to_run
from .plots import write_plots

T = TypeVar("T")
RAW_LIMIT_B = 256 << 20  # a raw calibration file holds a few MB of timings; past this it is not one

__all__ = ["NoGPUError", "base_model", "calibrate", "driver_string", "finish"]


class NoGPUError(MksimError):
    """No CUDA GPU or no CuPy on this machine."""


def _open_gpu(quick: bool):
    try:
        import cupy
    except ImportError:
        raise NoGPUError("mksim calibrate needs a CUDA GPU and CuPy, and CuPy is not installed here: "
                         "pip install 'mksim[gpu]' on a machine with an NVIDIA GPU") from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError and driver load failures alike
        raise NoGPUError(f"mksim calibrate needs a CUDA GPU and none is usable here ({exc})") from None
    if n < 1:
        raise NoGPUError("mksim calibrate needs a CUDA GPU and none is visible here")
    return Gpu(quick=quick)


def calibrate(out: Path | None = None, *, quick: bool = False, base: str | None = None,
              say: Callable[[str], None] = print) -> tuple[list[Param], dict[str, float]]:
    """Measure this machine's GPU; write ``<out>`` (the overlay, default ``./<base>-calibrated.toml``),
    ``<out stem>.raw.json``, a fits summary and plots beside it.

    Returns what :func:`finish` returns. Raises :class:`NoGPUError` without a GPU.
    """
    gpu = _open_gpu(quick)
    base = base or base_model(gpu.name)
    raw: dict = {"meta": {"device": gpu.name, "sms": gpu.sms, "l2_bytes": gpu.l2_B, "cc": gpu.cc,
                          "driver_version": gpu.driver, "runtime_version": gpu.runtime, "quick": quick,
                          "base": base, "host": platform.node(),
                          "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}
    say(f"calibrating {gpu.name} ({gpu.sms} SMs, L2 {gpu.l2_B / 2**20:.0f} MiB) against model {base!r}"
        f"{' (quick)' if quick else ''}")
    steps = [("launch", lambda: launch_harness(quick)), ("memory", gpu.bench_memory),
             ("latency", gpu.bench_latency), ("concurrency", gpu.bench_concurrency),
             ("boundary", gpu.bench_boundary), ("sync", gpu.bench_sync), ("compute", gpu.bench_compute),
             ("device_functions", gpu.bench_device_functions)]
    for name, fn in steps:
        t0 = time.perf_counter()
        raw[name] = fn()
        say(f"  {name:17s} {time.perf_counter() - t0:6.1f} s")
    if "launch" in raw:
        raw["meta"]["driver"] = driver_string(raw["launch"].get("driver_version", gpu.driver))
    out = Path(out) if out else Path(f"{base}-calibrated.toml")
    out.parent.mkdir(parents=True, exist_ok=True)
    raw_path = out.with_name(out.stem + ".raw.json")
    raw_path.write_text(json.dumps(raw, indent=1) + "\n")
    say(f"wrote {raw_path}")
    mech = _run_mechanisms(out.with_name(out.stem + "-mechanisms"), quick, say)
    return finish([raw_path], out, base=base, mechanisms=mech, say=say)


def out_stem_hint(folder: Path) -> str:
    """The raw file beside a mechanisms folder ``X-mechanisms``: ``X`` (for the hint a skipped fit prints)."""
    return str(folder)[: -len("-mechanisms")] if str(folder).endswith("-mechanisms") else str(folder)


def _run_mechanisms(folder: Path, quick: bool, say: Callable[[str], None]) -> Path | None:
    """The mechanism sweeps (validation.mechanisms: DRAM rate vs bytes in flight and load, bulk copies,
    the boundary under load) into ``folder``; None, said in one line, where they cannot run or fit
    (no nvcc, a sweep that failed, too few points with --quick)."""
    from validation.mechanisms import fit  # scipy: only when mechanisms are fitted

    t0 = time.perf_counter()
    try:
        run_all(folder, ["bw", "bwl1", "tma", "opb"], quick=quick, timeout_s=120.0, say=lambda _m: None)
        raws = {n: json.loads((folder / f"{n}.json").read_text()) for n in ("bw", "bwl1", "tma", "opb", "build")}
        dram = fit.fit_dram(raws["bw"], raws["bwl1"], raws["build"], 1000.0)  # a trial fit: is there enough?
        fit.fit_bulk_copy(raws["tma"])
        fit.fit_sync_load(raws["opb"], dram)
    except ImportError as exc:  # the fit needs scipy (the dev extra); the sweeps are kept for --from-raw
        say(f"  mechanisms        not fitted here ({exc}); fit them with: mksim calibrate --from-raw "
            f"{out_stem_hint(folder)}.raw.json --mechanisms {folder} --out ...")
        return None
    except (BuildError, RawError, OSError, KeyError, ValueError) as exc:
        say(f"  mechanisms        skipped: {str(exc).splitlines()[0]} (the overlay keeps a fixed per-SM cap)")
        return None
    say(f"  mechanisms        {time.perf_counter() - t0:6.1f} s ({folder})")
    return folder


def driver_string(v: int) -> str:
    """A CUDA driver API version (12080) as text ("CUDA 12.8"); nvidia-smi's driver when present."""
    text = f"CUDA {v // 1000}.{v % 1000 // 10}"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if smi.returncode == 0 and smi.stdout.strip():
            text = f"{smi.stdout.strip().splitlines()[0]}, {text}"
    except (OSError, subprocess.SubprocessError):
        pass
    return text


def finish(raw_paths: list[Path], out: Path, *, base: str | None = None, results_dir: Path | None = None,
           mechanisms: Path | None = None, poll: Path | None = None,
           say: Callable[[str], None] = print) -> tuple[list[Param], dict[str, float]]:
    """Fit saved raw results (one or several runs of one GPU) and write the overlay at ``out``;
    a ``<out stem>.fits.json`` summary and, with matplotlib, plots go to ``results_dir``
    (default: beside ``out``). Returns the combined parameters and the run-to-run spread of each.

    ``mechanisms``: a folder of :mod:`validation.mechanisms` sweeps of the same GPU; its DRAM and
    boundary mechanisms (:func:`mechanism_params`) replace the calibration's fixed per-SM cap;
    ``poll``: mech_bench's poll sweep (default: ``mechanisms/poll.json`` where there is one)."""
    raws = []
    for p in raw_paths:
        hint = "give a .raw.json that mksim calibrate wrote"
        try:  # regular files only (a FIFO would block), bounded, nesting checked
            raw = parse_json(read_bytes(p, limit=RAW_LIMIT_B, missing="no such file"), str(p))
        except MksimError as exc:
            raise MksimError(f"{p}: cannot read raw calibration results ({str(exc).removeprefix(f'{p}: ')}); "
                             f"{hint}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("meta"), dict) or "device" not in raw["meta"]:
            raise MksimError(f"{p}: cannot read raw calibration results (no meta.device); {hint}")
        raws.append(raw)
    devices = {r["meta"]["device"] for r in raws}
    if len(devices) > 1:
        raise MksimError(f"raw results come from different GPUs ({', '.join(sorted(devices))}); combine runs "
                         "of one GPU")
    meta = raws[0]["meta"]
    base = base or RENAMED.get(meta.get("base"), meta.get("base")) or base_model(meta["device"])
    spec = hwmodels.load(base)
    fitted = [params(r, spec.dram.bandwidth_spec_GBps) for r in raws]
    runs = [f[0] for f in fitted]
    combined = combine(runs)
    spread = run_to_run(runs)
    mech_source = None
    if mechanisms is not None:
        mech = mechanism_params(Path(mechanisms), spec_bandwidth_GBps=_reachable_GBps(combined, spec), poll=poll)
        keys = {p.key for p in mech}
        combined = [p for p in combined if p.key not in keys] + mech
        when = mechanism_date(Path(mechanisms))
        mech_source = (when if when != "undated" else meta["date"][:10], _relative(Path(mechanisms)))
    out = Path(out)
    _written(lambda: out.parent.mkdir(parents=True, exist_ok=True), out, "--out")
    date = meta["date"][:10]
    text = overlay_text(combined, base=base, name=out.stem, full_name=f"{spec.full_name} (calibrated {date})",
                        device=meta["device"], driver=meta.get("driver", str(meta.get("driver_version"))),
                        date=date, raw_files=[Path(p).name for p in raw_paths], mechanisms=mech_source)
    _written(lambda: out.write_text(text), out, "--out")
    hwmodels.load(out)  # the overlay must load: a value out of its range is reported here, once
    summary = {"overlay": out.name, "runs": [Path(p).name for p in raw_paths], "meta": meta,
               "params": {p.key: {"value": p.value, "spread": p.spread} for p in combined},
               "run_to_run": spread, "fits": [f[1] for f in fitted],
               "datasheet": {p.key: _base_value(spec, p.key) for p in combined}}
    results = Path(results_dir) if results_dir else out.parent
    fits = results / f"{out.stem}.fits.json"
    _written(lambda: results.mkdir(parents=True, exist_ok=True), results, "--results")
    _written(lambda: fits.write_text(json.dumps(summary, indent=1) + "\n"), fits, "--results")
    made = _written(lambda: write_plots(raws, [f[1] for f in fitted], results, out.stem), results, "--results")
    say(f"wrote {out}" + (f" and {len(made)} plots" if made else " (no plots: matplotlib is not installed)"))
    return combined, spread


def _written(write: Callable[[], T], path: Path, flag: str) -> T:
    """``write()``, whose OS error (a read-only file system, a full disk) becomes one line naming ``flag``."""
    try:
        return write()
    except OSError as exc:
        raise MksimError(f"{flag} {path}: cannot write ({exc.strerror or exc}); choose another path") from None


def _reachable_GBps(ps: list[Param], spec) -> float:
    """The chip's reachable DRAM bandwidth as calibrated (the datasheet's fraction where not)."""
    frac = next((p.value for p in ps if p.key == "memory.dram.reachable_fraction"), spec.dram.reachable_fraction)
    return spec.dram.bandwidth_spec_GBps * frac


def _relative(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (what an overlay's note names)."""
    root = Path(__file__).resolve().parents[2]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def mechanism_date(folder: Path) -> str:
    """The date of a mechanisms run: the first ``YYYY-MM-DD`` in its README.md (``"undated"`` if none)."""
    readme = folder / "README.md"
    found = re.search(r"\b(20\d\d-\d\d-\d\d)\b", readme.read_text(errors="replace")) if readme.exists() else None
    return found.group(1) if found else "undated"


def mechanism_params(folder: Path, spec_bandwidth_GBps: float, poll: Path | None = None) -> list[Param]:
    """The DRAM mechanism (stream latency, queue, SM port, L1 for loads; what the best kernel keeps
    in flight follows from them) and the sync-under-load share, fitted to the sweeps in ``folder``
    by :mod:`validation.mechanisms.fit` at the chip's reachable bandwidth; and the sentinel's lines
    from mech_bench's ``poll`` sweep, ``poll`` or ``folder/poll.json`` where there is one."""
    from validation.mechanisms import fit  # scipy: only when mechanisms are fitted

    def read(name: str) -> dict:
        path = folder / f"{name}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise MksimError(f"{path}: cannot read a mechanisms sweep ({exc}); give the folder "
                             "python -m validation mechanisms run wrote") from None

    dram = fit.fit_dram(read("bw"), read("bwl1"), read("build"), spec_bandwidth_GBps)
    rel = _relative(folder)
    note = (f"fit of the DRAM mechanism (stream latency, queue, SM port, L1 for loads) to {dram.points} points of "
            f"{rel} bw + bwl1 at {dram.reachable_GBps:.0f} GB/s reachable: MAPE {dram.mape_pct:.1f} % (" +
            ", ".join(f"{n} SMs {e:.1f} %" for n, e in dram.mape_by_sms.items()) + ")")
    out = [Param("memory.dram.stream_latency_ns", round(dram.stream_latency_ns, 1), 0.0, note, "mechanisms"),
           Param("memory.dram.queue_ns", round(dram.queue_ns, 1), 0.0, note, "mechanisms"),
           Param("memory.concurrency.per_sm_bandwidth_max_GBps", round(dram.per_sm_bandwidth_max_GBps, 1), 0.0,
                 note, "mechanisms"),
           Param("memory.concurrency.l1_load_KiB", round(dram.l1_load_KiB, 1), 0.0, note, "mechanisms"),
           Param("memory.concurrency.max_inflight_per_sm_KiB",
                 round(dram.per_sm_bandwidth_max_GBps * dram.stream_latency_ns / 1024, 1), 0.0,
                 "what the best kernel keeps in flight: enough for the SM port at the stream latency; a kernel "
                 "that keeps less is described by its implementation profile", "mechanisms")]
    bulk = fit.fit_bulk_copy(read("tma"))
    bulk_note = (f"tma sweep of {rel}: a bulk-copy pipeline of one block on one SM, stages of 4-32 KiB, depth >= 2 "
                 f"({bulk.points} points): time per stage = latency + bytes / rate (largest error "
                 f"{100 * bulk.max_rel_err:.1f} %); one copy in flight whatever the depth")
    out += [Param("chip.movement.bulk_copy_latency_ns", round(bulk.latency_ns, 1), 0.0, bulk_note, "mechanisms"),
            Param("chip.movement.bulk_copy_GBps", round(bulk.GBps, 1), 0.0, bulk_note, "mechanisms")]
    sync = fit.fit_sync_load(read("opb"), dram)
    out.append(Param("runtime.sync.load_share_fraction", round(sync.load_share_fraction, 3), 0.0,
                     f"opb sweep of {rel}: a counter boundary (release to the mean of first and last resume) takes "
                     f"{sync.idle_boundary_ns:.0f} ns idle, {sync.loaded_boundary_ns:.0f} ns while every SM streams "
                     f"({sync.background_GBps:.0f} GB/s, where the DRAM fit queues {sync.queue_delay_ns:.0f} ns): the "
                     "growth over that delay", "mechanisms"))
    poll = poll if poll is not None else (folder / "poll.json" if (folder / "poll.json").is_file() else None)
    if poll is not None:
        try:
            sp = fit.fit_sentinel_poll(json.loads(Path(poll).read_text()))
        except (OSError, ValueError) as exc:
            raise MksimError(f"{poll}: cannot read the poll sweep ({exc}); give the poll.json that "
                             "mech_bench poll wrote") from None
        prel = _relative(Path(poll).parent)

        def us(times: tuple[float, ...]) -> str:
            return ", ".join(f"{t:.1f}" for t in times)
        kib = "-".join(f"{k:g}" for k in (sp.sizes_KiB[0], sp.sizes_KiB[-1]))
        head = (f"mech_bench poll of {prel}: a producer block's plain stores of {kib} KiB to the other SMs' waiter "
                "warps seeing every byte (all polling the same bytes with the megakernel's loop)")
        fit_note = ("validation.mechanisms.fit.fit_sentinel_poll, relative least squares; largest miss "
                    f"{100 * sp.max_rel_err:.0f} %")
        out += [Param("runtime.sync.sentinel_latency_ns", round(sp.latency_ns, 1), 0.0,
                      f"{head}, chip idle: {us(sp.seen_us)} us; the line's intercept ({fit_note})", "mechanisms"),
                Param("runtime.sync.sentinel_poll_ns_per_KiB", round(sp.per_KiB_ns, 1), 0.0,
                      "the same sweep: the idle line's slope per KiB polled", "mechanisms"),
                Param("runtime.sync.sentinel_loaded_latency_ns", round(sp.loaded_latency_ns, 1), 0.0,
                      f"the same sweep while every other SM streams DRAM ({sp.background_GBps:.0f} GB/s): "
                      f"{us(sp.loaded_seen_us)} us; the line's intercept", "mechanisms"),
                Param("runtime.sync.sentinel_loaded_poll_ns_per_KiB", round(sp.loaded_per_KiB_ns, 1), 0.0,
                      "the same, loaded: the slope per KiB polled", "mechanisms")]
    return out


def _base_value(spec, dotted: str):
    """The base model's value of a data-file key (``memory.dram.latency_ns``), or None."""
    table, key = dotted.rsplit(".", 1)
    for attr, (tbl, _cls) in hwmodels.SECTIONS.items():
        if tbl == table:
            return getattr(getattr(spec, attr), key, None)
    return None

"""Calibration: microbenchmarks that measure a GPU and write a calibrated hardware overlay.

``mksim calibrate`` (or ``python -m validation.calibrate``) runs every benchmark in one process,
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
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import hwmodels
from mksim.errors import MksimError

from ._gpu import Gpu, launch_harness
from ._params import Param, base_model, combine, overlay_text, params, run_to_run
from .plots import write_plots

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
    return finish([raw_path], out, base=base, say=say)


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
           say: Callable[[str], None] = print) -> tuple[list[Param], dict[str, float]]:
    """Fit saved raw results (one or several runs of one GPU) and write the overlay at ``out``;
    a ``<out stem>.fits.json`` summary and, with matplotlib, plots go to ``results_dir``
    (default: beside ``out``). Returns the combined parameters and the run-to-run spread of each."""
    raws = []
    for p in raw_paths:
        try:
            raw = json.loads(Path(p).read_text())
            if not isinstance(raw, dict) or not isinstance(raw.get("meta"), dict) or "device" not in raw["meta"]:
                raise ValueError("no meta.device")
            raws.append(raw)
        except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise MksimError(f"{p}: cannot read raw calibration results ({exc}); give a .raw.json that "
                             "mksim calibrate wrote") from None
    devices = {r["meta"]["device"] for r in raws}
    if len(devices) > 1:
        raise MksimError(f"raw results come from different GPUs ({', '.join(sorted(devices))}); combine runs "
                         "of one GPU")
    meta = raws[0]["meta"]
    base = base or meta.get("base") or base_model(meta["device"])
    spec = hwmodels.load(base)
    fitted = [params(r, spec.dram.bandwidth_spec_GBps) for r in raws]
    runs = [f[0] for f in fitted]
    combined = combine(runs)
    spread = run_to_run(runs)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    date = meta["date"][:10]
    text = overlay_text(combined, base=base, name=out.stem, full_name=f"{spec.full_name} (calibrated {date})",
                        device=meta["device"], driver=meta.get("driver", str(meta.get("driver_version"))),
                        date=date, raw_files=[Path(p).name for p in raw_paths])
    out.write_text(text)
    hwmodels.load(out)  # the overlay must load: a value out of its range is reported here, once
    summary = {"overlay": out.name, "runs": [Path(p).name for p in raw_paths], "meta": meta,
               "params": {p.key: {"value": p.value, "spread": p.spread} for p in combined},
               "run_to_run": spread, "fits": [f[1] for f in fitted],
               "datasheet": {p.key: _base_value(spec, p.key) for p in combined}}
    results = Path(results_dir) if results_dir else out.parent
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{out.stem}.fits.json").write_text(json.dumps(summary, indent=1) + "\n")
    made = write_plots(raws, [f[1] for f in fitted], results, out.stem)
    say(f"wrote {out}" + (f" and {len(made)} plots" if made else " (no plots: matplotlib is not installed)"))
    return combined, spread


def _base_value(spec, dotted: str):
    """The base model's value of a data-file key (``memory.dram.latency_ns``), or None."""
    table, key = dotted.rsplit(".", 1)
    for attr, (tbl, _cls) in hwmodels.SECTIONS.items():
        if tbl == table:
            return getattr(getattr(spec, attr), key, None)
    return None

"""Build mech_bench.cu with nvcc and run its sweeps, each under a host-side timeout.

Only the standard library: this runs on the device machine, whose Python lacks mksim's dependencies.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "mech_bench.cu"
NVCC_FLAGS = ("-O3", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v")


class BuildError(RuntimeError):
    """nvcc is missing or failed."""


def nvcc_command(binary: Path, source: Path = SOURCE) -> list[str]:
    """The exact nvcc command that builds ``binary`` (recorded beside the results)."""
    return ["nvcc", *NVCC_FLAGS, "-o", str(binary), str(source)]


def build(out_dir: Path) -> tuple[Path, str]:
    """Compile mech_bench into ``out_dir``; return the binary and ptxas's resource report."""
    if shutil.which("nvcc") is None:
        raise BuildError("nvcc not found on PATH")
    binary = out_dir / "mech_bench"
    cmd = nvcc_command(binary)
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise BuildError(f"nvcc failed: {r.stderr.strip()[-2000:]}")
    return binary, " ".join(cmd) + "\n" + r.stderr


def ptxas_registers(report: str) -> dict[str, int]:
    """Registers per kernel from ``nvcc -Xptxas -v`` output (mangled names).

    >>> ptxas_registers("ptxas info    : Compiling entry function '_Z1kv' for 'sm_90'\\n"
    ...                 "ptxas info    : Used 32 registers, used 0 barriers")
    {'_Z1kv': 32}
    """
    out: dict[str, int] = {}
    fn = None
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            fn = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and fn:
            out[fn] = int(m.group(1))
            fn = None
    return out


def ldg_runs(sass: str) -> dict[str, int]:
    """Per function of a ``cuobjdump --dump-sass`` listing, the longest run of global loads issued
    before any logic instruction consumes one (LOP3/LOP): the loads one thread keeps in flight.

    >>> ldg_runs("Function : k\\n /*0010*/ LDG.E.128 R4, desc[UR4][R2.64] ;\\n"
    ...          " /*0020*/ IADD3 R2, R2, 0x10, RZ ;\\n /*0030*/ LDG.E.128 R8, desc[UR4][R2.64] ;\\n"
    ...          " /*0040*/ LOP3.LUT R0, R4, R5, R6, 0x96, !PT ;\\n")
    {'k': 2}
    """
    out: dict[str, int] = {}
    fn, run = None, 0
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            fn, run = m.group(1), 0
            out[fn] = 0
            continue
        if fn is None:
            continue
        if re.search(r"\bLDG\.", line):
            run += 1
            out[fn] = max(out[fn], run)
        elif re.search(r"\bLOP3?\b|\bLOP3\.", line):
            run = 0
    return out


def sass_loads(binary: Path) -> dict[str, int]:
    """``ldg_runs`` of the built binary, or {} where cuobjdump is absent."""
    if shutil.which("cuobjdump") is None:
        return {}
    r = subprocess.run(["cuobjdump", "--dump-sass", str(binary)], check=False, capture_output=True, text=True,
                       timeout=120)
    return ldg_runs(r.stdout) if r.returncode == 0 else {}


def run_sweep(binary: Path, sweep: str, quick: bool, timeout_s: float) -> dict[str, Any]:
    """Run one sweep; its JSON, or ``{"sweep": ..., "error": ...}`` when it fails or times out."""
    cmd = [str(binary), sweep] + (["--quick"] if quick else [])
    try:
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"sweep": sweep, "error": f"timed out after {timeout_s:.0f} s"}
    if r.returncode != 0:
        return {"sweep": sweep, "error": f"exit {r.returncode}: {r.stderr.strip()[-1000:]}"}
    try:
        data = json.loads(r.stdout)
    except json.JSONDecodeError as e:
        return {"sweep": sweep, "error": f"unparsable output ({e}): {r.stdout[:200]!r}"}
    data["command"] = " ".join(["mech_bench", sweep] + (["--quick"] if quick else []))
    return data


def run_all(out: Path, sweeps: list[str], quick: bool = False, timeout_s: float = 120.0,
            say: Callable[[str], None] = print) -> Path:
    """Build mech_bench and run ``sweeps`` into ``out`` (``build.json`` and one ``<sweep>.json`` each);
    ``mksim calibrate`` calls this too. Raises :class:`BuildError` without nvcc."""
    out.mkdir(parents=True, exist_ok=True)
    binary, report = build(out)
    made = {"nvcc": " ".join(nvcc_command(Path("mech_bench"))), "registers": ptxas_registers(report),
            "sass_loads_in_flight": sass_loads(binary)}
    (out / "build.json").write_text(json.dumps(made, separators=(",", ":")) + "\n")
    for sweep in sweeps:
        t0 = time.time()
        data = run_sweep(binary, sweep, quick, timeout_s)
        (out / f"{sweep}.json").write_text(json.dumps(data, separators=(",", ":")) + "\n")
        say(f"{sweep}: {data.get('error', 'ok')} ({time.time() - t0:.1f} s)")
    binary.unlink()  # keep only results under out
    return out

"""The CUDA builds the tests check, compiled once per run, two at a time, and kept between runs.

Each build of ``mk_kernel.cu`` takes ~20 s of one core with nvcc (it is single-threaded). The tests that
check a build (it compiles for sm_90; the persistent kernel does not spill) ask :func:`build` for it by
name: the first ask starts every build of :data:`BUILDS` on a pool of :data:`WORKERS` threads, and a
build whose inputs were built before (same nvcc, flags and sources: a SHA-256 over them) is read back
from ``$MKSIM_TEST_CACHE`` (default ``~/.cache/mksim/test-nvcc``) instead of compiled again. What is
kept is nvcc's exit status and its messages (``-Xptxas -v``: registers and spills), as JSON.

Several test processes (pytest-xdist's workers, two test runs at once) share the cache: a build takes
a lock file beside its entry, so a second process waits for the first one's result and reads it
instead of compiling the same build again, and each xdist worker starts the list at its own place, so
that two workers that both need builds compile different ones first.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc")
WORKERS = max(1, min(4, os.cpu_count() or 1))
MK = "validation/megakernel/mk_kernel.cu"
#: name -> (source, flags beyond the runner's own): every build a test checks
BUILDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mk": (MK, ()),
    "mk-consumers16": (MK, ("-DMK_CONSUMERS=16",)),
    "mk-l2pf1": (MK, ("-DMK_L2PF_KIND=1",)),
    "mk-l2pf2": (MK, ("-DMK_L2PF_KIND=2",)),
    "mk-sentinel-nofence": (MK, ("-DMK_SENTINEL_FENCE=0", "-DMK_POLL_SLEEP_NS=100", "-DMK_POLL_BATCH=8")),
    "mk-attn1": (MK, ("-DMK_ATTN=1",)),
    "mk-moe-old": (MK, ("-DMK_MOE_EARLY=0", "-DMK_MOE_L2PF_B=0")),  # the MoE expert stream as first measured
    "mk-moe-ftopk": (MK, ("-DMK_MOE_FTOPK=1",)),  # the top-k run by its router's last task (moe_speed2)
    # mk_speed's variants: the L2 prefetcher gated to the phases that stream nothing, the publisher's release
    # fence, relaxed polls with one acquire fence, the sentinel's acq_rel fence (the default before h200-mk-speed)
    "mk-l2gate1": (MK, ("-DMK_L2PF_GATE=1",)),
    "mk-l2gate2": (MK, ("-DMK_L2PF_GATE=2",)),
    "mk-pubfence": (MK, ("-DMK_PUB_FENCE=1",)),
    "mk-waitacq": (MK, ("-DMK_WAIT_ACQ=1",)),
    "mk-sentinel-acqrel": (MK, ("-DMK_SENTINEL_FENCE=1",)),
    # one attention instance each (program.attn_defines): MHA at head sizes 128 and 64, Qwen2.5-7B's group
    # of 7, qwen3-30b-a3b's of 8, head sizes 80 and 96 (rows of 10 and 12 chunks) and 256; and the instances of
    # the models validation/results/h200-attn-2 runs: Phi-3-mini's MHA at 96, Falcon3's 256 in groups of 2,
    # Qwen3-1.7B's 128 in groups of 2
    "mk-attn-128x1": (MK, ("-DMK_ATTN_HD=128", "-DMK_ATTN_G=1")),
    "mk-attn-64x1": (MK, ("-DMK_ATTN_HD=64", "-DMK_ATTN_G=1")),
    "mk-attn-128x7": (MK, ("-DMK_ATTN_HD=128", "-DMK_ATTN_G=7")),
    "mk-attn-128x8": (MK, ("-DMK_ATTN_HD=128", "-DMK_ATTN_G=8")),
    "mk-attn-80x4": (MK, ("-DMK_ATTN_HD=80", "-DMK_ATTN_G=4")),
    "mk-attn-96x2": (MK, ("-DMK_ATTN_HD=96", "-DMK_ATTN_G=2")),
    "mk-attn-256x1": (MK, ("-DMK_ATTN_HD=256", "-DMK_ATTN_G=1")),
    "mk-attn-96x1": (MK, ("-DMK_ATTN_HD=96", "-DMK_ATTN_G=1")),
    "mk-attn-256x2": (MK, ("-DMK_ATTN_HD=256", "-DMK_ATTN_G=2")),
    "mk-attn-128x2": (MK, ("-DMK_ATTN_HD=128", "-DMK_ATTN_G=2")),
    "calibrate-kernels": ("validation/calibrate/kernels.cu", ()),
    "launch-bench": ("validation/calibrate/launch_bench.cu", ()),
}


@dataclass(frozen=True)
class Build:
    returncode: int
    stderr: str


def _flags(extra: tuple[str, ...]) -> list[str]:
    from validation.megakernel.gpu import compile_options

    # as the runner passes them, with the worker warps left to the kernel's default unless a build sets them
    return ["-arch=sm_90", *(f for f in compile_options() if not f.startswith("-DMK_CONSUMERS")), "-Xptxas", "-v",
            *extra]


def _key(source: str, flags: list[str]) -> str:
    h = hashlib.sha256()
    h.update(subprocess.run([NVCC or "nvcc", "--version"], capture_output=True, text=True).stdout.encode())
    # the flags name the checkout's include folder: keyed without it, a clone elsewhere finds the builds
    h.update("\0".join([source, *flags]).replace(str(ROOT), "<root>").encode())
    for p in sorted(ROOT.joinpath("validation").rglob("*")):  # the source and everything it may include
        if p.suffix in (".cu", ".cuh", ".h", ".hpp") and p.is_file():
            h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _cache_dir() -> Path:
    return Path(os.environ.get("MKSIM_TEST_CACHE") or Path.home() / ".cache" / "mksim" / "test-nvcc")


def _read(kept: Path) -> Build | None:
    try:
        d = json.loads(kept.read_text())
        return Build(int(d["returncode"]), str(d["stderr"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _nvcc(source: str, flags: list[str]) -> Build:
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([NVCC or "nvcc", *flags, "-c", str(ROOT / source), "-o", str(Path(tmp) / "out.o")],
                           capture_output=True, text=True, timeout=600)
    return Build(r.returncode, r.stderr)


def _compile(name: str) -> Build:
    source, extra = BUILDS[name]
    flags = _flags(extra)
    kept = _cache_dir() / f"{name}-{_key(source, flags)}.json"
    got = _read(kept)
    if got is not None:
        return got
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        lock = open(kept.with_suffix(".lock"), "a")  # held until the entry is written
    except OSError:
        return _nvcc(source, flags)  # no cache: the next run compiles again
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building the same: wait, then read its result
        got = _read(kept)
        if got is not None:
            return got
        got = _nvcc(source, flags)
        try:
            tmp_file = kept.with_suffix(f".{os.getpid()}.tmp")
            tmp_file.write_text(json.dumps({"returncode": got.returncode, "stderr": got.stderr}))
            tmp_file.replace(kept)
        except OSError:
            pass  # no cache: the next run compiles again
    return got


def _order() -> list[str]:
    """:data:`BUILDS` from this xdist worker's place in it (``gw1`` of two starts half-way), so that
    workers compiling at the same time start on different builds."""
    names = list(BUILDS)
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", "gw0"), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    try:
        start = int(worker.removeprefix("gw")) * len(names) // max(1, int(count))
    except ValueError:
        start = 0
    return names[start:] + names[:start]


_pool: ThreadPoolExecutor | None = None
_futures: dict[str, Future[Build]] = {}


def build(name: str) -> Build:
    """The build ``name`` of :data:`BUILDS` (nvcc's exit status and messages); the first call starts them all."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="nvcc")
        for n in _order():
            _futures[n] = _pool.submit(_compile, n)
    return _futures[name].result()

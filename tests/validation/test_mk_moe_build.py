"""The MoE device functions' build and algorithm, on CPU: the top-k's keys (mk_topk in mk_ops.cuh)
emulated in numpy pick what the torch reference picks, ties and signed zeros included; and, with
--nvcc, the top-k and combine compile to few instructions (each task fetches its code cold: see the
comment above mk_topk), and the default build's persistent kernel does not spill more than before."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from validation.megakernel import program as P
from validation.megakernel.encode import opcode_defines

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "validation" / "kernels"
NVCC = shutil.which("nvcc")
REGS = 4  # MK_TOPK_REGS in mk_ops.cuh


def _key(u: int, e: int) -> int:
    """mk_topk_key: the bf16 bits u made order-preserving (-0 as +0) above 0xFFFF - e."""
    o = 0x8000 if u == 0x8000 else ((~u & 0xFFFF) if u & 0x8000 else (u | 0x8000))
    return (o << 16) | (0xFFFF - e)


def _logit(key: int) -> float:
    o = key >> 16
    bits = (o & 0x7FFF) if o & 0x8000 else (~o & 0xFFFF)
    return float(np.array([bits << 16], dtype=np.uint32).view(np.float32)[0])


def emulate_topk(bits: np.ndarray, k: int, C: int, sigmoid: bool = False, norm: bool = True) -> np.ndarray:
    """mk_topk's route table for logits given as bf16 bits [T, N], as the device computes it (a warp per
    token: its 32 lanes' keys, k warp maxima; fp32 arithmetic in the device's order)."""
    T, N = bits.shape
    f32 = np.float32
    sel = np.zeros((T, k), dtype=np.int64)
    wts = np.zeros((T, k), dtype=f32)
    for b in range(T):
        keys = np.zeros((32, REGS), dtype=np.int64)
        for lane in range(32):
            for j in range(REGS):
                e = lane + 32 * j
                keys[lane, j] = _key(int(bits[b, e]), e) if e < N else 0
        m = f32(_logit(int(keys.max())))
        lane_s = np.zeros(32, dtype=f32)
        for lane in range(32):
            for j in range(REGS):
                if lane + 32 * j < N:
                    lane_s[lane] = f32(lane_s[lane] + f32(np.exp(f32(f32(_logit(int(keys[lane, j]))) - m))))
        for off in (16, 8, 4, 2, 1):  # mk_warp_sum's butterfly
            lane_s = (lane_s + lane_s[np.arange(32) ^ off]).astype(f32)
        S, total = lane_s[0], f32(0)
        for i in range(k):
            top = int(keys.max())
            best = f32(_logit(top))
            p = f32(1) / f32(1 + np.exp(-best)) if sigmoid else f32(f32(np.exp(f32(best - m))) / S)
            total = f32(total + p)
            sel[b, i], wts[b, i] = 0xFFFF - (top & 0xFFFF), p
            keys[keys == top] = 0
        if norm:
            wts[b] = (wts[b] / total).astype(f32)
    active = sorted(set(sel.ravel().tolist()))
    slot = {e: s for s, e in enumerate(active)}
    experts = active + [-1] * (C - len(active))
    return np.array([len(active), *experts, *[slot[e] for e in sel.ravel()], *wts.ravel()], dtype=f32)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("T, N, k", [(1, 128, 8), (8, 128, 8), (1, 64, 8), (8, 64, 8), (1, 8, 2), (8, 8, 2),
                                     (3, 100, 6), (2, 33, 32)])
@pytest.mark.parametrize("sigmoid", [False, True])
def test_the_key_top_k_picks_what_the_reference_picks(T, N, k, sigmoid):
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    rng = np.random.default_rng(N * 31 + T * 7 + k)
    x = rng.standard_normal((T, N)).astype(np.float32)
    x[:, rng.integers(0, N, size=3)] = x[:, :1]  # ties with expert 0 ...
    x[0, N // 2] = -0.0  # ... signed zeros, which compare equal
    x[0, N // 3] = 0.0
    x[T - 1] = np.round(x[T - 1])  # many ties, zeros among them
    bits = _bf16_bits(x)
    C = min(N, T * k)
    row = {"K": k, "pos": C, "T": T, "opt": (P.TOPK_SIGMOID if sigmoid else 0) | P.TOPK_NORM}
    logits = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
    ref = reference.REFERENCES["topk"](None, None, row, [logits]).numpy()
    got = emulate_topk(bits, k, C, sigmoid=sigmoid)
    ids = 1 + C + T * k
    assert got[:ids].tolist() == ref[:ids].tolist()  # count, slots' experts, tokens' slots: exactly
    assert np.abs(got[ids:] - ref[ids:]).max() < 1e-6


# -- with --nvcc: the functions' code and the persistent kernel's spills ---------------------------

def _func_sizes(cubin: bytes) -> dict[str, int]:
    """Symbol name -> size of every function in an ELF64 cubin (its .symtab)."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    out = {}
    for _name, typ, _f, _a, off, size, link, _i, _al, entsize in secs:
        if typ != 2:  # SHT_SYMTAB
            continue
        stroff = secs[link][4]
        for s in range(off, off + size, entsize):
            st_name, st_info, _o, _sh, _v, st_size = struct.unpack_from("<IBBHQQ", cubin, s)
            if st_info & 0xF == 2:  # STT_FUNC
                end = cubin.index(b"\0", stroff + st_name)
                out[cubin[stroff + st_name:end].decode()] = st_size
    return out


def _nvcc(tmp: Path, source: str, extra: tuple[str, ...] = ()) -> tuple[dict[str, int], str]:
    src = tmp / "moe_fns.cu"
    src.write_text(source)
    out = tmp / "moe_fns.cubin"
    r = subprocess.run([NVCC or "nvcc", "-arch=sm_90", "-std=c++17", f"-I{KERNELS}", *opcode_defines(), *extra,
                        "-Xptxas", "-v", "-cubin", str(src), "-o", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return _func_sizes(out.read_bytes()), r.stderr


MOE_FNS = """#include "mk_ops.cuh"
extern "C" __global__ void kt(const MkOp* o, float* s) { mk_topk(o, threadIdx.x, 256, s); }
extern "C" __global__ void kc(const MkOp* o, float* s) { mk_combine(o, 0, 64, threadIdx.x, 256, s); }
"""


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.nvcc
def test_the_moe_functions_are_small(tmp_path):
    """nvcc 13.0 today: top-k 8.7 KB (v1: 29.9 KB), combine 4.8 KB (v1: 6.9 KB in this build, 8.3 KB in the
    persistent kernel). The bounds leave room for another compiler, not for the unrolled loops of v1."""
    sizes, _ = _nvcc(tmp_path, MOE_FNS)
    size = {name: next(v for n, v in sizes.items() if re.search(rf"_Z\d+{name}P", n))
            for name in ("mk_topk", "mk_combine")}
    assert size["mk_topk"] <= 12 * 1024, size
    assert size["mk_combine"] <= 6 * 1024, size
    old, _ = _nvcc(tmp_path, MOE_FNS, ("-DMK_MOE_V1=1",))  # the first versions, for the A/B runs: still build
    assert any("mk_topk_v1" in n for n in old) and any("mk_combine_v1" in n for n in old)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.slow
@pytest.mark.nvcc
def test_the_old_expert_stream_still_builds_for_the_ab_runs():
    """validation.megakernel.moe_speed times the build of -DMK_MOE_EARLY=0 -DMK_MOE_L2PF_B=0 (the expert
    rows streamed once their task's dependencies are met, no L2 asks) against the default, and moe_speed2
    the top-k run by its router's last task (-DMK_MOE_FTOPK=1); all build, and none spills more than the
    default build may (test_sentinel)."""
    from tests.validation import nvcc_builds

    for name in ("mk", "mk-moe-old", "mk-moe-ftopk"):
        r = nvcc_builds.build(name)
        assert r.returncode == 0, r.stderr
        persistent = r.stderr.split("Function properties for mk_persistent")[1].splitlines()[1]
        assert int(re.search(r"(\d+) bytes spill stores", persistent).group(1)) <= 16, persistent

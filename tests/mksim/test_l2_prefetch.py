"""The L2 prefetcher of a persistent kernel (``Options.l2_prefetch_KiB``), as closed-form stories
(docs/model.md, "Mechanisms"; times in µs).

Toy GPU (tests/mksim/simkit.py): 2 SMs, DRAM 1e6 B/µs shared, 1 µs DRAM latency, launch 1 µs, a
counter seen 0.5 µs after its release; an SM draws up to 1e6 B/µs, from DRAM or from L2 (L2 latency
0.02 µs). A step of two ops: ``w`` keeps both SMs busy for 10 µs without touching DRAM (RoPE,
attention or SiLU in a real step), then ``m`` streams 1e6 bytes per SM. The loader's ring holds one
64 KiB page.
"""

from __future__ import annotations

import pytest

import hwmodels
import mksim
from mksim.errors import ScheduleError
from mksim.workload import Input, Op, Tiling, Workload

from .simkit import TOY

TOL = 2e-3
PAGE = 65536                         # bytes of the ring
BODY = 1e6 - PAGE                    # what m streams per SM after its page
T_M = 1 + 10 + 0.02 + 0.5            # m starts: launch, w's 10 µs and its L2 latency, the counter


def _gpu(tmp_path, l2_MiB: float | None = None) -> hwmodels.GPUSpec:
    text = TOY.format(cap=1000)
    if l2_MiB is not None:
        text = text.replace("[memory.l2]", f'[memory.l2]\nsize_MiB = {{ value = {l2_MiB}, source = "t" }}')
    p = tmp_path / f"toy-l2-{l2_MiB}.toml"
    p.write_text(text)
    return hwmodels.load(p)


def _step() -> Workload:
    w = Op(name="w", kind="elementwise", out_size=2, elem_bytes=1e-6, flops=1e11, align=1)  # 10 µs per SM
    m = Op(name="m", kind="matmul", out_size=2, elem_bytes=1e-6, flops=1.0, weight_bytes=2e6,
           inputs=(Input("w", full=True),), align=1)
    return Workload(name="small op, then a matvec", ops=(w, m), tokens=1)


def _run(gpu, lead_KiB: float) -> mksim.SimResult:
    s = mksim.build_schedule(_step(), gpu, "megakernel", tiling=Tiling(default=2), policy="rr", prefetch_depth=1,
                             page_KiB=PAGE / 1024, l2_prefetch_KiB=lead_KiB)
    return mksim.simulate(s)


def test_without_the_prefetcher_the_rest_of_m_streams_after_w(tmp_path):
    """The ring's page comes in during w; the rest of m only once m starts: the DRAM latency, then
    its bytes at half the chip each."""
    r = _run(_gpu(tmp_path), 0)
    assert r.latency_us == pytest.approx(T_M + 1 + BODY / 5e5, abs=TOL)
    assert r.dram_bytes == pytest.approx(2e6)


def test_the_prefetcher_reads_m_during_w_and_m_streams_from_l2(tmp_path):
    """With 1 MiB of lead each SM's prefetcher asks for the rest of m as the kernel starts (two
    flows of half the lead, sharing DRAM with the pages: all in by t = 4, well within w); m then
    reads it from L2: the L2 latency, then its bytes at the SM's 1e6 B/µs instead of half the chip.
    DRAM moves the same bytes."""
    r = _run(_gpu(tmp_path), 1024)
    assert r.latency_us == pytest.approx(T_M + 0.02 + BODY / 1e6, abs=TOL)
    assert r.dram_bytes == pytest.approx(2e6)


def test_what_the_l2_cannot_hold_is_read_twice(tmp_path):
    """With a 0.5 MiB L2, the first prefetched half-lead (524288 B per SM) is pushed out by the
    second (410176 B per SM on each of the 2 SMs arrive after it), which stays: m reads 410176 B
    from L2 and the other 524288 B from DRAM again, after the DRAM latency."""
    r = _run(_gpu(tmp_path, l2_MiB=0.5), 1024)
    second = BODY - 524288
    assert r.latency_us == pytest.approx(T_M + 1 + second / 1e6 + 524288 / 5e5, abs=TOL)
    assert r.dram_bytes == pytest.approx(2e6 + 2 * 524288)


def test_a_lead_smaller_than_m_leaves_the_rest_to_dram(tmp_path):
    """With 256 KiB of lead, m finds 256 KiB of its body in L2 (read first) and streams the rest."""
    r = _run(_gpu(tmp_path), 256)
    lead = 256 * 1024
    assert r.latency_us == pytest.approx(T_M + 1 + lead / 1e6 + (BODY - lead) / 5e5, abs=TOL)
    assert r.dram_bytes == pytest.approx(2e6)


@pytest.mark.parametrize(("mode", "opts", "msg"), [
    ("graph", {}, "needs a persistent mode .* not graph"),
    ("megakernel", {"dispatch": "dynamic"}, "with static queues, not megakernel with dispatch=dynamic"),
])
def test_the_prefetcher_needs_static_queues(mode, opts, msg):
    with pytest.raises(ScheduleError, match=msg) as exc:
        mksim.build_schedule("llama-3.2-1b", "h200-datasheet", mode, l2_prefetch_KiB=256, **opts)
    assert "\n" not in str(exc.value)


def test_a_negative_lead_is_refused():
    with pytest.raises(ScheduleError, match="l2_prefetch_KiB must be >= 0, got -1"):
        mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel", l2_prefetch_KiB=-1)

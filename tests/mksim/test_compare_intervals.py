"""How sure a comparison is: intervals from the profiles' validation records."""

from __future__ import annotations

import io

import pytest
from rich.console import Console, RenderableType

import hwmodels
from mksim.compare import (
    TRANSFER_WIDENING,
    compare_modes,
    family_of,
    interval_basis,
    latency_interval,
    speedup_interval,
    verdict,
)
from mksim.tables import TABLE_WIDTH, compare_table, interval_line, stack_line


def render(r: RenderableType) -> str:
    c = Console(width=200, record=True, file=io.StringIO())  # wide: the lines must wrap themselves
    c.print(r)
    return "\n".join(line.rstrip() for line in c.export_text().splitlines())


def test_latency_interval_is_closed_form():
    # error (p - m) / m within ±25 %: m = p / (1 ± 0.25)
    assert latency_interval(100.0, 25.0) == [80.0, 133.33]
    assert latency_interval(100.0, 0.0) == [100.0, 100.0]
    assert latency_interval(100.0, 100.0) == [50.0, None]     # no upper end at 100 % or more
    assert latency_interval(100.0, None) is None


def test_speedup_interval_takes_the_far_ends():
    # stack 80..120 over megakernel 40..50: slowest megakernel vs fastest stack, and the other way
    assert speedup_interval([80.0, 120.0], [40.0, 50.0]) == [1.6, 3.0]
    assert speedup_interval([80.0, None], [40.0, 50.0]) == [1.6, None]
    assert speedup_interval([80.0, 120.0], [40.0, None]) == [0.0, 3.0]
    assert speedup_interval(None, [40.0, 50.0]) is None and speedup_interval([1.0, 2.0], None) is None


@pytest.mark.parametrize("x, iv, want", [
    (1.3, [0.95, 1.8], "tie"), (1.3, [1.01, 1.8], "faster"), (0.7, [0.5, 0.99], "slower"),
    (0.9, [0.5, 1.0], "tie"), (1.5, [1.2, None], "faster"), (1.5, [0.0, None], "tie"),
    (1.5, None, "faster (interval unknown)"), (0.5, None, "slower (interval unknown)"),
])
def test_verdict_says_tie_when_the_interval_holds_one(x, iv, want):
    assert verdict(x, iv) == want


def test_the_half_width_is_the_profiles_p90_on_its_own_gpu_and_wider_on_another():
    p90 = hwmodels.profile_info("torch")["validation"]["p90_abs_pct"]
    home = interval_basis(hwmodels.load("h200-calibrated+torch"))
    assert (home["half_width_pct"], home["transfer"]) == (p90, False) and "unvalidated" not in home["text"]
    assert interval_basis(hwmodels.load("h200-mk-kernels"))["transfer"] is False   # an overlay of h200-calibrated
    for gpu in ("h100", "b200", "h200-datasheet"):
        moved = interval_basis(hwmodels.load(gpu, profile="torch"))
        assert moved["half_width_pct"] == pytest.approx(TRANSFER_WIDENING * p90) and moved["transfer"]
        assert f"a transfer to {gpu}, unvalidated" in moved["text"]


def test_no_profile_means_the_datasheet_interval_carried_over_and_says_so():
    b = interval_basis(hwmodels.load("h200-calibrated"))
    ds = hwmodels.hardware_validation("h200-datasheet")
    assert b["half_width_pct"] == ds["p90_abs_pct"] and b["transfer"]
    assert b["text"].startswith("calibrated, unvalidated: h200-calibrated was never measured")
    assert interval_line(b).startswith(f"90 % interval: latency / (1 ± {ds['p90_abs_pct']:.1f} %)")


@pytest.fixture(scope="module")
def compared():
    return {gpu: compare_modes("llama-3.2-1b", gpu, stack="inductor")
            for gpu in ("h200-calibrated+mksim", "h200-calibrated")}


@pytest.mark.slow  # 2.1 s of CPU
def test_compare_gives_every_row_and_the_stack_an_interval(compared):
    d = compared["h200-calibrated+mksim"]
    rec = hwmodels.profile_info("mksim")["validation"]
    for mode, row in d["modes"].items():
        h = d["intervals"][family_of(mode)]["half_width_pct"]
        assert h == rec[family_of(mode)]["p90_abs_pct"]  # each family's own record
        assert row["interval_us"] == latency_interval(row["latency_us"], h)
        assert row["interval_us"][0] < row["latency_us"] < row["interval_us"][1]
    st = d["stack"]
    assert st["interval_us"] == latency_interval(st["latency_us"], st["interval"]["half_width_pct"])
    assert st["speedup_interval"] == speedup_interval(st["interval_us"], d["modes"]["megakernel"]["interval_us"])
    assert st["verdict"] == verdict(st["megakernel_speedup"], st["speedup_interval"])
    lines = render(compare_table(d)).splitlines()
    assert max(len(line) for line in lines) <= TABLE_WIDTH
    text = " ".join(lines)
    for fam in ("chain", "persistent"):
        assert f"90 % interval: latency / (1 ± {rec[fam]['p90_abs_pct']:.1f} %)" in text
        assert f"{rec[fam]['cases']} {'chain' if fam == 'chain' else 'persistent'}-mode" in text


def test_compare_without_a_profile_says_it_is_unvalidated(compared):
    d = compared["h200-calibrated"]
    ds = hwmodels.hardware_validation("h200-datasheet")
    for mode, row in d["modes"].items():
        assert row["interval_us"] == latency_interval(row["latency_us"], ds[family_of(mode)]["p90_abs_pct"])
    st = d["stack"]
    assert st["interval_us"] is not None and st["speedup_interval"] is not None
    assert st["verdict"] == verdict(st["megakernel_speedup"], st["speedup_interval"])
    text = " ".join(render(compare_table(d)).splitlines())
    assert "calibrated, unvalidated" in text and "h200-calibrated was never measured" in text


def test_the_stack_line_says_tie():
    st = {"impl": "torch", "gpu": "g+torch", "latency_us": 100.0, "interval_us": [90.0, 110.0],
          "megakernel_speedup": 1.05, "speedup_interval": [0.9, 1.2], "verdict": "tie",
          "assumes": {"text": "assumes: x"}, "interval": {"half_width_pct": 10.0, "cases": 5, "transfer": False}}
    assert stack_line(st) == ("stack torch: its kernels in one CUDA graph on g+torch: 100.0 µs (90.0-110.0); the "
                              "megakernel above: 1.05× (0.90-1.20×), a tie: the interval holds 1 (assumes: x; "
                              "stack ± 10.0 % from 5 cases)")

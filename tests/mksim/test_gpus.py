"""Every built-in GPU and calibrated overlay runs ``mksim compare`` at its defaults; a mode a GPU lacks
is left out with its reason (and refused in one line when asked for); the main job's table reads
well at 80 columns."""

from __future__ import annotations

import functools
import io
import os
import subprocess
import sys

import pytest
from rich.console import Console

import hwmodels
import mksim
from mksim import tables
from mksim.compare import compare_modes
from mksim.errors import ScheduleError
from mksim.schedule import MODES, Schedule, get_mode, modes_on

NO_PDL = {"a100": "8.0", "l40s": "8.9", "rtx4090": "8.9"}  # NVIDIA before compute capability 9.0


@functools.cache
def _compared(name: str) -> dict:
    """``compare_modes("llama-3.2-1b", name)``, once per GPU per test process (the tests read it)."""
    return compare_modes("llama-3.2-1b", name)


#: the GPUs whose comparison the quick loop (-m "not slow") runs: the main job's, and one without PDL; the
#: others (about 1 s of CPU each) run in the whole suite
QUICK_GPUS = ("h200-datasheet", "l40s")


@pytest.fixture(scope="module", params=[n if n in QUICK_GPUS else pytest.param(n, marks=pytest.mark.slow)
                                        for n in sorted(hwmodels.available())])
def compared(request):
    return request.param, _compared(request.param)


def test_compare_runs_at_the_defaults_on_every_gpu(compared):
    name, d = compared
    g = hwmodels.load(name)
    have, absent = modes_on(g)
    assert list(d["modes"]) == list(have) and d["absent"] == absent
    assert set(have) | set(absent) == set(MODES) and {"stream", "graph", "megakernel"} <= set(have)
    assert ("graph_pdl" in absent) == (g.launch.pdl_node_us is None)
    for row in d["modes"].values():
        assert row["latency_us"] > d["bandwidth_floor_us"]


def test_the_table_of_every_gpu_fits_80_columns(compared):
    name, d = compared
    text = _render(d)
    assert max(map(len, text.splitlines())) <= 80
    for mode, why in d["absent"].items():
        assert f"{mode} left out: " in text and " ".join(text.split()).count(why) == 1


@pytest.mark.parametrize("name", sorted(NO_PDL))
def test_graph_pdl_is_refused_in_one_line_where_there_is_no_pdl(name):
    with pytest.raises(ScheduleError) as info:
        mksim.build_schedule("llama-3.2-1b", name, "graph_pdl")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"mode graph_pdl: {name} has no programmatic dependent launch "
                          f"(compute capability {NO_PDL[name]}; PDL needs 9.0 or later)")
    assert msg.endswith(f"modes on {name}: stream, graph, persistent_barrier, megakernel")


def test_graph_pdl_on_amd_says_hip_has_none():
    assert get_mode("graph_pdl").available_on(hwmodels.load("mi300x")) == \
        "mi300x has no programmatic dependent launch (AMD cdna3: HIP has no PDL)"


def test_a_schedule_file_of_graph_pdl_for_a_gpu_without_pdl_is_refused():
    text = mksim.build_schedule("llama-3.2-1b", "h200-datasheet",
                                "graph_pdl").to_json().replace('"gpu":"h200-datasheet"', '"gpu":"l40s"')
    with pytest.raises(ScheduleError, match="mode graph_pdl: l40s has no programmatic dependent launch"):
        Schedule.from_json(text)


@pytest.mark.parametrize("name,depth", [("l40s", 2), ("rtx4090", 2), ("mi300x", 1), ("h200-datasheet", 4), ("a100", 4)])
def test_the_default_prefetch_depth_fits_the_shared_memory(name, depth):
    s = mksim.build_schedule("llama-3.2-1b", name, "megakernel")
    assert s.options.prefetch_depth == depth
    # the caller's own depth is theirs: over the budget it is refused, with the depth that fits
    if depth < 4:
        with pytest.raises(ScheduleError, match=f"use prefetch_depth <= {depth}"):
            mksim.build_schedule("llama-3.2-1b", name, "megakernel", prefetch_depth=4)
    # pages of another size: as many as fit beside the reserve
    o = mksim.build_schedule("llama-3.2-1b", name, "megakernel", page_KiB=16).options
    g = hwmodels.load(name)
    assert o.prefetch_depth == min(4, int((g.sm.shared_memory_per_block_KiB - 32) // 16))


@pytest.mark.slow  # 3.2 s of CPU
def test_designs_all_on_gpus_without_pdl():
    d = compare_modes("llama-3.2-1b", "mi300x", designs="all")
    assert "graph_pdl" not in d["modes"] and "megakernel:native" in d["modes"] and "megakernel:die" in d["modes"]
    assert max(map(len, _render(d).splitlines())) <= 80


def _render(d, width=80) -> str:
    con = Console(width=width, record=True, file=io.StringIO(), highlight=False)
    con.print(tables.compare_table(d))
    return con.export_text()


def test_the_main_jobs_table_reads_well_at_80_columns():
    d = _compared("h200-datasheet")
    for width in (80, 160):  # a terminal 80 wide, and a pipe (mksim.console's 160)
        text = _render(d, width)
        lines = text.splitlines()
        assert max(map(len, lines)) <= 80
        assert "…" not in text
        for mode, row in d["modes"].items():
            label = mode + (f" ({row['policy']})" if mode == "megakernel" else "")
            main = next(line for line in lines if line.startswith(f"│ {label} "))
            assert f" {row['latency_us']:.1f} " in main and f" {row['tokens_per_s']:.0f} " in main
            part = next(line for line in lines if line.startswith(f"{mode} "))
            assert [float(x) for x in part.split()[1:]] == [round(v, 1) for v in row["breakdown_us"].values()]


def test_a_search_never_picks_a_mode_the_gpu_lacks():
    from mksim.search import baseline_params
    from mksim.search._space import chain_modes

    assert chain_modes(hwmodels.load("h200-datasheet")) == ("graph_pdl", "graph")
    for name in sorted(NO_PDL) + ["mi300x"]:
        g = hwmodels.load(name)
        assert chain_modes(g) == ("graph",)
        assert not [k for k in baseline_params(g) if "graph_pdl" in k]


def test_a_search_on_a_gpu_without_pdl_runs_without_graph_pdl():  # 0.65 s of CPU, optuna's import included
    pytest.importorskip("optuna")
    from mksim.search import baseline_params, search
    from tests.mksim.searchkit import TINY_MODEL

    n = len(baseline_params(hwmodels.load("l40s")))
    res = search(str(TINY_MODEL), "l40s", trials=n + 2, storage="memory")  # the modes, not the model: 2 layers
    assert "graph" in res.baselines and not [k for k in res.baselines if "graph_pdl" in k]
    assert res.best["candidate"]["mode"] != "graph_pdl"


@pytest.mark.slow  # 1.9 s of CPU
def test_sweep_on_a_gpu_without_pdl():
    from mksim.report import sweep_rows, sweep_series

    rows = sweep_rows("llama-3.2-1b", "l40s", [1], [1024])
    assert "graph_pdl_us" not in rows[0] and rows[0]["megakernel_speedup_vs_graph_pdl"] is None
    assert {k: v for k, v in rows[0].items() if k.endswith("_us")} == {
        f"{m}_us": row["latency_us"] for m, row in _compared("l40s")["modes"].items()}  # the comparison's
    assert "graph_pdl" not in sweep_series(rows)["latency_us"]
    text = _render_table(tables.sweep_table(rows, "llama-3.2-1b", "l40s"))
    assert "graph_pdl left out: l40s has no programmatic dependent launch" in text and "MK vs PDL" not in text
    assert max(map(len, text.splitlines())) <= 80
    assert tables.gpu_absent_lines("l40s") == tables.absent_lines(_compared("l40s"))


def _render_table(t) -> str:
    con = Console(width=80, record=True, file=io.StringIO(), highlight=False)
    con.print(t)
    return con.export_text()


def _mksim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mksim", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.mark.slow  # 1.7 s of CPU
def test_the_main_job_through_a_pipe_fits_80_columns():
    r = _mksim("compare", "--model", "llama-3.2-1b", "--gpu", "h200-datasheet")
    assert r.returncode == 0, r.stderr
    assert max(map(len, r.stdout.splitlines())) <= 80
    for mode in MODES:
        assert mode in r.stdout


def test_simulate_graph_pdl_without_pdl_is_one_line():
    r = _mksim("simulate", "--mode", "graph_pdl", "--gpu", "l40s")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: mode graph_pdl: l40s has no programmatic dependent launch")
    assert r.stderr.count("\n") == 1


@pytest.mark.slow  # 2.0 s of CPU
def test_designs_all_leaves_out_a_design_the_gpu_cannot_have():
    from dataclasses import replace

    from mksim.compare import absent_rows, compare_workload, make_workload

    h = hwmodels.load("h200-datasheet")
    g = replace(h, name="no-movement", movement=replace(h.movement, mma_latency_ns=None))
    rows = compare_workload(make_workload("llama-3.2-1b", n_sms=g.sm.count), g, designs="all")
    assert "megakernel:native" not in rows and "megakernel:sentinel" in rows
    assert absent_rows(g, "all") == {"megakernel:native": "no-movement has no [chip.movement] table "
                                     "(async_copy_B, async_copy_issue_ns, mma_latency_ns)"}
    assert absent_rows(g) == {}
    with pytest.raises(ScheduleError, match=r"no-movement has no \[chip.movement\] table .*; movement='native' "):
        mksim.build_schedule("llama-3.2-1b", g, "megakernel", movement="native")

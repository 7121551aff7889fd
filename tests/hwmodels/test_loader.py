"""Every hardware file loads and is sane; malformed files fail in one line naming file and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import hwmodels
from hwmodels.errors import HardwareFileError, UnknownNameError

EXPECTED = {"a100", "h100", "h200-datasheet", "b200", "mi300x", "l40s", "rtx4090"}
H200 = Path(hwmodels.__file__).parent / "data" / "h200-datasheet.toml"


def test_every_generation_is_available():
    assert EXPECTED <= set(hwmodels.available())


@pytest.mark.parametrize("name", sorted(hwmodels.available()))
def test_file_loads_and_is_sane(name):
    g = hwmodels.load(name)
    assert g.name == name  # a file is known by its own name, overlays too
    # every number has a source that exists, and measured sources have a date
    for key, value in g.numbers().items():
        if value is None:
            continue
        src = g.source_of(key)
        assert src.title
        if src.kind == "measured":
            assert src.date
    # physics, not just ranges
    c = g.compute
    assert c.tensor_bf16_dense_TFLOPs > c.vector_fp32_TFLOPs
    if c.tensor_fp8_dense_TFLOPs:
        assert c.tensor_fp8_dense_TFLOPs >= c.tensor_bf16_dense_TFLOPs
    if c.tensor_fp4_dense_TFLOPs:
        assert c.tensor_fp4_dense_TFLOPs >= (c.tensor_fp8_dense_TFLOPs or 0)
    assert g.l2.latency_ns < g.dram.latency_ns
    assert g.l2.bandwidth_GBps > g.dram.bandwidth_spec_GBps * g.dram.reachable_fraction * 0.9
    # the SMs together can saturate DRAM (else the concurrency model contradicts the datasheet)
    assert g.sm.count * g.concurrency.per_sm_bandwidth_max_GBps > g.hbm_bandwidth_Bps / 1e9
    assert g.launch.graph_node_us <= g.launch.stream_launch_us
    if g.launch.pdl_node_us is not None:
        assert g.launch.pdl_node_us <= g.launch.graph_node_us
    if g.interconnect.dies_count == 1:
        assert g.interconnect.cross_die_latency_ns is None


def test_multi_die_parts():
    assert hwmodels.load("b200").interconnect.dies_count == 2
    assert hwmodels.load("mi300x").interconnect.dies_count == 8


def test_spec_is_frozen():
    g = hwmodels.load("h200-datasheet")
    with pytest.raises(AttributeError):
        g.sm.count = 1  # type: ignore[misc]


def test_unknown_name_lists_known():
    with pytest.raises(UnknownNameError, match="known: .*h200"):
        hwmodels.load("h300")


# -- malformed files -----------------------------------------------------------------
def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    return p


def _mutate(old: str, new: str) -> str:
    text = H200.read_text()
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize("old,new,match", [
    ("count = { value = 132", "count = { value = -132", r"chip\.sm\.count = -132 is negative"),
    ("capacity_GB = { value = 141", "capacity_GB = { value = 1e9", "capacity_GB = 1e.09 is implausible"),
    ("clock_boost_MHz", "clock_boost_GHz", r"unit 'GHz' but mksim expects 'MHz'.*clock_boost_MHz"),
    ("latency_ns = { value = 650", "latency_mystery = { value = 650", "unknown key memory.dram.latency_mystery"),
    ('vector_fp32_TFLOPs = { value = 67, source = "nv-h200-datasheet" }', "",
     r"missing key chip\.compute\.vector_fp32_TFLOPs"),
    ('source = "cuda-guide-cc90" }', 'source = "nowhere" }', "names source 'nowhere'"),
    ("count = { value = 132, source", "count = { value = 132.5, source", "must be a whole number"),
    ('count = { value = 132,', 'count = { value = "many",', "is not a number"),
    ('kind = "datasheet"', 'kind = "rumour"', "kind is 'rumour'"),
    ("[memory.l2]", "[memory.l3]", r"missing table \[memory.l2\]"),
    ("size_MiB = { value = 60", "size_MiB = { valu = 60", "must be { value"),
    ('name = "h200-datasheet"', 'name = "h200-datasheet"\ncolour = "green"', "unknown top-level key 'colour'"),
    ("shared_memory_per_block_KiB = { value = 227", "shared_memory_per_block_KiB = { value = 400",
     "exceeds shared_memory_per_sm_KiB"),
])
def test_malformed_file_names_file_and_key(tmp_path, old, new, match):
    p = _write(tmp_path, _mutate(old, new))
    with pytest.raises(HardwareFileError, match=match) as info:
        hwmodels.load(p)
    msg = str(info.value)
    assert str(p) in msg and "\n" not in msg


def test_not_toml(tmp_path):
    p = _write(tmp_path, "this is = = not toml")
    with pytest.raises(HardwareFileError, match="not valid TOML"):
        hwmodels.load(p)


def test_missing_path():
    with pytest.raises(HardwareFileError, match="no such hardware file"):
        hwmodels.load("/nonexistent/gpu.toml")


# -- overlays -------------------------------------------------------------------------
def test_overlay_extends_and_overrides(tmp_path):
    p = _write(tmp_path, '''
extends = "h200-datasheet"
name = "h200-test"
[memory.dram]
latency_ns = { value = 701, source = "bench" }
[sources.bench]
kind = "measured"
title = "pointer chase"
date = "2026-11-29"
''')
    g = hwmodels.load(p)
    base = hwmodels.load("h200-datasheet")
    assert g.name == "h200-test" and g.extends == "h200-datasheet"
    assert g.dram.latency_ns == 701
    assert g.source_of("dram.latency_ns").kind == "measured"
    assert g.dram.bandwidth_spec_GBps == base.dram.bandwidth_spec_GBps
    assert g.source_of("dram.bandwidth_spec_GBps") == base.source_of("dram.bandwidth_spec_GBps")


def test_overlay_errors_name_the_overlay(tmp_path):
    p = _write(tmp_path, 'extends = "h200-datasheet"\nname = "x"\n[memory.dram]\n'
                         'latency_ns = { value = -1, source = "estimate-precal" }\n')
    with pytest.raises(HardwareFileError, match=r"bad\.toml.*latency_ns = -1 is negative"):
        hwmodels.load(p)
    p2 = tmp_path / "b.toml"
    p2.write_text('extends = "h999"\nname = "x"\n')
    with pytest.raises(HardwareFileError, match="unknown model 'h999'"):
        hwmodels.load(p2)


def test_overlay_cycle(tmp_path):
    (tmp_path / "a.toml").write_text(f'extends = "{tmp_path / "b.toml"}"\nname = "a"\n')
    (tmp_path / "b.toml").write_text(f'extends = "{tmp_path / "a.toml"}"\nname = "b"\n')
    with pytest.raises(HardwareFileError, match="cycle"):
        hwmodels.load(tmp_path / "a.toml")


def test_hwmodels_does_not_import_mksim():
    """The data layer stands alone: loading a GPU (and failing to) loads no part of the simulator."""
    code = ("import sys, hwmodels\nhwmodels.load('h200-datasheet')\ntry:\n    hwmodels.load('h900')\n"
            "except hwmodels.UnknownGPUError:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mksim'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_mksim_error_catches_hardware_errors():
    from mksim.errors import MksimError

    with pytest.raises(MksimError, match="unknown GPU 'h900'"):
        hwmodels.load("h900")
    assert issubclass(HardwareFileError, MksimError) and issubclass(hwmodels.UnknownGPUError, UnknownNameError)


# -- [runtime.kernels.<kind>] tables -----------------------------------------------------
def _kernels_overlay(tmp_path: Path, body: str, name: str = "k.toml") -> Path:
    p = tmp_path / name
    p.write_text(f'extends = "h200-datasheet"\nname = "h200-k"\n{body}\n[sources.fit]\nkind = "measured"\n'
                 'title = "single ops"\n'
                 'date = "2026-11-30"\n')
    return p


def test_kernel_tables_are_read_for_any_kind(tmp_path):
    g = hwmodels.load(_kernels_overlay(tmp_path, '''
[runtime.kernels]
matvec_fixed_us = { value = 8, source = "fit" }
[runtime.kernels.matmul]
task_fixed_us = { value = 4.2, source = "fit", spread = 0.2, note = "20 ops" }
consume_GBps = { value = 31.7, source = "fit" }
[runtime.kernels.future_kind]
task_fixed_us = { value = 1, source = "fit" }
'''))
    assert g.kernels.matvec_fixed_us == 8
    assert g.kernels.per_kind["matmul"] == hwmodels.KernelCost(task_fixed_us=4.2, consume_GBps=31.7)
    assert list(g.kernels.per_kind) == ["matmul", "future_kind"]
    assert g.source_of("kernels.matmul.consume_GBps").title == "single ops"
    nums = g.numbers()
    assert nums["kernels.matmul.task_fixed_us"] == 4.2 and "kernels.matmul.task_row_us" not in nums
    assert isinstance(hash(g), int)  # still hashable: the per-kind mapping is left out of the hash


def test_old_kind_prefixed_keys_are_migrated_on_load(tmp_path):
    new = hwmodels.load(_kernels_overlay(tmp_path, '''
[runtime.kernels.matmul]
task_fixed_us = { value = 4.2, source = "fit" }
consume_row_GBps = { value = 256, source = "fit" }
[runtime.kernels.attn_partial]
consume_GBps = { value = 9.4, source = "fit" }
''', "new.toml"))
    old = hwmodels.load(_kernels_overlay(tmp_path, '''
[runtime.kernels]
matmul_task_fixed_us = { value = 4.2, source = "fit" }
matmul_consume_row_GBps = { value = 256, source = "fit" }
attn_partial_consume_GBps = { value = 9.4, source = "fit" }
''', "old.toml"))
    assert old.kernels == new.kernels and old.numbers() == new.numbers() and old.provenance == new.provenance
    # an old overlay over a new base overrides the base's number
    over = tmp_path / "over.toml"
    over.write_text(f'extends = "{tmp_path / "new.toml"}"\nname = "o"\n[runtime.kernels]\n'
                    'matmul_task_fixed_us = { value = 5, source = "fit" }\n')
    assert hwmodels.load(over).kernels.per_kind["matmul"].task_fixed_us == 5
    assert hwmodels.load(over).kernels.per_kind["matmul"].consume_row_GBps == 256


@pytest.mark.parametrize("body,match", [
    ('[runtime.kernels.matmul]\ntask_fixed_ms = { value = 4, source = "fit" }',
     r"runtime\.kernels\.matmul\.task_fixed_ms has unit 'ms' but mksim expects 'us'"),
    ('[runtime.kernels.matmul]\nfixed_us = { value = 4, source = "fit" }',
     r"unknown key runtime\.kernels\.matmul\.fixed_us; expected one of consume_GBps"),
    ('[runtime.kernels.matmul]\ntask_fixed_us = { value = -4, source = "fit" }',
     r"runtime\.kernels\.matmul\.task_fixed_us = -4 is negative"),
    ('[runtime.kernels.MatMul]\ntask_fixed_us = { value = 4, source = "fit" }', "an op kind is a lower-case name"),
    ('[runtime.kernels]\nmatmul_task_fixed_us = { value = 4, source = "fit" }\n'
     '[runtime.kernels.matmul]\ntask_fixed_us = { value = 4, source = "fit" }', "give the same number; keep the table"),
    ('[runtime.kernels]\nmatmul = { value = 4, source = "fit" }\nmatmul_task_fixed_us = { value = 4, source = "fit" }',
     r"runtime\.kernels\.matmul must be a table of task costs"),
    ('[runtime.kernels]\nmystery_us = { value = 4, source = "fit" }',
     r"unknown key runtime\.kernels\.mystery_us; .*or a \[runtime\.kernels\.<kind>\] table"),
])
def test_bad_kernel_tables_fail_in_one_line(tmp_path, body, match):
    p = _kernels_overlay(tmp_path, body)
    with pytest.raises(HardwareFileError, match=match) as info:
        hwmodels.load(p)
    assert str(p) in str(info.value) and "\n" not in str(info.value)

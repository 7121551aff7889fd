"""sync="sentinel" and "flag" in the generated megakernel, and the designs it refuses, checked
without a GPU: the encoding, the poll segments (walked as the kernel walks them), the reset of
the next step, the sentinel no output takes, the one-line refusals, and the syncs runner on a fake
measure (synthetic numbers, not results)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

import mksim
from mksim.errors import ScheduleError
from validation.megakernel import program as P
from validation.megakernel import quick as quick_look
from validation.megakernel import syncs
from validation.megakernel.encode import DEP_OP, DEP_TILES, waits_on_flags

from .. import clirun
from . import nvcc_builds

ROOT = Path(__file__).resolve().parents[2]


def _schedule(model="llama-3.2-1b", batch=1, **opts):
    wl = mksim.models.workload(model, batch=batch, kv_len=1024)
    return mksim.build_schedule(wl, "h200-calibrated", "megakernel", **(P.kernel_options(model, batch) | opts))


@pytest.fixture(scope="module", params=[("llama-3.2-1b", 1), ("llama-3.2-1b", 4), ("llama-3.1-8b", 1)],
                ids=lambda p: f"{p[0]}-b{p[1]}")
def sentinel_plan(request):
    model, batch = request.param
    return P.plan(_schedule(model, batch, sync="sentinel"))


# -- encoding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("sync", ["counter", "flag", "sentinel"])
def test_whole_op_counters_only_with_sync_counter(sync):
    prog = P.plan(_schedule(sync=sync)).program
    kinds = set(prog.deps[:, 0].tolist())
    assert (DEP_OP in kinds) == (sync == "counter")
    assert DEP_TILES in kinds
    assert waits_on_flags(prog) == (sync != "sentinel")
    # same dependencies whatever the sync: only how they are waited on differs
    base = P.plan(_schedule(sync="counter")).program
    assert np.array_equal(prog.deps[:, 1:], base.deps[:, 1:]) and np.array_equal(prog.tasks, base.tasks)


def test_only_the_sentinel_megakernel_has_a_sentinel_plan():
    assert P.plan(_schedule(sync="counter")).sentinel is None
    assert P.plan(_schedule(sync="flag")).sentinel is None


# -- what is polled ------------------------------------------------------------------------------
def _walk(sp: P.SentinelPlan, s0: int, s1: int) -> list[tuple[str, int, int, int]]:
    """The units of segments [s0, s1) as mk_poll_data addresses them: (buffer, byte, bytes, esz)."""
    units = []
    total = int(sp.poll_end[s1 - 1])
    seg = s0
    for u in range(total):
        while sp.poll_end[seg] <= u:
            seg += 1
        first = 0 if seg == s0 else int(sp.poll_end[seg - 1])
        buf, off, kind = sp.polls[seg]
        size = P.POLL_UNIT_B[kind]
        units.append((buf, off + (u - first) * size, size, 2 if kind in (0, 2) else 4))
    return units


def _cover(ranges) -> dict[str, list[tuple[int, int]]]:
    """The bytes of ``(buffer, first, end)`` ranges as each buffer's sorted, disjoint, non-adjacent runs:
    two lists of ranges cover the same bytes exactly when their covers are equal."""
    by: dict[str, list[tuple[int, int]]] = {}
    for buf, a, z in ranges:
        if z > a:
            by.setdefault(buf, []).append((a, z))
    cover = {}
    for buf, spans in by.items():
        spans.sort()
        runs = [list(spans[0])]
        for a, z in spans[1:]:
            if a <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], z)
            else:
                runs.append([a, z])
        cover[buf] = [(a, z) for a, z in runs]
    return cover


def test_cover_is_the_set_of_bytes():
    rng = np.random.default_rng(0)
    for _ in range(200):
        ranges = [(str(rng.integers(2)), int(a), int(a + rng.integers(0, 9))) for a in rng.integers(0, 40, 6)]
        from_cover = {(b, x) for b, runs in _cover(ranges).items() for a, z in runs for x in range(a, z)}
        assert from_cover == {(b, x) for b, a, z in ranges for x in range(a, z)}
    assert _cover([("x", 0, 4), ("x", 4, 8), ("x", 9, 9), ("y", 2, 3)]) == {"x": [(0, 8)], "y": [(2, 3)]}


@pytest.mark.slow  # 2.5 s of CPU
def test_poll_segments_are_aligned_units_of_the_right_element_size(sentinel_plan):
    sp, plan = sentinel_plan.sentinel, sentinel_plan
    assert len(sp.polls) == len(sp.poll_end) and sp.poll_deps.shape == (len(plan.program.deps), 2)
    for buf, off, kind in sp.polls:
        b = plan.buffers[buf]
        esz = 4 if b.dtype == "f32" else 2
        assert kind == P.POLL_KINDS[("vec" if P.POLL_UNIT_B[kind] == 16 else "one", esz)]
        assert off % P.POLL_UNIT_B[kind] == 0 and off < b.nbytes
    # each dependency's list counts its units up from 0
    for s0, s1 in {tuple(r) for r in sp.poll_deps.tolist()}:
        ends = sp.poll_end[s0:s1]
        assert s1 > s0 and ends[0] > 0 and (np.diff(ends) > 0).all()


@pytest.mark.slow  # 1.8 s of CPU, the three plans
def test_every_dependency_polls_exactly_the_bytes_its_producer_tiles_write(sentinel_plan):
    plan, sp = sentinel_plan, sentinel_plan.sentinel
    s, g = plan.schedule, plan.schedule.graph
    T = s.workload.batch
    seen = set()
    for d, (_k, p, t0, t1) in enumerate(plan.program.deps.tolist()):
        if (p, t0, t1) in seen:
            continue
        seen.add((p, t0, t1))
        polled = _cover((buf, a, a + size) for buf, a, size, _esz in _walk(sp, *sp.poll_deps[d]))
        want = _cover((buf, a, z) for buf, a, z, _esz in P.written_bytes(
            s.workload.ops[p], plan.ops[p], int(g.bounds[p][t0]), int(g.bounds[p][t1]), T))
        assert polled == want, s.workload.ops[p].name


def test_the_tiles_of_an_op_write_its_whole_output_once(sentinel_plan):
    """Independent of the kind's tile units: the written ranges of all tiles partition the output
    (and, for rope_kv, the appended KV-cache slots), so no consumer can wait on bytes no one writes."""
    plan = sentinel_plan
    s, g = plan.schedule, plan.schedule.graph
    wl, T = s.workload, s.workload.batch
    for i, op in enumerate(wl.ops[:12]):  # embed and the first layer: every kind
        count: dict[str, np.ndarray] = {}
        for t in range(int(g.n_tiles[i])):
            for buf, a, z, _esz in P.written_bytes(op, plan.ops[i], int(g.bounds[i][t]), int(g.bounds[i][t + 1]), T):
                c = count.setdefault(buf, np.zeros(plan.buffers[buf].nbytes, np.int32))
                c[a:z] += 1
        out = count.pop(plan.ops[i]["out"])
        assert (out == 1).all(), op.name
        if op.kind == "rope_kv":
            r = plan.ops[i]
            for c in ("kc", "vc"):
                k = count.pop(r[c]).reshape(T, r["hkv"], r["s_max"], r["hd"] * 2)
                assert (k[:, :, r["pos"]] == 1).all() and k.sum() == k[:, :, r["pos"]].sum()
        assert not count


def test_byte_segments_split_an_unaligned_range():
    assert P.byte_segments("x", 6, 40, 2) == [("x", 6, 2, 5), ("x", 16, 0, 1), ("x", 32, 2, 4)]
    assert P.byte_segments("f", 0, 1560, 4) == [("f", 0, 1, 97), ("f", 1552, 3, 2)]
    assert P.byte_segments("y", 4, 12, 4) == [("y", 4, 3, 2)]
    with pytest.raises(ValueError):
        P.byte_segments("x", 1, 4, 2)


# -- the reset ------------------------------------------------------------------------------------
@pytest.mark.slow  # 2.4 s of CPU
def test_a_step_resets_every_output_and_the_appended_slot_of_the_other_set(sentinel_plan):
    plan, sp = sentinel_plan, sentinel_plan.sentinel
    assert set(sp.twins) == {n for n in plan.buffers if n.startswith(("out:", "kc:", "vc:"))}
    cover = {n: np.zeros(plan.buffers[n].nbytes, np.int32) for n in sp.twins}
    for buf, off, nb in sp.resets:
        assert 0 < nb <= P.RESET_CHUNK_B and off % 16 == 0 and nb % 4 == 0  # what mk_reset_next stores
        cover[buf][off:off + nb] += 1
    for n, c in cover.items():
        if n.startswith("out:"):
            assert (c == 1).all(), n
        else:
            b = plan.buffers[n]
            c = c.reshape(*b.shape[:3], -1)
            pos = plan.schedule.workload.kv_len
            assert (c[:, :, pos] == 1).all() and c.sum() == c[:, :, pos].sum(), n


def test_tables_carry_device_addresses():
    plan = P.plan(_schedule(sync="sentinel"))
    sp = plan.sentinel
    addr = {n: 4096 * (i + 1) << 20 for i, n in enumerate(plan.buffers)}
    pt, rt = P.poll_table(sp, addr), P.reset_table(sp, addr)
    assert pt.dtype.itemsize == 16 and rt.dtype.itemsize == 16
    buf, off, kind = sp.polls[3]
    assert pt[3]["ptr"] == addr[buf] + off and pt[3]["kind"] == kind and pt[3]["end"] == sp.poll_end[3]
    buf, off, nb = sp.resets[-1]
    assert rt[-1]["ptr"] == addr[buf] + off and rt[-1]["nbytes"] == nb
    assert P.twin("out:embed", 1) == "out:embed@1" and P.twin("out:embed", 0) == "out:embed"


# -- the sentinel no output takes --------------------------------------------------------------------
def _mk_f32_to_bf16(u: np.ndarray) -> np.ndarray:
    """mk_f32_to_bf16 of mk_ops.cuh on raw fp32 bits: every NaN as 0x7fc0, the rest rounded to nearest even."""
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint32)
    return np.where(nan, np.uint32(0x7FC0), r)


def test_no_bf16_output_is_the_sentinel():
    hi = np.arange(1 << 16, dtype=np.uint64)
    u = np.concatenate([(hi << 16) | lo for lo in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF)]).astype(np.uint32)
    out = _mk_f32_to_bf16(u)
    assert not (out == 0xFFFF).any() and out.max() <= 0xFF80
    # the host's weight fill (program.bf16_bits) of finite values never gives it either
    assert not (P.bf16_bits(np.array([-3.4e38, -np.inf, np.inf, -1e-45], np.float32)) == 0xFFFF).any()


def test_the_kernel_canonicalises_nans_before_writing_bf16():
    src = (ROOT / "validation/kernels/mk_ops.cuh").read_text()
    assert "if ((u & 0x7fffffffu) > 0x7f800000u) return (mk_bf16)0x7fc0;" in src
    assert P.SENTINEL_BYTE == 0xFF


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("opts,msg", [
    ({"dispatch": "dynamic"}, "dispatch='dynamic'"),
    ({"dies": True}, "dies=true"),
    ({"movement": "native"}, "movement='native'"),
])
def test_designs_without_device_code_are_refused_in_one_line(opts, msg):
    s = _schedule(**opts)
    with pytest.raises(ScheduleError, match=msg) as exc:
        P.plan(s)
    text = str(exc.value)
    assert "\n" not in text and "it runs one block per SM, static per-SM queues" in text
    assert "sync counter/flag/sentinel" in text


def test_a_sync_the_kernel_does_not_know_is_refused():
    s = _schedule()
    s = dataclasses.replace(s, options=dataclasses.replace(s.options, sync="bulletin"))
    with pytest.raises(ScheduleError, match="sync='bulletin' has no device code"):
        P.check_designs(s)


def test_every_sync_of_the_model_runs_on_the_kernel():
    from mksim.schedule import SYNCS
    assert set(SYNCS) == set(P.KERNEL_SYNCS)


def test_quick_look_refuses_before_any_gpu_work(capsys):
    with pytest.raises(SystemExit) as exc:
        quick_look.main(["--modes", "megakernel", "--opt", "dies=true"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: megakernel: the generated kernel cannot run this schedule: dies=true")
    assert "\n" not in err
    with pytest.raises(SystemExit) as exc:
        quick_look.main(["--modes", "megakernel", "--opt", "colour=blue"])
    assert exc.value.code == 2 and "unknown schedule option 'colour'" in capsys.readouterr().err


def test_mksim_validate_refuses_a_dynamic_schedule_in_one_line(tmp_path):
    s = mksim.build_schedule(mksim.models.workload("llama-3.2-1b", batch=1), "h200-mk-kernels", "megakernel",
                             dispatch="dynamic", **P.kernel_options("llama-3.2-1b", 1, gpu="h200-mk-kernels"))
    path = tmp_path / "dyn.json"
    path.write_text(s.to_json())
    r = clirun.mksim("validate", "--schedule", str(path))  # in this process (tests/clirun.py)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the generated kernel cannot run this schedule: dispatch")


# -- the runner ----------------------------------------------------------------------------------
def _fake_measure(schedule, reps, watchdog_s):
    """Synthetic numbers (test data, not a measurement)."""
    sync = schedule.options.sync
    us = {"counter": 1000.0, "sentinel": 990.0, "flag": 1010.0}[sync] * schedule.workload.batch ** 0.1
    if schedule.workload.batch == 4 and sync == "flag":
        raise ScheduleError("synthetic failure")
    return {"measured_us": us, "measured_spread_us": 3.0, "GBps": 2.5e9 / us, "ok": True, "max_rel_err": 1e-3,
            "worst_op": "lm_head", "recycled_max_rel_err": 2e-3 if sync == "sentinel" else None,
            "trace": {"span_us": us, "kinds": {"matmul": {"wait_us": 0.5}}}, "kernel": {"depth": 4}}


@pytest.mark.slow  # 2.0 s of CPU
def test_the_syncs_runner_writes_one_row_per_case(tmp_path, monkeypatch):
    # the runner's plumbing on its two llama-3.2-1b cases (the 8b one adds three simulations, nothing new)
    monkeypatch.setattr(syncs, "CASES", syncs.CASES[:2])
    assert syncs.CASES == (("llama-3.2-1b", 1), ("llama-3.2-1b", 4))
    said: list[str] = []
    doc = syncs.run(tmp_path, measure=_fake_measure, say=said.append)
    on_disk = json.loads((tmp_path / "syncs.json").read_text())
    assert on_disk == json.loads(json.dumps(doc)) and doc["format"] == syncs.FORMAT
    assert [(r["model"], r["batch"], r["sync"]) for r in doc["rows"]] == [
        (m, b, s) for m, b in syncs.CASES for s in syncs.SYNCS]
    bad = [r for r in doc["rows"] if r["error"]]
    assert [(r["batch"], r["sync"], r["error"]) for r in bad] == [(4, "flag", "synthetic failure")]
    good = doc["rows"][0]
    assert good["predicted_us"] > 0 and good["error_pct"] == pytest.approx(
        100 * (good["predicted_us"] - good["measured_us"]) / good["measured_us"])
    cmp = {(c["model"], c["batch"]): c["vs_counter_us"] for c in doc["comparison"]}
    assert cmp[("llama-3.2-1b", 1)]["sentinel"] == pytest.approx(-10.0)
    assert "flag" not in cmp[("llama-3.2-1b", 4)]
    assert any("error: synthetic failure" in m for m in said)


def test_the_syncs_runner_skips_cases_past_its_timeout(tmp_path):
    doc = syncs.run(tmp_path, timeout_s=1e-9, quick=True, measure=_fake_measure, say=lambda m: None)
    assert [r["sync"] for r in doc["rows"]] == list(syncs.QUICK_SYNCS)
    assert all(r["error"].startswith("skipped") for r in doc["rows"]) and doc["reps"] == syncs.QUICK_REPS


def test_the_syncs_runner_refuses_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exc:
        syncs.main(["run", "--out", "x", "--timeout", "0"])
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("error: ")


# -- the kernel's sentinel experiments compile without spilling ------------------------------------
# The persistent kernel sits at the 168 registers that 384 threads allow. With the tensor-core
# attention (MK_ATTN=2, the default) its head-size-128 partials leave 4 bytes of spills; that build
# measured 4-13 % faster than the CUDA-core one, which spills nothing
# (validation/results/evidence/h200-mk18-noinline). With the MoE functions and the k-chunked matmul the
# build of every attention shape (no MK_ATTN_HD: what nothing runs since plans compile their model's one
# instance) spills 12 bytes and the CUDA-core one 4; the builds plans make spill 0-4, and llama-3.1-8b b1's
# default megakernel measured 4630.2 us against 4647.0 before them (validation/results/h200-kchunk,
# validation/results/h200): up to two registers' spills (16 bytes) are let through, one at MK_ATTN=1;
# the 472-byte spills that slowed every task would fail.
@pytest.mark.skipif(nvcc_builds.NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name, spill_B", [("mk", 16), ("mk-sentinel-nofence", 16), ("mk-attn1", 8)])
@pytest.mark.slow
@pytest.mark.nvcc
def test_the_sentinel_kernel_compiles_without_spills(name, spill_B):
    r = nvcc_builds.build(name)  # the default build is the one test_megakernel_encode checks
    assert r.returncode == 0, r.stderr
    persistent = r.stderr.split("Function properties for mk_persistent")[1].splitlines()[1]
    stores = int(re.search(r"(\d+) bytes spill stores", persistent).group(1))
    assert stores <= spill_B, persistent

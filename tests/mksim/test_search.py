"""Schedule search: determinism, baselines, pruning, best-schedule round trip, storage
(SQLite kill-and-resume, two workers on one PostgreSQL study) and the CLI.

The searches test the machinery, not a model's numbers: they search the tiny model (a Llama of 2 layers,
tests/mksim/searchkit.py) on a 16-SM H200, the H200's space and baselines at a small part of the cost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

optuna = pytest.importorskip("optuna")

import hwmodels  # noqa: E402
from mksim.search import Problem, baseline_params, build, search, suggest  # noqa: E402
from mksim.search._report import candidate_rows, report_rows  # noqa: E402
from tests.clirun import mksim  # noqa: E402
from tests.mksim.searchkit import TINY_MODEL, count, small_gpu  # noqa: E402

N_BASE = len(baseline_params(hwmodels.load("h200-datasheet")))
MODEL = str(TINY_MODEL)  # what the searches search (a config path, as mksim search --model takes it)


def cli(*args: str) -> subprocess.CompletedProcess:
    """``mksim ARGS`` in this process (tests/clirun.py); a killed search and two workers are real children."""
    return mksim(*args, cwd=os.getcwd())


def counted(url: str, study: str) -> list:
    s = optuna.load_study(study_name=study, storage=url)
    TS = optuna.trial.TrialState
    return s.get_trials(deepcopy=False, states=(TS.COMPLETE, TS.PRUNED))


@pytest.fixture(scope="module")
def gpu(tmp_path_factory) -> str:
    """An H200 of 16 SMs (tests/mksim/searchkit.py): the H200's space and baselines, trials a tenth of the cost."""
    path = small_gpu(tmp_path_factory.mktemp("gpu"))
    assert len(baseline_params(hwmodels.load(str(path)))) == N_BASE
    return str(path)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, gpu):
    """One seeded search in SQLite, which the tests of its baselines and of determinism share."""
    db = tmp_path_factory.mktemp("seeded") / "a.db"
    return search(MODEL, gpu, trials=N_BASE + 4, seed=11, storage=f"sqlite:///{db}")


@pytest.mark.slow
def test_baselines_are_the_built_in_schedules_and_best_is_never_worse(seeded, gpu):
    res = seeded
    assert set(res.baselines) == {f"megakernel:{p}" for p in ("rr", "zigzag", "wave", "dag", "pool")} | {
        "graph", "graph_pdl"}
    import mksim

    wl = mksim.models.workload(mksim.models.config_from_hf(MODEL), n_sms=hwmodels.load(gpu).sm.count)
    for name in ("megakernel:rr", "graph_pdl"):
        mode, _, policy = name.partition(":")
        direct = mksim.simulate(mksim.build_schedule(wl, gpu, mode, policy=policy or None))
        assert res.baselines[name]["latency_us"] == pytest.approx(direct.latency_us, rel=1e-12)
    assert res.best["latency_us"] <= min(b["latency_us"] for b in res.baselines.values())
    assert all(s >= 1.0 for s in res.improvement().values())
    rows = report_rows(res)
    assert rows[0]["schedule"].startswith("best") and len(rows) == 1 + 7


@pytest.mark.slow
def test_seeded_search_is_deterministic(seeded, gpu, tmp_path):
    b = search(MODEL, gpu, trials=N_BASE + 4, seed=11, storage=f"sqlite:///{tmp_path}/b.db")
    assert seeded.best == b.best


def test_shared_memory_overflow_is_pruned_with_its_reason():
    gpu = hwmodels.load("h200-datasheet")
    params = {"mode": "megakernel", "policy": "rr", "order": "op", "page_KiB": 64, "prefetch_depth": 12,
              "sync": "counter", "fuse_norm": False, "split_qkv": False, "split_gate_up": False,
              "fuse_rope": False, "fuse_silu": False, "l2_prefetch_KiB": 0.0, "kv_split_mult": 1.0, "grain_small": 1.0,
              **{f"grain_{r}": 1.0 for r in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")}}
    with pytest.raises(optuna.TrialPruned, match="exceed the 227 KiB"):
        suggest(optuna.trial.FixedTrial(params), gpu)
    params["prefetch_depth"] = 2
    cand = suggest(optuna.trial.FixedTrial(params), gpu)
    assert cand.smem_KiB() == 2 * 64 + 32
    sched = build(cand, Problem("llama-3.2-1b", gpu))
    assert sched.options.prefetch_depth == 2 and sched.policy == "rr"


def test_grain_choices_change_the_tiling():
    gpu = hwmodels.load("h200-datasheet")
    p = {"mode": "megakernel", "policy": "dag", "order": "op", "dag_sync_scale": 1.0, "page_KiB": 32,
         "prefetch_depth": 4, "sync": "flag", "fuse_norm": False, "split_qkv": False, "split_gate_up": False,
         "fuse_rope": False, "fuse_silu": False, "l2_prefetch_KiB": 0.0,
         "kv_split_mult": 2.0, "grain_small": 0.5, "grain_qkv_proj": 3.0, "grain_o_proj": 1.0,
         "grain_gate_up_proj": 1.0, "grain_down_proj": 0.5, "grain_lm_head": 4.0}
    s = build(suggest(optuna.trial.FixedTrial(p), gpu), Problem("llama-3.2-1b", gpu))
    tiles = {op.name: int(n) for op, n in zip(s.graph.ops, s.graph.n_tiles, strict=True)}
    steps = {op.name: -(-op.out_size // op.align) for op in s.graph.ops}
    for name, want in (("L0.qkv_proj", 396), ("L0.down_proj", 66), ("lm_head", 528), ("L0.attn_norm", 66),
                       ("L0.o_proj", 132)):
        assert tiles[name] == min(want, steps[name]), name
    assert tiles["L0.qkv_proj"] > 132 and s.options.sync == "flag"
    base = build(suggest(optuna.trial.FixedTrial({**p, "kv_split_mult": 1.0}), gpu), Problem("llama-3.2-1b", gpu))
    assert tiles["L0.attn_partial"] == 2 * int(dict(zip([o.name for o in base.graph.ops],
                                                        base.graph.n_tiles, strict=True))["L0.attn_partial"])


def test_fused_candidates_drop_the_norm_rope_and_silu_ops():
    gpu = hwmodels.load("h200-datasheet")
    params = baseline_params(gpu)
    fused = build(suggest(optuna.trial.FixedTrial(params["graph_pdl:fused"]), gpu, "graph_pdl"),
                  Problem("llama-3.2-1b", gpu))
    plain = build(suggest(optuna.trial.FixedTrial(params["graph_pdl"]), gpu, "graph_pdl"), Problem("llama-3.2-1b", gpu))
    n_layers = 16
    assert len(plain.graph.ops) - len(fused.graph.ops) == (2 + 1 + 1) * n_layers + 1
    assert not any(op.kind in ("rmsnorm", "rope_kv", "silu_mul") for op in fused.graph.ops)
    assert all(fused.workload_spec[k] is True for k in ("fuse_norm", "fuse_rope", "fuse_silu"))
    assert fused.workload.weight_bytes == pytest.approx(plain.workload.weight_bytes)


def test_epilogue_fusions_need_the_fused_projections_and_prune_what_a_model_cannot_take():
    from mksim.errors import ScheduleError

    gpu = hwmodels.load("h200-datasheet")
    p = {**baseline_params(gpu)["megakernel:rr"], "split_qkv": True, "split_gate_up": True}
    del p["fuse_rope"], p["fuse_silu"]  # not asked with split projections
    c = suggest(optuna.trial.FixedTrial(p), gpu)
    assert (c.fuse_rope, c.fuse_silu) == (False, False)
    # qwen3's q/k norms need the whole head before RoPE: fuse_rope prunes the trial with the reason
    c = suggest(optuna.trial.FixedTrial({**baseline_params(gpu)["megakernel:rr"], "fuse_rope": True}), gpu)
    with pytest.raises(ScheduleError, match="fuse_rope is not built for models with q/k norms"):
        build(c, Problem("qwen3-8b", gpu))


def test_split_projections_interleave_under_level_order():
    gpu = hwmodels.load("h200-datasheet")
    p = {**baseline_params(gpu)["megakernel:rr"], "order": "level", "split_qkv": True, "split_gate_up": True}
    s = build(suggest(optuna.trial.FixedTrial(p), gpu), Problem("llama-3.2-1b", gpu))
    assert s.policy_options == {"order": "level"}
    names = [s.graph.ops[s.graph.op_of[t]].name for t in s.queues[0][:12]]
    assert {"L0.q_proj", "L0.k_proj", "L0.v_proj"} & set(names)
    first = [s.graph.ops[s.graph.op_of[t]].name.split(".")[-1] for q in s.queues for t in q[:3]]
    assert {"q_proj", "k_proj", "v_proj"} <= set(first)  # q, k and v tiles start together across the SMs


@pytest.fixture(scope="module")
def in_memory(tmp_path_factory, gpu):
    """The fewest trials in memory, with a report: what the report's and the storage's tests read."""
    page_path = tmp_path_factory.mktemp("report") / "r.html"
    return search(MODEL, gpu, trials=N_BASE, storage="memory", report=page_path), page_path


@pytest.mark.slow
def test_report_shows_the_best_schedule_as_a_table_not_a_dict(in_memory):
    import re

    res, page_path = in_memory
    page = page_path.read_text()
    # plotly.js itself is code with "{'" in it; the rest of the page (text, tables, figures) has no raw dict
    bundle = next(m for m in re.finditer(r"<script[^>]*>.*?</script>", page, flags=re.S) if "plotly.js v" in m[0])
    rest = page[:bundle.start()] + page[bundle.end():]
    assert "{'" not in rest and "<h2>Best schedule</h2>" in rest
    assert f"<td>mode</td><td>{res.best['candidate']['mode']}</td>" in rest
    rows = candidate_rows({**res.best["candidate"], "options": {"page_KiB": 32.0, "sync": "flags"},
                           "grain": {}, "policy_options": {"w": {"a": 1}}})
    assert ("options.page_KiB", "32") in rows and ("grain", "(defaults)") in rows
    assert ("policy_options.w", "a=1") in rows and not any("{" in v for _, v in rows)


@pytest.mark.slow
def test_memory_storage_keeps_nothing_and_needs_one_worker(in_memory, gpu):
    res, _ = in_memory
    assert res.n_complete + res.n_pruned >= N_BASE and res.storage == "memory"
    with pytest.raises(Exception, match="one process"):
        search(MODEL, gpu, trials=N_BASE, storage="memory", workers=2)


@pytest.mark.slow
def test_best_schedule_file_reproduces_the_reported_latency(tmp_path, gpu):
    best = tmp_path / "best.json"
    r = cli("search", "--model", MODEL, "--gpu", gpu, "--trials", str(N_BASE + 2), "--seed", "5", "--storage", f"sqlite:///{tmp_path}/c.db",
            "--out", str(best), "--report", str(tmp_path / "r.html"), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    sim = cli("simulate", "--schedule", str(best), "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["latency_us"] == got["best"]["latency_us"]  # exactly
    page = (tmp_path / "r.html").read_text()
    assert "History" in page and "Parallel coordinates" in page and "plotly" in page
    assert got["trials"]["complete"] + got["trials"]["pruned"] == N_BASE + 2


@pytest.mark.slow
def test_pareto_front_for_latency_and_shared_memory(tmp_path, gpu):
    res = search(MODEL, gpu, trials=N_BASE + 6, seed=2, objectives="latency,smem",
                 storage=f"sqlite:///{tmp_path}/p.db")
    assert res.pareto
    lat = [p["latency_us"] for p in res.pareto]
    smem = [p["smem_KiB"] for p in res.pareto]
    assert lat == sorted(lat) and smem == sorted(smem, reverse=True) or len(res.pareto) == 1
    assert res.best["latency_us"] == min(lat)


@pytest.mark.slow
def test_sqlite_study_survives_a_kill_and_resumes(tmp_path, gpu):
    db, study, total = tmp_path / "k.db", "resume", N_BASE + 5
    url = f"sqlite:///{db}"
    args = ["search", "--model", MODEL, "--gpu", gpu, "--trials", str(total), "--storage", url, "--study", study,
            "--seed", "4", "--json"]
    proc = subprocess.Popen([sys.executable, "-m", "mksim", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    done_before: dict[int, float] = {}
    while time.time() < deadline:
        time.sleep(0.01)
        if count(db) >= 12:  # read without optuna: cheap enough to poll this often
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            done_before = {t.number: t.user_attrs.get("latency_us") for t in counted(url, study)}
            break
        if proc.poll() is not None:
            pytest.fail(f"the first search ended (status {proc.returncode}) before 12 trials")
    else:
        proc.kill()
        pytest.fail("the first search never reached 12 trials")
    assert 12 <= len(done_before) < total, "killed too late to test resuming"
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    after = counted(url, study)
    assert len(after) == total                      # no trial lost, none counted twice
    kept = {t.number: t.user_attrs.get("latency_us") for t in after}
    assert all(kept[n] == v for n, v in done_before.items())


PG = os.environ.get("MKSIM_TEST_POSTGRES_URL")


@pytest.mark.skipif(not PG and os.environ.get("CI") != "true",
                    reason="set MKSIM_TEST_POSTGRES_URL (.ci/run starts a PostgreSQL server and sets it)")
def test_two_workers_fill_one_postgresql_study():
    assert PG, "CI must provide a PostgreSQL server: .ci/run sets MKSIM_TEST_POSTGRES_URL"
    study = f"two-workers-{os.getpid()}-{int(time.time())}"
    args = [sys.executable, "-m", "mksim", "search", "--trials", "40", "--storage", PG, "--study", study, "--json"]
    procs = [subprocess.Popen(args + ["--seed", str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    done = counted(PG, study)
    assert 40 <= len(done) <= 41  # each worker stops once the study holds 40; one may be mid-trial then
    workers = {t.user_attrs.get("worker") for t in done if t.user_attrs.get("worker")}
    assert len(workers) == 2, workers
    res = [json.loads(o[0]) for o in outs]
    assert res[0]["best"]["latency_us"] >= min(r["best"]["latency_us"] for r in res)


def test_a_study_from_another_search_space_is_refused_in_one_line(tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    st = optuna.create_study(study_name="old", storage=url)
    st.set_user_attr("problem", {"model": "llama-3.2-1b", "gpu": "h200-datasheet", "batch": 1, "kv_len": 1024,
                                 "phase": "decode", "objectives": ["latency"]})
    r = cli("search", "--storage", url, "--study", "old", "--trials", "30")
    assert r.returncode == 2 and "another version of the search space" in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_cli_errors_are_one_line(tmp_path):
    for args, text in ((["--objective", "speed"], "objective"),
                       (["--trials", "5"], "--trials must be at least"),
                       (["--model", "llama-9"], "llama-9"),
                       (["--storage", "nosuchdb://x"], "cannot open study storage")):
        r = cli("search", "--storage", f"sqlite:///{tmp_path}/e.db", *args) if "--storage" not in args else \
            cli("search", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert text in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr


@pytest.mark.slow  # 1.4 s of CPU
def test_the_fused_trial_takes_the_kv_split_the_model_prefers():
    from mksim import simulate
    from mksim.search._space import FUSED_MEGAKERNEL, KV_SPLIT_MULT
    from mksim.search._study import _simulated, fused_kv_split
    gpu = hwmodels.load("h200-mk-kernels")
    problem = Problem("llama-3.2-1b", gpu)
    params = baseline_params(gpu)[FUSED_MEGAKERNEL]
    assert params["kv_split_mult"] == 1.0
    chosen = fused_kv_split(problem, params)
    assert {k: v for k, v in chosen.items() if k != "kv_split_mult"} == {k: v for k, v in params.items()
                                                                          if k != "kv_split_mult"}

    def candidate(m: float):
        return suggest(optuna.trial.FixedTrial({**params, "kv_split_mult": m}), gpu)

    # what fused_kv_split simulated, kept for the fused trial (which takes its numbers instead of simulating again)
    times = {m: _simulated(candidate(m), problem)[0] for m in KV_SPLIT_MULT}
    assert times[chosen["kv_split_mult"]] == min(times.values()) < times[1.0]  # 15 splits beat the default 5
    for m in (1.0, chosen["kv_split_mult"]):  # the kept numbers are a simulation's
        assert simulate(build(candidate(m), problem), timeline=False).latency_us == times[m]
    fixed = {k: v for k, v in params.items() if k != "kv_split_mult"}
    assert fused_kv_split(problem, fixed) == fixed  # a split the study fixes stays


def _open_files(path) -> list[str]:
    """This process's file descriptors open on ``path`` or its WAL files (Linux: /proc/self/fd)."""
    names = {str(path), f"{path}-wal", f"{path}-shm"}
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if target in names:
            fds.append(target)
    return fds


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self/fd")
def test_no_sqlite_file_is_open_when_workers_fork_or_once_the_search_returns(tmp_path, gpu, monkeypatch):
    """A worker forked with the study's file open would inherit SQLite's state of it without its locks
    (mksim.search._storage.release); a library caller keeps no connection once search() returns."""
    from mksim.search import _study

    db, seen = tmp_path / "w.db", tmp_path / "seen"
    real = _study._work_in_child

    def child(parent, *args):  # in the forked worker, before it opens anything
        seen.with_suffix(f".{os.getpid()}").write_text(json.dumps(_open_files(db)))
        real(parent, *args)

    monkeypatch.setattr(_study, "_work_in_child", child)
    res = search(MODEL, gpu, trials=N_BASE, storage=f"sqlite:///{db}", workers=2)
    assert res.n_complete + res.n_pruned >= N_BASE
    inherited = [json.loads(p.read_text()) for p in tmp_path.glob("seen.*")]
    assert len(inherited) == 2 and inherited == [[], []], inherited
    assert _open_files(db) == []

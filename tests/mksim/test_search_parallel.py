"""``mksim search --tp/--ep``: a tensor-parallel step's space samples how its all-reduces run, its baselines
include each way, its study is named and recorded by the split, and every schedule reports its communication.

The searches search the tiny model (tests/mksim/searchkit.py) on a 16-SM H200, as tests/mksim/test_search.py
does."""

from __future__ import annotations

import json

import pytest

optuna = pytest.importorskip("optuna")

import hwmodels  # noqa: E402
import mksim  # noqa: E402
from mksim.errors import MksimError  # noqa: E402
from mksim.search import Problem, baseline_params, build, default_study_name, implied_designs, search, suggest  # noqa: E402
from mksim.search._space import model_label  # noqa: E402
from mksim.search._study import _open_study, storage_for  # noqa: E402
from mksim.workload import Step  # noqa: E402
from tests.clirun import mksim as run_cli  # noqa: E402
from tests.mksim.searchkit import TINY_MODEL, small_gpu  # noqa: E402

MODEL = str(TINY_MODEL)
CFG = mksim.models.config_from_hf(MODEL)  # what a Problem takes (mksim.search.study_model)
IN_KERNEL = ("one_shot", "push", "two_shot")  # tp_boundary, tp_overlap, tp_two_shot: the designs' names sorted


@pytest.fixture(scope="module")
def gpu(tmp_path_factory) -> str:
    return str(small_gpu(tmp_path_factory.mktemp("gpu")))


def test_a_tensor_parallel_space_samples_how_its_all_reduces_run(gpu):
    g = hwmodels.load(gpu)
    designs = implied_designs(Step(MODEL, tp=2), g)
    assert designs == ("tp_boundary", "tp_overlap", "tp_two_shot")  # the multicast what-if only when named
    assert implied_designs(Step(MODEL), g) == implied_designs(Step("qwen3-30b-a3b", ep=2), g) == ()
    base = baseline_params(g, designs=designs)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(2):  # the default megakernel, its collective left to the sampler
        study.enqueue_trial({k: v for k, v in base["megakernel:dag"].items() if k != "collective"})
    trial = study.ask()
    cand = suggest(trial, g, designs=designs)
    assert trial.distributions["collective"].choices == IN_KERNEL
    assert cand.options["collective"] == trial.params["collective"]
    one = study.ask()
    suggest(one, g)  # a step on one GPU: nothing to choose
    assert "collective" not in one.distributions
    # the baselines run the megakernel's own one-shot; each other way adds the default megakernel running it
    assert {base[f"megakernel:{p}"]["collective"] for p in ("rr", "dag")} == {"one_shot"}
    assert (base["megakernel:overlap"]["collective"], base["megakernel:two_shot"]["collective"]) == ("push",
                                                                                                     "two_shot")
    assert {k: v for k, v in base["megakernel:overlap"].items() if k != "collective"} == {
        k: v for k, v in base["megakernel:dag"].items() if k != "collective"}
    assert all("collective" not in p for n, p in base.items() if not n.startswith(("megakernel", "fused")))
    # what a trial chose is what its schedule runs
    problem = Problem(CFG, g, tp=2, designs=designs)
    for c in IN_KERNEL:
        sched = build(suggest(optuna.trial.FixedTrial(base["megakernel:dag"] | {"collective": c}), g,
                              designs=designs), problem)
        assert sched.options.collective == c and "tp2" in sched.workload.name


def test_study_names_and_records_carry_the_split(gpu, tmp_path):
    g = hwmodels.load(gpu)
    names = {(tp, ep): default_study_name(Problem(CFG, g, tp=tp, ep=ep, designs=implied_designs(
        Step(MODEL, tp=tp), g)), ("latency",)) for tp, ep in ((1, 1), (2, 1), (4, 1))}
    assert names[(1, 1)] == f"{model_label(CFG)}-h200-datasheet-16sm-b1-kv1024-latency"  # as before the split
    assert (names[(2, 1)], names[(4, 1)]) == (names[(1, 1)] + "-tp2", names[(1, 1)] + "-tp4")
    url = f"sqlite:///{tmp_path}/s.db"
    _, st = storage_for(url, "s")
    _open_study(Problem(CFG, g, tp=2), ("latency",), st, "s", 0)
    with pytest.raises(MksimError, match=r"searches tiny-llama-\w+ on h200-datasheet-16sm, batch 1, KV 1024, "
                                         r"latency, phase decode, tp 2, not tiny-llama-\w+ on h200-datasheet-16sm, "
                                         r"batch 1, KV 1024, latency, phase decode; pick another --study name"):
        _open_study(Problem(CFG, g), ("latency",), st, "s", 0)


@pytest.mark.slow  # about 3 s of CPU
def test_a_tp_search_reports_each_schedules_communication(gpu, tmp_path):
    n = len(baseline_params(hwmodels.load(gpu), designs=implied_designs(Step(MODEL, tp=2), hwmodels.load(gpu))))
    res = search(MODEL, gpu, tp=2, trials=n + 3, seed=3, storage="memory")
    d = res.to_dict()
    assert d["tp"] == 2 and "ep" not in d and d["study"].endswith("-tp2")
    assert res.designs == ("tp_boundary", "tp_overlap", "tp_two_shot")
    assert {"megakernel:overlap", "megakernel:two_shot", "graph", "graph_pdl"} <= set(res.baselines)
    assert all(b["communication_us"] > 0 for b in (res.best, *res.baselines.values()))
    # NCCL between kernels against the one-shot through peer memory
    assert res.baselines["graph"]["communication_us"] > 5 * res.baselines["megakernel:dag"]["communication_us"]
    assert res.best["candidate"]["options"]["collective"] in IN_KERNEL
    # the baseline is the schedule it names: its latency and communication are a simulation's
    wl = mksim.models.workload(mksim.Step(CFG, tp=2), n_sms=16)
    direct = mksim.simulate(mksim.build_schedule(wl, gpu, "megakernel", collective="push"))
    assert res.baselines["megakernel:overlap"]["latency_us"] == pytest.approx(direct.latency_us, rel=1e-12)
    assert res.baselines["megakernel:overlap"]["communication_us"] == pytest.approx(direct.communication_us,
                                                                                    rel=1e-12)
    assert res.shape.endswith("batch 1, KV 1024, tp 2")


@pytest.mark.slow  # a search of the tiny model in a child process, about 4 s
def test_cli_search_tp_json_and_table(gpu, tmp_path):
    n = len(baseline_params(hwmodels.load(gpu), designs=implied_designs(Step(MODEL, tp=2), hwmodels.load(gpu))))
    p = run_cli("search", "--model", MODEL, "--gpu", gpu, "--tp", "2", "--trials", str(n), "--storage", "memory",
                "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["tp"] == 2 and d["best"]["communication_us"] > 0
    p = run_cli("search", "--model", MODEL, "--gpu", gpu, "--tp", "2", "--trials", str(n), "--storage", "memory")
    flat = " ".join(p.stdout.split())  # the title wraps
    assert p.returncode == 0 and "batch 1, KV 1024, tp 2: search" in flat and "communication µs" in flat


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "llama-3.1-8b", "--tp", "3"], "error: --tp 3 does not divide llama-3.1-8b's 32 attention heads; "
                                               "use one of 1, 2, 4, 8\n"),
    (["--model", "llama-3.1-8b", "--tp", "16"], "error: --tp 16 does not divide llama-3.1-8b's 8 KV heads; "
                                                "use one of 1, 2, 4, 8\n"),
    (["--model", "llama-3.1-8b", "--ep", "2"], "error: --ep 2: llama-3.1-8b is a dense model (no experts to split); "
                                               "use --tp\n"),
    (["--model", "qwen3-30b-a3b", "--tp", "4", "--ep", "4", "--batch", "4"],
     "error: --tp 4 --ep 4 needs 16 GPUs (tp × ep) but a h200-datasheet node has 8; use at most 8\n"),
    (["--model", "llama-3.1-8b", "--tp", "0"], "error: tp (tensor-parallel degree) must be a positive integer, "
                                               "got 0\n"),
])
def test_cli_search_refuses_a_bad_split_in_one_line(args, message, tmp_path):
    p = run_cli("search", "--gpu", "h200-datasheet", "--storage", f"sqlite:///{tmp_path}/x.db", *args)
    assert (p.returncode, p.stderr) == (2, message)
    assert not (tmp_path / "x.db").exists()  # refused before any study is made

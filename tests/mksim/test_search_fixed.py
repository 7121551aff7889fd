"""Search with fixed schedule options (what a generated kernel needs): never sampled, kept by
every candidate, counted by the shared-memory check, recorded in the study."""

from __future__ import annotations

import json
import re

import pytest

optuna = pytest.importorskip("optuna")

import hwmodels  # noqa: E402
from mksim.errors import MksimError  # noqa: E402
from mksim.search import Problem, baseline_params, build, search, suggest  # noqa: E402
from mksim.search._space import check_fixed  # noqa: E402

GPU = hwmodels.load("h200-calibrated")
MK = {"mode": "megakernel", "policy": "rr", "order": "op", "sync": "counter", "fuse_norm": False, "split_qkv": False,
      "split_gate_up": False, "fuse_rope": False, "fuse_silu": False, "l2_prefetch_KiB": 0.0,
      "kv_split_mult": 1.0, "grain_small": 1.0,
      **{f"grain_{r}": 1.0 for r in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")}}


def test_check_fixed_types_and_one_line_errors():
    assert check_fixed({"smem_reserve_KiB": "80", "blocks_per_sm": 1.0, "sync": "flag"}) == {
        "blocks_per_sm": 1, "smem_reserve_KiB": 80.0, "sync": "flag"}
    assert check_fixed(None) == {}
    for bad, match in (({"smem_KiB": 1}, "cannot fix 'smem_KiB'"), ({"record": True}, "cannot fix 'record'"),
                       ({"prefetch_depth": 2.5}, "needs an integer"), ({"page_KiB": "big"}, "needs a number"),
                       ({"sync": "fence"}, "sync must be one of")):
        with pytest.raises(MksimError, match=match):
            check_fixed(bad)


def test_fixed_reserve_is_counted_and_fixed_fields_are_not_sampled():
    fixed = {"smem_reserve_KiB": 128.0}
    with pytest.raises(optuna.TrialPruned, match=r"128 KiB reserved exceed the 227 KiB"):
        suggest(optuna.trial.FixedTrial({**MK, "page_KiB": 32, "prefetch_depth": 4}), GPU, fixed=fixed)
    cand = suggest(optuna.trial.FixedTrial({**MK, "page_KiB": 32, "prefetch_depth": 3}), GPU, fixed=fixed)
    assert cand.options["smem_reserve_KiB"] == 128.0 and cand.smem_KiB() == 3 * 32 + 128
    # page_KiB fixed: the trial need not (and does not) choose it
    cand = suggest(optuna.trial.FixedTrial({**MK, "prefetch_depth": 5}), GPU, fixed={"page_KiB": 16.0})
    assert cand.options["page_KiB"] == 16.0
    sched = build(cand, Problem("llama-3.2-1b", GPU, fixed={"page_KiB": 16.0}))
    assert sched.options.page_KiB == 16.0 and sched.options.prefetch_depth == 5
    chain = suggest(optuna.trial.FixedTrial({"mode": "graph", "chain_tasks_per_sm": 2.0, "fuse_norm": False,
                                             "fuse_rope": False, "fuse_silu": False}), GPU, "graph",
                    fixed={"blocks_per_sm": 1})
    assert chain.options == {"tasks_per_sm": 2.0, "blocks_per_sm": 1}


def test_baselines_with_fixed_options():
    assert baseline_params(GPU) == baseline_params(GPU, {})  # nothing fixed: the usual 25
    big = baseline_params(GPU, {"smem_reserve_KiB": 128.0})
    assert all(big[f"megakernel:{p}"]["prefetch_depth"] == 3 for p in ("rr", "dag"))  # 3 x 32 + 128 <= 227
    one = baseline_params(GPU, {"blocks_per_sm": 1})
    assert sorted(k for k in one if k.startswith("graph:")) == ["graph:1x1", "graph:4x1", "graph:fused"]
    assert "chain_blocks_per_sm" not in one["graph"] and one["graph"]["chain_tasks_per_sm"] == 2.0


@pytest.mark.slow
def test_study_records_fixed_options_and_refuses_others(tmp_path):
    from tests.mksim.searchkit import TINY_MODEL, small_gpu

    gpu = str(small_gpu(tmp_path, extends="h200-calibrated"))  # the calibrated H200's space, cheaper trials
    model = str(TINY_MODEL)  # the study's records are the point, not the model: 2 layers
    url = f"sqlite:///{tmp_path}/s.db"
    n = len(baseline_params(hwmodels.load(gpu), {"smem_reserve_KiB": 80.0}))
    res = search(model, gpu, batch=4, trials=n + 2, seed=0, storage=url, study_name="v",
                 fixed={"smem_reserve_KiB": 80}, out=tmp_path / "best.json")
    assert res.fixed == {"smem_reserve_KiB": 80.0} and res.to_dict()["fixed"] == res.fixed
    assert res.best["candidate"]["options"]["smem_reserve_KiB"] == 80.0
    assert json.loads((tmp_path / "best.json").read_text())["options"]["smem_reserve_KiB"] == 80.0
    with pytest.raises(MksimError, match="made with fixed options smem_reserve_KiB=80, not smem_reserve_KiB=96"):
        search(model, gpu, batch=4, trials=n + 2, storage=url, study_name="v",
               fixed={"smem_reserve_KiB": 96})
    with pytest.raises(MksimError, match="made with fixed options smem_reserve_KiB=80, not none"):
        search(model, gpu, batch=4, trials=n + 2, storage=url, study_name="v")
    # the default study name carries the fixed values: another value is another study
    other = search(model, gpu, batch=4, trials=n, storage=url, fixed={"smem_reserve_KiB": 96})
    assert other.study_name.endswith("-smem_reserve_KiB=96")


@pytest.mark.slow
def test_cli_fix_option(tmp_path):
    from tests.clirun import mksim
    from tests.mksim.searchkit import TINY_MODEL, small_gpu

    def cli(*args):
        return mksim("search", "--model", str(TINY_MODEL), "--storage", "memory", *args)

    r = cli("--fix", "smem_reserve_KiB")
    assert r.returncode == 2 and r.stderr == "error: --fix takes key=value, got 'smem_reserve_KiB'\n"
    r = cli("--fix", "warp_count=4")
    assert r.returncode == 2 and r.stderr.startswith("error: cannot fix 'warp_count'") and r.stderr.count("\n") == 1
    r = cli("--gpu", str(small_gpu(tmp_path)), "--kv-len", "64", "--fix", "smem_reserve_KiB=64", "--trials", "26",
            "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["fixed"] == {"smem_reserve_KiB": 64.0}


def paged_profile(tmp_path, page_us: float | None):
    """The calibrated H200 with mksim's profile, with a cost per page of its matmul (or none)."""
    text = hwmodels.resolve_profile("mksim").read_text()
    text = re.sub(r"(?m)^page_us = .*\n", "", text)  # the shipped profile prices pages: start from none
    if page_us is not None:
        text = text.replace("[runtime.kernels.matmul]\n",
                            f'[runtime.kernels.matmul]\npage_us = {{ value = {page_us}, source = "calibration" }}\n')
    p = tmp_path / f"paged-{page_us}.toml"
    p.write_text(text)
    return hwmodels.load("h200-calibrated", profile=str(p))


def test_the_ring_is_searched_only_where_the_profile_prices_pages(tmp_path):
    from mksim.search import pages_costed, ring_fixed

    plain, unpriced, priced = GPU, paged_profile(tmp_path, None), paged_profile(tmp_path, 0.2)
    assert [pages_costed(g) for g in (plain, unpriced, priced)] == [True, False, True]
    # a ring without a cost per page: every candidate keeps the ring its single ops ran with
    assert ring_fixed(unpriced, {"smem_reserve_KiB": 44.0}) == {"smem_reserve_KiB": 44.0, "page_KiB": 32.0,
                                                                "prefetch_depth": 4}
    cand = suggest(optuna.trial.FixedTrial(MK), unpriced, fixed={"smem_reserve_KiB": 44.0})
    assert (cand.options["page_KiB"], cand.options["prefetch_depth"]) == (32.0, 4)
    base = baseline_params(unpriced, {"smem_reserve_KiB": 44.0})["megakernel:rr"]
    assert "page_KiB" not in base and "prefetch_depth" not in base
    chain = suggest(optuna.trial.FixedTrial({"mode": "graph", "chain_tasks_per_sm": 2.0, "chain_blocks_per_sm": 1,
                                             "fuse_norm": False,
                                             "fuse_rope": False, "fuse_silu": False}), unpriced, mode="graph")
    assert "page_KiB" not in chain.options and "prefetch_depth" not in chain.options  # chains keep their defaults
    # with page_us, 8 KiB pages in rings of 16 are candidates, and the baselines name their ring
    cand = suggest(optuna.trial.FixedTrial({**MK, "page_KiB": 8, "prefetch_depth": 16}), priced,
                   fixed={"smem_reserve_KiB": 44.0})
    assert (cand.options["page_KiB"], cand.options["prefetch_depth"]) == (8.0, 16)
    assert baseline_params(priced, {"smem_reserve_KiB": 44.0})["megakernel:rr"]["page_KiB"] == 32
    # a ring fixed by the caller is kept as given
    assert ring_fixed(unpriced, {"page_KiB": 16.0, "prefetch_depth": 8}) == {"page_KiB": 16.0, "prefetch_depth": 8}
    assert ring_fixed(unpriced, {"page_KiB": 64.0})["prefetch_depth"] == 3

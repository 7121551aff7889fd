"""The answer published in docs/stacks.md, and the profiles' validation records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hwmodels
from validation.stacks import answer, cli, records

ROOT = Path(__file__).resolve().parents[2]
ANSWER = ROOT / answer.JSON
DOCS = ROOT / "docs/stacks.md"


# -- records ---------------------------------------------------------------------------------------


def test_p90_and_stats_are_closed_form():
    errs = [1.0, -2.0, 3.0, -4.0, 10.0]
    assert records.p90_abs(errs) == 10.0          # ceil(4.5) = 5th smallest of 5
    assert records.p90_abs([float(i) for i in range(1, 21)]) == 18.0
    assert records.stats(errs) == {"cases": 5, "mape_pct": 4.0, "bias_pct": 1.6, "p90_abs_pct": 10.0,
                                   "max_abs_pct": 10.0}
    assert records.inside_pct([1.0, -5.0, 2.0, 9.0], [1.0, -2.0, 3.0, -4.0, 5.0]) == 75.0  # p90 5: 9 is out


def test_the_committed_records_are_the_summaries():
    assert records.write(check=True) == []
    recs = records.records()
    for prof, rec in recs.items():
        assert hwmodels.profile_info(prof)["validation"] == rec
    stacks = json.loads((ROOT / records.STACKS_SUMMARY).read_text())
    torch = [c["error_pct"] for c in stacks["cases"] if c["stack"] == "torch_graph"]
    assert recs["torch"]["cases"] == len(torch) and recs["torch"]["max_abs_pct"] == max(abs(e) for e in torch)


def test_a_record_replaces_the_old_one_and_the_fit_text_stays():
    text = "schema_version = 1\n[sources.x]\nkind = \"measured\"\n"
    once = records.with_record(text, {"cases": 2, "source": "s"})
    assert records.without_record(once) == text
    assert records.with_record(once, {"cases": 3, "source": "s"}).count("[validation]") == 1
    assert records.with_record(once, {"cases": 2, "source": "s"}) == once


# -- the answer -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def committed():
    return json.loads(ANSWER.read_text())


def test_the_page_shows_the_committed_answer(committed):
    text = DOCS.read_text()
    assert text.split(answer.START)[1].split(answer.END)[0].strip() == answer.tables(committed)
    rows = text.split(records.DOCS_START)[1].split(records.DOCS_END)[0].strip()
    assert rows == records.table_rows(records.records())
    assert {r["gpu"] for r in committed["rows"]} == set(answer.GPUS)
    assert len(committed["rows"]) == len(answer.GPUS) * len(answer.MODELS) * len(answer.BATCHES)


@pytest.mark.parametrize("gpu, model, batch", [("h200-calibrated", "llama-3.2-1b", 1), ("h100", "llama-3.2-1b", 8)])
@pytest.mark.slow  # 2.2 s of CPU
def test_cases_of_the_answer_simulate_again(committed, gpu, model, batch):
    row = next(r for r in committed["rows"] if (r["gpu"], r["model"], r["batch"]) == (gpu, model, batch))
    for col, prof, mode in [("torch_graph", "torch", "graph"), ("megakernel_mksim", "mksim", "megakernel"),
                            ("megakernel_best", None, "megakernel")]:
        assert answer.predict_one((model, batch, gpu, prof, mode)) == row[col]
    sp = row["speedup_mksim_vs_torch_graph"]
    assert sp["x"] == round(row["torch_graph"]["us"] / row["megakernel_mksim"]["us"], 2)
    assert row["megakernel_best"]["interval_us"] is None and row["speedup_best_vs_torch_graph"]["interval"] is None
    assert row["torch_graph"]["transfer"] == (gpu != "h200-calibrated")


def test_measured_speedups_only_where_both_sides_ran(committed):
    stacks, mk = answer.measured()
    assert mk[("llama-3.2-1b", 1, 1024)] == pytest.approx(1159.26, abs=0.01)
    assert mk[("llama-3.2-1b", 8, 1024)] == pytest.approx(1729.68, abs=0.01)  # the suite's, no longer h200-b8
    have = {(r["model"], r["batch"]) for r in committed["rows"] if "measured_vs_torch_graph" in r}
    assert have == {("llama-3.2-1b", 1), ("llama-3.2-1b", 8), ("llama-3.1-8b", 1)}
    for r in committed["rows"]:
        if "measured_vs_torch_graph" in r:
            assert r["gpu"] == "h200-calibrated"
            m = r["measured_vs_inductor_graph"]
            assert m["x"] == round(stacks[("inductor_graph", r["model"], r["batch"], 1024)] / m["megakernel_us"], 2)
            for stack in ("torch_graph", "inductor_graph"):   # docs/stacks.md: all six inside their interval
                lo, hi = r[f"speedup_mksim_vs_{stack}"]["interval"]
                assert lo <= r[f"measured_vs_{stack}"]["x"] <= hi


def test_a_refused_case_is_a_dash_with_its_reason():
    refused = answer.predict_one(("no-such-model", 1, "h200-calibrated", None, "graph"))
    assert set(refused) == {"refused"} and "no-such-model" in refused["refused"]
    ok = {"us": 100.0, "interval_us": None, "half_width_pct": None, "transfer": False}
    a = {"measured_on": "h200-calibrated", "kv_len": 1024, "gpus": ["h100"],
         "rows": [{"gpu": "h100", "model": "m", "batch": 64, "torch_graph": ok, "inductor_graph": ok,
                   "megakernel_mksim": refused, "megakernel_best": ok,
                   "speedup_best_vs_torch_graph": {"x": 1.0, "interval": None, "verdict": "faster (interval unknown)"},
                   "speedup_best_vs_inductor_graph": {"x": 1.0, "interval": [0.9, 1.2], "verdict": "tie"}}]}
    t = answer.table(a, "h100")
    assert "transfer of the H200 profiles, unvalidated" in t
    assert "| m | 64 | 100 | 100 | — | — | — |  | 100 | 1.00× | 1.00× (0.90-1.20) tie |" in t
    assert t.endswith(f"- — m B64 megakernel_mksim: {refused['refused']}")


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    assert cli.main(["answer", "--docs", str(tmp_path / "nope" / "x.md")]) == 2
    (tmp_path / "page.md").write_text("no markers\n")
    assert cli.main(["answer", "--docs", str(tmp_path / "page.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("error: ") for e in err) and "markers" in err[1]
    assert cli.main(["records", "--check"]) == 0


def test_the_json_is_a_row_a_line_and_reads_back(committed):
    text = answer.to_json(committed)
    assert json.loads(text) == committed and text == ANSWER.read_text()
    assert sum(1 for line in text.splitlines() if line.lstrip().startswith('{"gpu"')) == len(committed["rows"])

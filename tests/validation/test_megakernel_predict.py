"""validation.megakernel.predict: the steps of the runner's --json files, predicted without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validation.megakernel import predict

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "validation" / "results" / "evidence" / "h200-pages"


@pytest.mark.skipif(not (PAGES / "pages-p8-d16.json").is_file(), reason="no page evidence in this checkout")
def test_predicts_each_row_as_the_runner_built_it(tmp_path, capsys):
    rows = json.loads((PAGES / "pages-p8-d16.json").read_text())
    got = predict.predict_rows(rows + [{"mode": "stream", "error": "refused"}], "h200-calibrated+mksim")
    assert [(p["mode"], p["page_KiB"], p["depth"]) for p in got] == [("megakernel", 8.0, 16), ("graph", 8.0, 16)]
    for p, r in zip(got, rows, strict=True):
        assert p["measured_us"] == r["measured_us"]
        assert p["error_pct"] == pytest.approx(100 * (p["predicted_us"] / r["measured_us"] - 1))
    out = tmp_path / "pred.json"
    assert predict.main([str(PAGES / "pages-p8-d16.json"), "--json", str(out)]) == 0
    assert "2 steps on h200-calibrated+mksim: MAPE" in capsys.readouterr().out
    assert len(json.loads(out.read_text())) == 2


def test_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert predict.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "expected the list of rows" in err and err.count("\n") == 1

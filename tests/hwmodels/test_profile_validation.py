"""A profile's [validation] record: parsed by the loader, checked in one line, optional."""

from __future__ import annotations

from pathlib import Path

import pytest

import hwmodels
from hwmodels.errors import HardwareFileError

TORCH = hwmodels.resolve_profile("torch")


def profile_with(tmp_path: Path, validation: str) -> Path:
    """The torch profile with its record replaced by ``validation`` (a TOML table's text, or "")."""
    text = TORCH.read_text().split("\n[validation]")[0]
    p = tmp_path / "mine.toml"
    p.write_text(text.replace('profile = "torch"', 'profile = "mine"') + "\n" + validation)
    return p


RECORD = ('[validation]\ncases = 3\nmape_pct = 2.0\nbias_pct = -1.0\np90_abs_pct = 3.5\nmax_abs_pct = 4.0\n'
          'gpu = "h200-calibrated"\nsource = "somewhere/summary.json"\ncommand = "make it"\n')


@pytest.mark.parametrize("name", hwmodels.profiles())
def test_every_committed_profile_has_a_record(name):
    v = hwmodels.profile_info(name)["validation"]
    assert v["cases"] >= 1 and 0 < v["p90_abs_pct"] <= v["max_abs_pct"]
    assert v["mape_pct"] <= v["max_abs_pct"] and abs(v["bias_pct"]) <= v["mape_pct"] + 1e-9
    assert Path(hwmodels.__file__).parents[1].joinpath(v["source"]).is_file()


def test_a_record_is_parsed_and_a_profile_without_one_loads(tmp_path):
    p = profile_with(tmp_path, RECORD)
    assert hwmodels.profile_info(p)["validation"] == {
        "cases": 3, "mape_pct": 2.0, "bias_pct": -1.0, "p90_abs_pct": 3.5, "max_abs_pct": 4.0,
        "gpu": "h200-calibrated", "source": "somewhere/summary.json", "command": "make it"}
    assert hwmodels.load("h200-calibrated", profile=str(p)).profile == "mine"
    bare = profile_with(tmp_path, "")
    assert hwmodels.profile_info(bare)["validation"] is None
    assert hwmodels.load("h200-calibrated", profile=str(bare)).profile == "mine"


@pytest.mark.parametrize("change, msg", [
    (("cases = 3", "cases = 0"), "validation.cases must be at least 1"),
    (("cases = 3", "cases = 2.5"), "validation.cases must be a whole number >= 0"),
    (("p90_abs_pct = 3.5", "p90_abs_pct = -3.5"), "validation.p90_abs_pct must be a number >= 0"),
    (("mape_pct = 2.0", 'mape_pct = "2"'), "validation.mape_pct must be a number >= 0"),
    (("command = \"make it\"\n", ""), "validation.command missing"),
    (("gpu = ", "gpus = "), "unknown key validation.gpus"),
    (('source = "somewhere/summary.json"', 'source = ""'), "validation.source must be a non-empty string"),
])
def test_a_bad_record_fails_in_one_line_naming_the_key(tmp_path, change, msg):
    p = profile_with(tmp_path, RECORD.replace(*change))
    for load in (lambda: hwmodels.profile_info(p), lambda: hwmodels.load("h200-calibrated", profile=str(p))):
        with pytest.raises(HardwareFileError) as e:
            load()
        assert msg in str(e.value) and "\n" not in str(e.value) and str(p) in str(e.value)

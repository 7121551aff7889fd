"""``mksim search --model CONFIG.json``: a Hugging Face config is searched as a built-in model is (study
name, resume, best-schedule file, workers, designs, a mixture of experts' routing), and a bad file is one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

optuna = pytest.importorskip("optuna")

import hwmodels  # noqa: E402
from mksim import models  # noqa: E402
from mksim.errors import MksimError  # noqa: E402
from mksim.search import baseline_params, default_study_name, search  # noqa: E402
from mksim.search._space import Problem, check_fixed, model_label, study_model  # noqa: E402
from tests.clirun import ROOT, as_from_a_terminal, mksim  # noqa: E402
from tests.mksim.searchkit import TINY_MODEL, small_gpu  # noqa: E402
from tests.mksim.test_bad_inputs import assert_one_line, run_cli  # noqa: E402

FIX = {"tasks_per_sm": 2, "blocks_per_sm": 2}  # one chain candidate per mode: the fewest enqueued trials
TINY_MOE = {"model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096, "num_local_experts": 8,
            "num_experts_per_tok": 2}


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(small_gpu(tmp_path_factory.mktemp("gpu")))


def least(gpu: str, designs: tuple[str, ...] = ()) -> int:
    return len(baseline_params(hwmodels.load(gpu), check_fixed(FIX), designs))


def fix_args() -> list[str]:
    return [a for k, v in FIX.items() for a in ("--fix", f"{k}={v}")]


def test_a_config_is_read_and_named_by_its_contents(tmp_path: Path) -> None:
    cfg = study_model(str(TINY_MODEL))
    assert isinstance(cfg, models.ModelConfig) and (cfg.name, cfg.num_layers) == ("tiny-llama", 2)
    label = model_label(cfg)
    assert label.startswith("tiny-llama-") and len(label) == len("tiny-llama-") + 8
    # the same file elsewhere: the same study; another file of the same name: another study
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(TINY_MODEL, tmp_path / "a" / "tiny-llama.json")
    other = {**json.loads(TINY_MODEL.read_text()), "num_hidden_layers": 3}
    (tmp_path / "b" / "tiny-llama.json").write_text(json.dumps(other))
    assert model_label(study_model(str(tmp_path / "a" / "tiny-llama.json"))) == label
    assert model_label(study_model(str(tmp_path / "b" / "tiny-llama.json"))) != label
    # two folders' config.json take their folder's name
    shutil.copy(TINY_MODEL, tmp_path / "a" / "config.json")
    assert model_label(study_model(str(tmp_path / "a" / "config.json"))).startswith("a-")
    # a config equal to a built-in is that built-in; a name that is no file name is made one
    assert study_model(models.get("qwen3-8b")) == "qwen3-8b"
    odd = replace(cfg, name="org/tiny llama")
    assert model_label(odd).startswith("org_tiny_llama-")
    g = hwmodels.load("h200-datasheet")
    assert default_study_name(Problem(odd, g), ("latency",)).startswith(model_label(odd) + "-h200-datasheet-b1-")


@pytest.mark.slow  # 2 searches of the tiny model: 2.8 s of CPU
def test_cli_searches_a_config_resumes_it_and_its_best_schedule_simulates(gpu: str, tmp_path: Path) -> None:
    n = least(gpu)
    best = tmp_path / "best.json"
    argv = ["search", "--model", str(TINY_MODEL), "--gpu", gpu, "--kv-len", "64", *fix_args(), "--json"]
    r = mksim(*argv, "--trials", str(n), "--out", str(best), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    name = (f"{model_label(study_model(str(TINY_MODEL)))}-h200-datasheet-16sm-b1-kv64-latency-blocks_per_sm=2-"
            "tasks_per_sm=2")
    assert got["study"] == name and (tmp_path / f"{name}.db").exists()
    sim = mksim("simulate", "--schedule", str(best), "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["latency_us"] == got["best"]["latency_us"]  # exactly
    assert json.loads(best.read_text())["workload"]["model"]["num_hidden_layers"] == 2  # the config, not a name
    # the same command with more trials resumes the same study (same file, same study)
    again = mksim(*argv, "--trials", str(n + 2), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    res = json.loads(again.stdout)
    assert res["study"] == name and sum(res["trials"].values()) == n + 2
    url = f"sqlite:///{tmp_path / name}.db"
    problem = optuna.load_study(study_name=name, storage=url).user_attrs["problem"]
    assert problem["model"] == name.split("-h200")[0] and problem["config"]["num_layers"] == 2


@pytest.mark.slow  # a search, then a refusal: 1.5 s of CPU
def test_another_config_under_a_study_name_is_refused_and_the_explorer_rebuilds_its_best(tmp_path: Path) -> None:
    from explorer.data import best_schedule_json
    from mksim import Schedule, simulate

    url, gpu = f"sqlite:///{tmp_path}/s.db", "h200-datasheet"  # a GPU the explorer knows by name
    cfg = study_model(str(TINY_MODEL))
    assert isinstance(cfg, models.ModelConfig)
    res = search(cfg, gpu, kv_len=64, trials=least(gpu), storage=url, study_name="s", fixed=dict(FIX))
    wider = replace(cfg, intermediate_size=2048)
    with pytest.raises(MksimError, match=rf"study 's' in this storage searches {model_label(cfg)} on .*, not "
                                         rf"{model_label(wider)} on .*; pick another --study name"):
        search(wider, gpu, kv_len=64, trials=least(gpu), storage=url, study_name="s", fixed=dict(FIX))
    # the explorer rebuilds the study's best schedule from the config the study records
    rebuilt = Schedule.from_json(best_schedule_json(url, "s"))
    assert rebuilt.workload.model == cfg
    assert simulate(rebuilt, timeline=False).latency_us == res.best["latency_us"]


@pytest.mark.slow  # 2 workers, two designs, a mixture of experts: 5.5 s of CPU
def test_a_moe_config_with_designs_routing_and_workers(gpu: str, tmp_path: Path) -> None:
    moe = tmp_path / "tiny-moe.json"
    moe.write_text(json.dumps(TINY_MOE))
    best = tmp_path / "best.json"
    r = mksim("search", "--model", str(moe), "--gpu", gpu, "--kv-len", "64", "--batch", "4", *fix_args(),
              "--routing", "zipf:1.2", "--designs", "sentinel,moe_stride", "--workers", "2", "--trials", "24",
              "--storage", f"sqlite:///{tmp_path}/m.db", "--out", str(best), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["study"].startswith("tiny-moe-") and got["study"].endswith(
        "-designs=moe_stride+sentinel-routing=zipf:1.2")
    assert {"megakernel:sentinel", "megakernel:moe_stride"} <= set(got["baselines"])
    spec = json.loads(best.read_text())["workload"]
    assert spec["model"]["num_local_experts"] == 8 and spec["routing"] == "zipf:1.2"
    sim = mksim("simulate", "--schedule", str(best), "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["latency_us"] == got["best"]["latency_us"]


@pytest.mark.parametrize("content,fragment", [
    pytest.param(None, "no such config file", id="missing"),
    pytest.param("{", "not a readable JSON config", id="not-json"),
    pytest.param("[1, 2]", "must hold a JSON object", id="not-an-object"),
    pytest.param('{"model_type": "gpt2", "hidden_size": 64}', "model_type 'gpt2' is not supported", id="gpt2"),
    pytest.param('{"model_type": "llama", "hidden_size": 64}', "missing key", id="incomplete"),
    pytest.param('{"__import__": "os", "model_type": "exec(\'import os\')"}', "is not supported", id="code-is-data"),
])
def test_a_bad_config_is_one_line(content: str | None, fragment: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a default storage must not land in the checkout
    path = tmp_path / "model.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run_cli(["search", "--model", str(path), "--trials", "30"], capsys)
    assert_one_line(code, err, fragment)
    assert out == "" and not list(tmp_path.glob("*.db"))  # refused before a study was made


def test_a_folder_without_a_config_is_one_line_in_a_real_child(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mksim", "search", "--model", str(tmp_path), "--storage", "memory"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120, preexec_fn=as_from_a_terminal,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert_one_line(r.returncode, r.stderr, "a folder without a config.json")
    assert r.stdout == ""


def test_a_model_of_another_type_is_refused() -> None:
    with pytest.raises(MksimError, match="model: give a built-in model's name, a config.json path or a ModelConfig"):
        search({"model_type": "llama"}, "h200", storage="memory")  # type: ignore[arg-type]


@pytest.mark.slow  # three searches of a tiny mixture of experts, the fewest trials: ~2 s of CPU
def test_a_study_records_its_routing_and_refuses_another(gpu: str, tmp_path: Path) -> None:
    """A study's expert counts come from its routing model: resuming it with another (another skew, uniform,
    or a counts file of the same name holding other counts) is refused in one line; the same resumes."""
    cfg = models.config_from_hf(TINY_MOE, name="tiny-moe")
    url = f"sqlite:///{tmp_path}/r.db"
    counts = tmp_path / "a" / "traffic.json"
    counts.parent.mkdir()
    counts.write_text(json.dumps({"counts": [[9, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 9]]}))

    def run(routing: str, study: str) -> Any:
        return search(cfg, gpu, kv_len=64, batch=4, trials=least(gpu), storage=url, study_name=study,
                      fixed=dict(FIX), routing=routing)

    first = run("zipf:1.2", "z")
    assert run("zipf:1.2", "z").best == first.best  # the same routing resumes
    for other, words in (("zipf:2", "routing zipf:1.2, not .*routing zipf:2"), ("uniform", "routing zipf:1.2, not")):
        with pytest.raises(MksimError, match=rf"study 'z' in this storage searches .*{words}"):
            run(other, "z")
    run(str(counts), "f")
    again = tmp_path / "b" / "traffic.json"  # the same name, other counts
    again.parent.mkdir()
    again.write_text(json.dumps({"counts": [[1, 1, 1, 1, 1, 1, 1, 9], [9, 1, 1, 1, 1, 1, 1, 1]]}))
    with pytest.raises(MksimError, match=r"routing file traffic.json \(\w{8}\), not .*routing file traffic.json"):
        run(str(again), "f")
    (tmp_path / "c").mkdir()
    run(str(counts.rename(tmp_path / "c" / "traffic.json")), "f")  # the same counts elsewhere resume

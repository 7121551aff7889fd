"""The command line: outputs, JSON, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.clirun import ROOT, mksim


def run(*args: str) -> subprocess.CompletedProcess:
    """``mksim ARGS`` in this process (tests/clirun.py); the tests below that need a real child (a closed
    pipe, a forked worker, a missing extra, the imports) start one themselves."""
    return mksim(*args, cwd=os.getcwd())


def test_a_real_child_answers_a_bad_option_in_one_line_and_exit_2():
    """What the in-process runs above cannot show: the process's own exit status and no traceback."""
    r = subprocess.run([sys.executable, "-m", "mksim", "workload", "--frobnicate"], capture_output=True, text=True,
                       timeout=120)
    assert (r.returncode, r.stdout) == (2, "") and r.stderr.startswith("error: No such option: --frobnicate")
    assert r.stderr.count("\n") == 1, r.stderr


def test_hw_list_shows_seven_gpus():
    r = run("hw", "list", "--json")
    assert r.returncode == 0, r.stderr
    names = {g["name"] for g in json.loads(r.stdout)}
    assert {"a100", "h100", "h200-datasheet", "b200", "mi300x", "l40s", "rtx4090"} <= names
    table = run("hw", "list").stdout
    for name in ("a100", "mi300x", "rtx4090"):
        assert name in table


def test_hw_show_json_has_sources():
    r = run("hw", "show", "h200-datasheet", "--json")
    data = json.loads(r.stdout)
    assert data["numbers"]["sm.count"] == {"value": 132, "source": "nv-h100-whitepaper"}
    assert data["sources"]["nv-h200-datasheet"]["kind"] == "datasheet"


def test_models_lists_ten():
    r = run("models", "--json")
    assert [m["name"] for m in json.loads(r.stdout)] == sorted(
        ["llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "qwen3-8b", "mistral-7b", "qwen2.5-7b",
         "olmoe-1b-7b", "qwen3-30b-a3b", "mixtral-8x7b"])


def test_workload_json():
    r = run("workload", "--model", "llama-3.2-1b", "--gpu", "h200-datasheet", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["ops"] == 163 and d["tasks"] > d["ops"]
    assert d["weight_bytes"] == pytest.approx(2.4716e9, rel=1e-3)
    assert d["flops"] > 2 * 1.2e9
    # bytes over the datasheet bandwidth
    assert d["bandwidth_floor_us"] == pytest.approx(d["min_dram_bytes"] / 4.8e12 * 1e6)


def test_workload_from_config_file(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                               "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000}))
    r = run("workload", "--model", str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ops"] == 23


@pytest.mark.parametrize("args,match", [
    (("workload", "--model", "gpt-9"), "unknown model 'gpt-9'; known: llama-3.1-70b, llama-3.1-8b"),
    (("workload", "--model", "llama-3.2-1b", "--gpu", "h900"), "unknown GPU 'h900'; known: a100"),
    (("workload", "--model", "llama-3.2-1b", "--batch", "0"), "batch must be a positive integer"),
    (("workload", "--model", "llama-3.2-1b", "--kv-len", "-5"), "kv_len"),
    (("workload", "--model", "llama-3.2-1b", "--frobnicate"), "No such option: --frobnicate"),
    (("workload", "--model", "llama-3.2-1b", "--batch", "many"), "--batch"),
    (("hw", "show", "/no/such.toml"), "no such hardware file"),
    (("nonsense",), "No such command 'nonsense'"),
])
def test_errors_are_one_line(args, match):
    r = run(*args)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert match in lines[0]


def test_import_mksim_stays_light():
    code = ("import sys, mksim, hwmodels; mksim.models.workload('llama-3.2-1b'); "
            "heavy = [m for m in ('torch', 'dash', 'cupy', 'optuna', 'plotly', 'simpy') if m in sys.modules]; "
            "print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


# -- simulation commands ---------------------------------------------------------------
MODES = ["stream", "graph", "graph_pdl", "persistent_barrier", "megakernel"]


@pytest.mark.slow
def test_compare_json_has_every_mode_with_breakdown():
    r = run("compare", "--model", "llama-3.2-1b", "--gpu", "h200-datasheet", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert list(d["modes"]) == MODES
    for m in d["modes"].values():
        assert m["latency_us"] > d["bandwidth_floor_us"]
        assert 0 < m["hbm_util"] <= 1
        assert sum(m["breakdown_us"].values()) == pytest.approx(m["latency_us"])
    assert d["modes"]["stream"]["speedup_vs_stream"] == 1.0
    table = run("compare", "--model", "llama-3.2-1b", "--gpu", "h200-datasheet").stdout
    for mode in MODES:
        assert mode in table


@pytest.mark.slow  # 1.4 s of CPU
def test_simulate_trace_and_schedule_round_trip(tmp_path):
    trace, sched = tmp_path / "t.json", tmp_path / "s.json"
    r = run("simulate", "--model", "llama-3.2-1b", "--mode", "megakernel", "--policy", "rr",
            "--trace", str(trace), "--save", str(sched), "--json")
    assert r.returncode == 0, r.stderr
    lat = json.loads(r.stdout)["latency_us"]
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["tid"] for e in events if e.get("ph") == "X"}
    assert tracks == set(range(2 * 132))  # one track per SM, one per SM's loader
    assert {e["tid"] for e in events if e.get("cat") == "task"} == set(range(132))
    assert any(e["ph"] == "C" and e["name"] == "HBM bandwidth" for e in events)
    again = run("simulate", "--schedule", str(sched), "--json")
    assert json.loads(again.stdout)["latency_us"] == lat


@pytest.mark.slow
def test_sweep_json_and_html(tmp_path):
    pytest.importorskip("plotly")
    html = tmp_path / "sweep.html"
    r = run("sweep", "--model", "llama-3.2-1b", "--gpu", "h200-datasheet", "--batch", "1,16", "--json", "--html",
            str(html))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [row["batch"] for row in rows] == [1, 16]
    assert all(row["megakernel_us"] > 0 for row in rows)
    assert "plotly" in html.read_text()


@pytest.mark.parametrize("args,match", [
    (("simulate", "--mode", "warp"), "unknown mode 'warp'"),
    (("simulate", "--policy", "random"), "unknown policy 'random'"),
    (("simulate", "--opt", "prefetch_depth=99"), "shared memory over budget"),
    (("simulate", "--opt", "colour=red"), "unknown schedule option 'colour'"),
    (("simulate", "--schedule", "/no/such.json"), "no such schedule file"),
    (("sweep", "--batch", "1,x"), "--batch takes comma-separated integers"),
])
def test_simulation_errors_are_one_line(args, match):
    r = run(*args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert match in r.stderr


@pytest.mark.parametrize("args", [("--policy", "foo"), ("--opt", "policy=foo"),
                                  ("--designs", "dies", "--policy", "foo")])
@pytest.mark.slow  # 3.9 s of CPU
def test_compare_worker_error_is_one_line_in_seconds(args):
    """An error in a forked worker comes back to the parent (it used to hang the pool forever); the tiny model
    (tests/data/tiny-llama.json) goes through the same pool."""
    model = str(ROOT / "tests" / "data" / "tiny-llama.json")
    r = subprocess.run([sys.executable, "-m", "mksim", "compare", "--model", model, *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    from mksim.schedule._policies import POLICIES
    assert r.stderr.strip().splitlines() == [f"error: unknown policy 'foo'; known: {', '.join(sorted(POLICIES))}"]


def test_help_lists_every_command_and_mksim_cli_imports_no_other_package():
    r = run("--help")
    assert r.returncode == 0
    listed = [line.split()[0] for line in r.stdout.split("Commands:")[1].strip().splitlines()]
    assert sorted(listed) == sorted(["models", "workload", "compare", "simulate", "sweep", "search", "hw",
                                     "calibrate", "validate", "explore", "trace"])
    assert "Measure this GPU" in r.stdout and "Start the web explorer" in r.stdout
    code = ("import sys, mksim.cli; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'explorer', 'validation', 'dash', 'optuna', 'torch', 'cupy'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("args,match", [
    (("validate", "--json", "suite"), "--json goes after the subcommand: mksim validate suite --json"),
    (("validate", "--model", "llama-3.2-1b", "--mode", "warp"), "unknown mode 'warp'"),
    (("calibrate", "--from-raw", "x.raw.json"), "--from-raw needs --out FILE.toml"),
    (("validate", "suite", "--frobnicate"), "No such option: --frobnicate"),
])
def test_lazy_subcommands_keep_one_line_errors(args, match):
    r = run(*args)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], r.stderr


def test_python_m_validation_calibrate_is_mksim_calibrate():
    r = subprocess.run([sys.executable, "-m", "validation", "calibrate", "--from-raw", "x.raw.json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "error: --from-raw needs --out FILE.toml for the overlay it writes"


@pytest.mark.parametrize("missing,args,line", [
    ("optuna", ["search", "--trials", "30", "--storage", "memory"],
     "error: mksim search needs optuna: pip install 'mksim[search]'"),
    ("plotly", ["sweep", "--batch", "1", "--html", "sweep.html"],  # plotly is missing: nothing written
     "error: mksim sweep --html needs plotly: pip install 'mksim[search]'"),
])
@pytest.mark.slow  # 2.2 s of CPU
def test_a_missing_extra_is_one_line_naming_it(missing, args, line):
    code = f"import sys; sys.modules[{missing!r}] = None; from mksim.cli import main; main({args!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [line], r.stderr


def test_version():
    import mksim

    r = run("--version")
    assert r.returncode == 0 and r.stdout == f"mksim {mksim.__version__}\n", r.stderr


@pytest.mark.parametrize("args", [["hw", "show", "h200-datasheet"], ["hw", "list"], ["models"],
                                  ["workload", "-m", "llama-3.2-1b"], ["compare", "--json"]])
def test_a_closed_pipe_ends_quietly_with_status_0(args):
    """``mksim hw show h200 | head -2``: the reader leaves early; neither an error nor a traceback."""
    p = subprocess.Popen([sys.executable, "-m", "mksim", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.read(1)
    p.stdout.close()
    assert p.wait(timeout=120) == 0
    assert p.stderr.read() == b""


@pytest.mark.slow  # two searches of the fewest trials, in this process: 2 s of CPU
def test_search_says_where_it_makes_its_db_and_names_the_metrics(tmp_path):
    import optuna

    from tests.clirun import mksim
    from tests.mksim.searchkit import TINY_MODEL, small_gpu

    gpu = str(small_gpu(tmp_path / "gpu"))  # a small GPU: the same space, cheaper trials; its file out of the way
    model = str(TINY_MODEL)  # and a model of 2 layers
    r = mksim("search", "--model", model, "--gpu", gpu, "--trials", "26", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    db = next(tmp_path.glob("*.db"))
    assert r.stderr == f"creating study storage sqlite:///{db.name} in {tmp_path} (--storage puts it elsewhere)\n"
    study = optuna.load_study(study_name=db.stem, storage=f"sqlite:///{db}")
    assert study.metric_names == ["latency_us"]
    r = mksim("search", "--model", model, "--gpu", gpu, "--trials", "26", "--json", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr  # resumed: nothing made, nothing said


def test_a_trace_that_cannot_be_written_is_one_line_after_the_result():
    """/proc passes the writability check as root but refuses the file: still one line, exit 2, and the
    simulated result is printed before the failed write."""
    r = run("simulate", "--model", "llama-3.2-1b", "--gpu", "h200-datasheet", "--trace", "/proc/mksim-trace.json")
    assert r.returncode == 2
    assert r.stderr.startswith("error: --trace /proc/mksim-trace.json") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr
    if os.geteuid() == 0:  # the check let it through: the result came first
        assert " µs, " in r.stdout and "tokens/s" in r.stdout


def test_ctrl_c_while_the_command_line_loads(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C during ``mksim``'s own imports ends with one line and 130, as one during a run does."""
    from mksim.__main__ import run  # importing it runs nothing

    class CtrlC:
        def find_spec(self, name: str, path: object = None, target: object = None) -> None:
            if name == "mksim.cli":
                raise KeyboardInterrupt

    monkeypatch.delitem(sys.modules, "mksim.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [CtrlC(), *sys.meta_path])
    with pytest.raises(SystemExit) as exc:
        run()
    assert exc.value.code == 130
    assert capsys.readouterr().err == "error: interrupted while mksim was starting\n"

"""The first table of bad inputs (shared/notes/bad-inputs-2026-12-01.md) as a test.

Every bad input to the command line or the Python API answers with one line on stderr,
``error: ...``, exit status 2, no traceback, in bounded time; sizes too large for the GPU are
refused before anything big is allocated (run in a child process under a memory limit); and a
finished result is never lost. Of the 14 rows the note found accepted (exit 0), the wrong accepts
are refused rows here and the legitimate ones (an empty context, a huge tasks_per_sm, a model
folder's config.json, validation without matplotlib) are checked to work. The files (``hf-*.json``,
``hw-*.toml``, ``sched-*.json``) are small variants of a real config, hardware file or schedule
with the one defect the name says.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hwmodels
from mksim import build_schedule, models
from mksim.cli import main
from mksim.errors import MksimError
from mksim.schedule import Schedule
from tests.clirun import as_from_a_terminal

ROOT = Path(__file__).resolve().parents[2]
HF = json.loads((ROOT / "mksim/models/configs/llama-3.2-1b.json").read_text())
H200 = (ROOT / "hwmodels/data/h200-datasheet.toml").read_text()
BW = 'bandwidth_spec_GBps = { value = 4800, source = "nv-h200-datasheet" }'
ONE_LINE_S = 20  # an in-process case must answer within this many seconds


def _hf(**change: Any) -> dict[str, Any]:
    d = dict(HF)
    for k, v in change.items():
        if v is ...:
            d.pop(k, None)
        else:
            d[k] = v
    return d


HF_FILES: dict[str, Any] = {
    "missing": _hf(hidden_size=...),
    "zero-heads": _hf(num_attention_heads=0),
    "nondiv": _hf(hidden_size=2000, num_attention_heads=3, num_key_value_heads=3, head_dim=...),
    "kv0": _hf(num_key_value_heads=0),
    "kvneg": _hf(num_key_value_heads=-8),
    "kvstr": _hf(num_key_value_heads="8"),
    "headdim-str": _hf(head_dim="64"),
    "kv7": _hf(num_key_value_heads=7),
    "headdim-neg": _hf(head_dim=-64),
    "layers-float": _hf(num_hidden_layers=16.0),
    "rope-str": _hf(rope_theta="abc"),
    "rope-1e400": _hf(rope_theta=10**400),  # an integer too large for a float
    "eps-str": _hf(rms_norm_eps="x"),
    "ctx-str": _hf(max_position_embeddings="x"),
    "gpt2": _hf(model_type="gpt2"),
    "act-gelu": _hf(hidden_act="gelu"),
    "textcfg-list": {"model_type": "llama", "text_config": [1, 2]},
    "list": [HF],
    "vocab-1e15": _hf(vocab_size=10**15),
    "hidden-1e9": _hf(hidden_size=10**9),
    "layers-1e6": _hf(num_hidden_layers=10**6),
    "layers-1e9": _hf(num_hidden_layers=10**9),
}

HW_FILES: dict[str, str | bytes] = {
    "wrongunit": H200.replace(BW, BW.replace("GBps", "TBps")),
    "missingkey": H200.replace(BW, ""),
    "negbw": H200.replace(BW, BW.replace("4800", "-4800")),
    "stringbw": H200.replace(BW, BW.replace("4800", '"4800"')),
    "nanbw": H200.replace(BW, BW.replace("4800", "nan")),
    "hugebw": H200.replace(BW, BW.replace("4800", "1e300")),
    "intname": H200.replace('name = "h200-datasheet"', "name = 7", 1),
    "empty": "",
    "truncated": H200[:H200.index("[chip.sm]") + 6],
    "garbage": bytes(range(256)) * 4,
    "binary-utf16": H200.encode("utf-16"),
    "zerosms": H200.replace("count = { value = 132,", "count = { value = 0,", 1),
    "cycle-a": 'extends = "hw-cycle-b.toml"\n',
    "cycle-b": 'extends = "hw-cycle-a.toml"\n',
    "extends-unknown": 'extends = "h900"\n',
    "overlay-nosource": 'extends = "h200-datasheet"\n[memory.dram]\n' + BW.replace("nv-h200-datasheet", "x") + "\n",
    # a large file (the note's was 50 MB) still answers with one line, and without reading it twice
    "huge": 'name = "huge"\n' + "".join(f"k{i} = {i}\n" for i in range(200_000)),
}


@pytest.fixture(scope="session")
def bad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding every bad file of the table."""
    d = tmp_path_factory.mktemp("bad")
    for name, cfg in HF_FILES.items():
        (d / f"hf-{name}.json").write_text(json.dumps(cfg))
    (d / "hf-notjson.json").write_text("{x")
    (d / "hf-binary.json").write_bytes(bytes(range(128, 256)))
    for name, text in HW_FILES.items():
        p = d / f"hw-{name}.toml"
        p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
    (d / "hw-dir.toml").mkdir()
    (d / "raw-garbage.raw.json").write_bytes(bytes(range(256)))
    (d / "raw-nometa.raw.json").write_text("{}")
    (d / "a-dir").mkdir()
    (d / "hfdir").mkdir()  # a Hugging Face model folder
    (d / "hfdir" / "config.json").write_text(json.dumps(HF))
    good = json.loads(build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel").to_json())

    def sched(name: str, **change: Any) -> None:
        s = json.loads(json.dumps(good))
        for k, v in change.items():
            if v is ...:
                s.pop(k, None)
            else:
                s[k] = v
        (d / f"sched-{name}.json").write_text(json.dumps(s))

    q = good["queues"]
    sched("twice", queues=[[q[1][0], *q[0]], *q[1:]])
    sched("missing", queues=[q[0][:-1], *q[1:]])
    sched("outofrange", queues=[[10**9, *q[0]], *q[1:]])
    sched("negative", queues=[[-32, *q[0]], *q[1:]])
    bool_q = [[True if t == 1 else t for t in row] for row in q]
    sched("bool", queues=bool_q)
    sched("float", queues=[[float(t) for t in row] for row in q])
    sched("queues-str", queues="abc")
    sched("unknown-gpu", gpu="h900")
    sched("gpu-passwd", gpu="/etc/passwd")
    sched("opt-str", options={**good["options"], "prefetch_depth": "x"})
    sched("opt-bool", options={**good["options"], "blocks_per_sm": True})
    sched("opt-neg", options={**good["options"], "prefetch_depth": -1})
    sched("opt-list", options=[1, 2])
    sched("opt-unknown", options={**good["options"], "warp": 1})
    sched("wl-list", workload=[1])
    sched("wl-negbatch", workload={**good["workload"], "batch": -4})
    sched("wl-strbatch", workload={**good["workload"], "batch": "abc"})
    sched("wl-model", workload={**good["workload"], "model": "gpt-9"})
    sched("wl-huge", workload={**good["workload"], "batch": 100000})
    sched("tiling-str", tiling={**good["tiling"], "per_op": {"embed": "abc"}})
    sched("tiling-list", tiling=[1])
    sched("mode", mode="warp9")
    sched("format", format="nope")
    sched("nowl", workload=...)
    sched("polopts-str", policy_options="abc")
    sched("version99", version=99)
    sched("version-str", version="1")
    sched("deadlock-self", queues=[row[::-1] for row in q])  # every SM runs its last task first
    sched("cycle", queues=[q[0][::-1], *q[1:]])
    sched("fewqueues", queues=q[:10])
    sched("tiling-zero", tiling={**good["tiling"], "default": 0})
    (d / "sched-truncated.json").write_text(json.dumps(good)[:500])
    (d / "sched-empty.json").write_text("")
    (d / "sched-list.json").write_text("[]")
    (d / "sched-binary.json").write_bytes(b"{" + bytes(range(128, 256)))
    return d


#: (id, argv with {d} for the folder of bad files, a fragment the error line must hold).
CLI_CASES: list[tuple[str, list[str], str]] = [
    # names
    ("model", ["compare", "--model", "gpt-9"], "unknown model 'gpt-9'"),
    ("gpu", ["compare", "--gpu", "h900"], "unknown GPU 'h900'"),
    ("mode", ["simulate", "--mode", "warp9"], "unknown mode"),
    ("policy", ["simulate", "--policy", "foo"], "unknown policy"),
    ("compare-policy", ["compare", "--policy", "foo"], "unknown policy"),
    ("compare-opt-policy", ["compare", "--opt", "policy=foo"], "unknown policy"),
    ("compare-json-policy", ["compare", "--json", "--policy", "foo"], "unknown policy"),
    ("dtype", ["compare", "--dtype", "fp4"], "dtype"),
    ("phase", ["compare", "--phase", "training"], "phase"),
    ("designs", ["compare", "--designs", "bogus"], "unknown design"),
    ("hw-show", ["hw", "show", "nope"], "unknown GPU"),
    ("no-model", ["workload"], "Missing option"),
    # numbers
    ("batch-abc", ["compare", "--batch", "abc"], "--batch"),
    ("batch-neg", ["compare", "--batch", "-1"], "batch must be a positive integer"),
    ("batch-0", ["compare", "--batch", "0"], "batch must be a positive integer"),
    ("batch-float", ["compare", "--batch", "1.5"], "--batch"),
    ("batch-empty", ["compare", "--batch", ""], "--batch"),
    ("batch-1e30", ["workload", "-m", "llama-3.2-1b", "--batch", str(10**30)], "batch"),
    ("kv-abc", ["compare", "--kv-len", "abc"], "--kv-len"),
    ("kv-neg", ["compare", "--kv-len", "-5"], "kv_len"),
    ("kv-1e12", ["workload", "-m", "llama-3.2-1b", "--kv-len", str(10**12)], "context"),
    ("prefill-neg", ["compare", "--prefill-tokens", "-5", "--phase", "prefill"], "prefill_tokens"),
    ("prefill-0", ["compare", "--phase", "prefill"], "prefill_tokens"),
    ("tasks-0", ["workload", "-m", "llama-3.2-1b", "--tasks-per-sm", "0"], "tasks per SM"),
    ("tasks-neg", ["workload", "-m", "llama-3.2-1b", "--tasks-per-sm", "-1"], "tasks per SM"),
    ("tasks-nan", ["workload", "-m", "llama-3.2-1b", "--tasks-per-sm", "nan"], "tasks per SM"),
    ("tasks-inf", ["workload", "-m", "llama-3.2-1b", "--tasks-per-sm", "inf"], "tasks per SM"),
    ("sweep-batch", ["sweep", "--batch", "1,,x"], "comma-separated"),
    ("sweep-empty", ["sweep", "--batch", ""], "at least one"),
    ("sweep-neg", ["sweep", "--batch", "-1"], "batch must be"),
    # --opt
    ("opt-noequals", ["simulate", "--opt", "noequals"], "key=value"),
    ("opt-neg", ["simulate", "--opt", "prefetch_depth=-1"], "prefetch_depth"),
    ("opt-unknown", ["simulate", "--opt", "unknown=1"], "unknown schedule option"),
    ("opt-page-nan", ["simulate", "--opt", "page_KiB=nan"], "page_KiB"),
    ("opt-page-inf", ["simulate", "--opt", "page_KiB=inf"], "page_KiB"),
    ("opt-sync", ["simulate", "--opt", "sync=foo"], "sync"),
    ("opt-blocks-abc", ["simulate", "--opt", "blocks_per_sm=abc"], "blocks_per_sm"),
    ("opt-blocks-float", ["simulate", "--opt", "blocks_per_sm=1.5"], "blocks_per_sm"),
    ("opt-dies-str", ["simulate", "--opt", "dies=maybe"], "dies"),
    ("opt-tasks-nan", ["simulate", "--opt", "tasks_per_sm=nan"], "tasks_per_sm"),
    ("compare-opt-sync", ["compare", "--opt", "sync=foo"], "sync"),
    ("compare-opt-unknown", ["compare", "--opt", "unknown=1"], "unknown schedule option"),
    ("compare-opt-blocks", ["compare", "--opt", "blocks_per_sm=abc"], "blocks_per_sm"),
    # hardware files
    *[(f"hw-{n}", ["hw", "show", f"{{d}}/hw-{n}.toml"], frag) for n, frag in [
        ("wrongunit", "TBps"), ("missingkey", "missing key memory.dram.bandwidth_spec_GBps"),
        ("negbw", "negative"), ("stringbw", "not a number"), ("nanbw", "not a number"),
        ("hugebw", "implausible"), ("intname", "name = 7"), ("empty", "missing key 'name'"),
        ("truncated", "not valid TOML"), ("garbage", "not valid TOML"), ("binary-utf16", "UTF-8"),
        ("dir", "a folder, not a regular file")]],
    ("hw-nonexistent", ["hw", "show", "/nonexistent/x.toml"], "no such hardware file"),
    *[(f"hw-{n}", ["hw", "show", f"{{d}}/hw-{n}.toml"], frag) for n, frag in [
        ("zerosms", "chip.sm.count = 0"), ("cycle-a", "forms a cycle"),
        ("extends-unknown", "unknown model 'h900'"), ("overlay-nosource", "names source 'x'"),
        ("huge", "hw-huge.toml")]],
    ("compare-gpu-negbw", ["compare", "--gpu", "{d}/hw-negbw.toml"], "negative"),
    ("compare-gpu-garbage", ["compare", "--gpu", "{d}/hw-garbage.toml"], "not valid TOML"),
    ("compare-gpu-passwd", ["compare", "--gpu", "/etc/passwd"], "not valid TOML"),
    ("compare-gpu-rel", ["compare", "--gpu", "../bad"], "no such hardware file"),
    # schedule files
    *[(f"sched-{n}", ["simulate", "--schedule", f"{{d}}/sched-{n}.json"], frag) for n, frag in [
        ("truncated", "not valid JSON"), ("empty", "not valid JSON"), ("list", "not a mksim schedule"),
        ("binary", "not valid JSON"), ("twice", "placed twice"), ("missing", "never placed"),
        ("outofrange", "lists task 1000000000"), ("negative", "lists task -32"),
        ("bool", "integer task ids"), ("float", "integer task ids"), ("queues-str", "integer task ids"),
        ("unknown-gpu", "unknown GPU 'h900'"), ("gpu-passwd", "not valid TOML"),
        ("opt-str", "prefetch_depth"), ("opt-bool", "blocks_per_sm"), ("opt-neg", "prefetch_depth"),
        ("opt-list", "options"), ("opt-unknown", "unknown schedule option 'warp'"),
        ("wl-list", "workload must be an object"), ("wl-negbatch", "batch must be"),
        ("wl-strbatch", "batch must be"), ("wl-model", "unknown model 'gpt-9'"),
        ("tiling-str", "tile count"), ("tiling-list", "tiling"), ("mode", "unknown mode"),
        ("format", "not a mksim schedule"), ("nowl", "missing key 'workload'"),
        ("polopts-str", "policy_options"), ("version99", "version"), ("version-str", "version"),
        ("deadlock-self", "deadlock"), ("cycle", "deadlock"), ("fewqueues", "never placed"),
        ("tiling-zero", "never placed")]],
    ("sched-nonexistent", ["simulate", "--schedule", "/nonexistent.json"], "no such schedule file"),
    ("sched-dir", ["simulate", "--schedule", "{d}/a-dir"], "a folder, not a regular file"),
    # HF configs
    *[(f"hf-{n}", ["workload", "--model", f"{{d}}/hf-{n}.json"], frag) for n, frag in [
        ("missing", "missing key 'hidden_size'"), ("zero-heads", "num_attention_heads = 0"),
        ("nondiv", "hidden_size"), ("kv0", "num_key_value_heads = 0"), ("kvneg", "num_key_value_heads = -8"),
        ("kvstr", "num_key_value_heads = '8'"), ("headdim-str", "head_dim = '64'"), ("kv7", "not a multiple"),
        ("headdim-neg", "head_dim = -64"), ("layers-float", "num_hidden_layers = 16.0"),
        ("rope-str", "rope_theta = 'abc'"), ("rope-1e400", "rope_theta = 1000"),
        ("eps-str", "rms_norm_eps = 'x'"), ("ctx-str", "max_position_embeddings = 'x'"),
        ("gpt2", "model_type 'gpt2'"), ("act-gelu", "hidden_act 'gelu'"), ("textcfg-list", "text_config"),
        ("list", "JSON object"), ("notjson", "not a readable JSON"), ("binary", "not a readable JSON"),
        ("vocab-1e15", "GB"), ("hidden-1e9", "GB")]],
    ("compare-hf-hidden-1e9", ["compare", "--model", "{d}/hf-hidden-1e9.json"], "GB"),
    ("compare-hf-nondiv", ["compare", "--model", "{d}/hf-nondiv.json"], "hidden_size"),
    ("hf-nonexistent", ["workload", "--model", "/nonexistent/config.json"], "no such config file"),
    ("hf-dir", ["workload", "--model", "{d}/a-dir"], "a folder without a config.json"),
    # memory: a step that cannot fit the GPU is refused with its sizes, before any graph is built
    ("mem-batch-1e6", ["workload", "-m", "llama-3.2-1b", "--batch", "1000000"], "GB"),
    ("mem-batch-1e9", ["workload", "-m", "llama-3.2-1b", "--batch", "1000000000"], "GB"),
    ("mem-compare-1e5", ["compare", "--batch", "100000"], "GB"),
    ("mem-simulate-1e5", ["simulate", "--batch", "100000"], "GB"),
    ("mem-compare-1e30", ["compare", "--batch", str(10**30)], "e+28 GB"),
    ("mem-sweep-1e5", ["sweep", "--batch", "1,100000"], "GB"),
    ("mem-search-1e5", ["search", "--batch", "100000", "--storage", "memory"], "GB"),
    ("mem-prefill", ["compare", "--phase", "prefill", "--prefill-tokens", "100000", "--batch", "64"], "GB"),
    ("mem-schedule-file", ["simulate", "--schedule", "{d}/sched-wl-huge.json"], "GB"),
    # output paths are checked before the work
    ("save-missing-dir", ["simulate", "--save", "/nonexistent/dir/s.json"], "/nonexistent/dir"),
    ("trace-missing-dir", ["simulate", "--trace", "/nonexistent/dir/t.json"], "/nonexistent/dir"),
    ("trace-is-dir", ["simulate", "--trace", "{d}/a-dir"], "a-dir"),
    ("sweep-html-missing", ["sweep", "--batch", "1", "--html", "/nonexistent/dir/s.html"], "/nonexistent/dir"),
    ("search-out-missing", ["search", "--storage", "memory", "--out", "/nonexistent/dir/x.json"],
     "/nonexistent/dir"),
    ("search-report-missing", ["search", "--storage", "memory", "--report", "/nonexistent/dir/r.html"],
     "/nonexistent/dir"),
    # search
    ("search-sqlite-nodir", ["search", "--storage", "sqlite:////nonexistent/dir/x.db"], "cannot open study storage"),
    ("search-sqlite-proc", ["search", "--storage", "sqlite:////proc/x.db"], "cannot open study storage"),
    ("search-sqlite-garbage", ["search", "--storage", "sqlite:///{d}/hw-garbage.toml"], "cannot open study storage"),
    ("search-trials-abc", ["search", "--trials", "abc"], "--trials"),
    ("search-trials-neg", ["search", "--trials", "-1"], "--trials"),
    ("search-trials-0", ["search", "--trials", "0"], "--trials"),
    ("search-trials-5", ["search", "--trials", "5"], "--trials"),
    ("search-workers-0", ["search", "--workers", "0"], "--workers"),
    ("search-workers-memory", ["search", "--workers", "2", "--storage", "memory"], "memory"),
    ("search-timeout-neg", ["search", "--timeout", "-1", "--storage", "memory"], "--timeout"),
    ("search-objective", ["search", "--objective", "foo"], "unknown objective"),
    ("search-fix", ["search", "--fix", "foo=1"], "cannot fix 'foo'"),
    ("search-fix-abc", ["search", "--fix", "prefetch_depth=abc"], "prefetch_depth"),
    ("search-designs", ["search", "--designs", "bogus"], "unknown design"),
    ("search-batch", ["search", "--batch", "-1"], "batch must be"),
    ("search-storage-foo", ["search", "--storage", "foo"], "cannot open study storage"),
    ("search-mysql", ["search", "--storage", "mysql://u@127.0.0.1:{port}/db"], "cannot open study storage"),
    ("search-postgresql", ["search", "--storage", "postgresql://u@127.0.0.1:{port}/db"], "127.0.0.1"),
    ("search-psycopg2", ["search", "--storage", "postgresql+psycopg2://u@127.0.0.1:{port}/db"], "127.0.0.1"),
    # other commands
    ("calibrate-garbage", ["calibrate", "--from-raw", "{d}/raw-garbage.raw.json", "--out", "{d}/x.toml"],
     "cannot read raw calibration"),
    ("calibrate-nometa", ["calibrate", "--from-raw", "{d}/raw-nometa.raw.json", "--out", "{d}/x.toml"],
     "cannot read raw calibration"),
    ("calibrate-missing", ["calibrate", "--from-raw", "/nonexistent.raw.json", "--out", "{d}/x.toml"],
     "cannot read raw calibration"),
    ("validate-cycle", ["validate", "--schedule", "{d}/sched-twice.json", "--dry-run"], "placed twice"),
    ("validate-deadlock", ["validate", "--schedule", "{d}/sched-cycle.json", "--dry-run"], "deadlock"),
    ("validate-report", ["validate", "report", "/nonexistent"], "cannot read measured results"),
    ("explore-port-high", ["explore", "--port", "99999"], "--port"),
    ("explore-port-neg", ["explore", "--port", "-1"], "--port"),
    ("explore-host", ["explore", "--host", "256.1.1.1", "--port", "0"], "256.1.1.1"),
]


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError(f"no answer within {ONE_LINE_S} s")


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``mksim argv`` in this process: (exit status, stdout, stderr)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ONE_LINE_S)
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_one_line(code: int, err: str, fragment: str, status: int = 2) -> None:
    lines = err.splitlines()
    assert code == status, f"exit {code}, stderr: {err[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert "Traceback" not in err
    assert fragment in lines[0], lines[0]


@pytest.fixture(scope="session")
def closed_port() -> Iterator[int]:
    """A port of 127.0.0.1 where nothing listens, for as long as the tests run: a socket bound to it and never
    listening, so a connection is refused at once (a fixed port such as 1 may have a server, or a firewall
    that drops the packet, and a database driver then waits out its connect timeout)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.mark.parametrize("argv,fragment", [pytest.param(a, f, id=i) for i, a, f in CLI_CASES])
def test_cli_bad_input_answers_in_one_line(argv: list[str], fragment: str, bad: Path, closed_port: int,
                                           capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a default search storage must not land in the checkout
    code, _, err = run_cli([a.replace("{d}", str(bad)).replace("{port}", str(closed_port)) for a in argv], capsys)
    assert_one_line(code, err, fragment)


NO_CUPY = importlib.util.find_spec("cupy") is None


@pytest.mark.skipif(not NO_CUPY, reason="CuPy is installed: these rows are about a machine without a GPU")
@pytest.mark.parametrize("argv,fragment", [
    pytest.param(["calibrate", "--quick"], "needs a CUDA GPU and CuPy", id="calibrate-no-gpu"),
    pytest.param(["validate", "--model", "llama-3.2-1b", "--mode", "megakernel"], "no CUDA GPU",
                 id="validate-no-gpu"),
])
def test_gpu_command_without_a_gpu(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str],
                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(argv, capsys)
    assert_one_line(code, err, fragment)


@pytest.mark.parametrize("argv,blocked,fragment", [
    pytest.param(["explore", "--port", "0"], ["dash"], "needs dash", id="explore-no-dash"),
    pytest.param(["search", "--storage", "memory"], ["optuna"], "needs optuna", id="search-no-optuna"),
    pytest.param(["sweep", "--batch", "1", "--html", "{d}/s.html"], ["plotly", "plotly.graph_objects"],
                 "needs plotly", id="sweep-html-no-plotly"),
])
def test_missing_extra_answers_in_one_line(argv: list[str], blocked: list[str], fragment: str, bad: Path,
                                           capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The base install's rows: a module set to None in sys.modules cannot be imported."""
    monkeypatch.chdir(tmp_path)
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)
    code, _, err = run_cli([a.replace("{d}", str(bad)) for a in argv], capsys)
    assert_one_line(code, err, fragment)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: these rows need an ordinary user")
@pytest.mark.parametrize("argv,fragment", [
    pytest.param(["search", "--storage", "sqlite:///{ro}/x.db"], "cannot open study storage", id="search-ro-dir"),
    pytest.param(["search"], "cannot open study storage", id="search-default-in-ro-cwd"),
    pytest.param(["simulate", "--trace", "{ro}/t.json"], "permission denied", id="trace-ro-dir"),
])
def test_folder_that_cannot_be_written(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    monkeypatch.chdir(ro)
    try:
        code, _, err = run_cli([a.replace("{ro}", str(ro)) for a in argv], capsys)
    finally:
        ro.chmod(0o755)
    assert_one_line(code, err, fragment)


def test_busy_port_is_refused_before_the_url_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        code, out, err = run_cli(["explore", "--port", str(s.getsockname()[1])], capsys)
    assert_one_line(code, err, "already in use")
    assert "explorer at" not in out


# -- the rows the note found accepted (exit 0) ----------------------------------------------------------
#: The note's wrong accepts, each now a row of CLI_CASES above (refused in one line). ``hf-headdim-str``
#: (``"head_dim": "64"``), accepted then as harmless, is refused as ``num_key_value_heads: "8"`` is: a config
#: value of the wrong type is a broken config.
WRONG_ACCEPTS = ("sched-bool", "sched-polopts-str", "sched-version99", "hf-nondiv", "compare-hf-nondiv", "hf-kv0",
                 "hf-vocab-1e15", "hf-headdim-str")


def test_every_wrong_accept_of_the_note_is_a_refused_row() -> None:
    assert set(WRONG_ACCEPTS) <= {i for i, _a, _f in CLI_CASES}


def _json_ok(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    code, out, err = run_cli([*argv, "--json"], capsys)
    assert code == 0 and "Traceback" not in err, err[-2000:]
    return json.loads(out)


MODES = ["stream", "graph", "graph_pdl", "persistent_barrier", "megakernel"]


@pytest.mark.slow  # 3.2 s of CPU
def test_accepted_empty_context(capsys: pytest.CaptureFixture[str]) -> None:
    """``compare --kv-len 0`` and ``sweep --kv-len 0``: a step with an empty KV cache (the first token)
    is a real case; both answer with the same numbers, a bandwidth floor below the default's, and every
    mode above its floor."""
    zero = _json_ok(["compare", "--kv-len", "0"], capsys)
    ref = _json_ok(["compare"], capsys)
    assert zero["workload"] == "llama-3.2-1b decode b1 kv0" and list(zero["modes"]) == MODES
    assert 0 < zero["bandwidth_floor_us"] < ref["bandwidth_floor_us"]
    for m in MODES:
        assert zero["modes"][m]["latency_us"] >= zero["bandwidth_floor_us"]
    assert zero["modes"]["stream"]["latency_us"] < ref["modes"]["stream"]["latency_us"]  # less KV to read
    rows = _json_ok(["sweep", "--batch", "1", "--kv-len", "0"], capsys)["rows"]
    assert [(r["batch"], r["kv_len"]) for r in rows] == [(1, 0)]
    for m in MODES:
        assert rows[0][f"{m}_us"] == pytest.approx(zero["modes"][m]["latency_us"], rel=1e-12)


@pytest.mark.slow  # 1.7 s of CPU
def test_accepted_huge_tasks_per_sm_clamps(capsys: pytest.CaptureFixture[str]) -> None:
    """``--opt tasks_per_sm=1e9``: an op is never cut finer than its rows, so past some value more tasks
    per SM change nothing (36,240 tasks for llama-3.2-1b on h200), in bounded time."""
    huge = _json_ok(["simulate", "--opt", "tasks_per_sm=1e9"], capsys)
    fine = _json_ok(["simulate", "--opt", "tasks_per_sm=1e5"], capsys)
    default = _json_ok(["simulate"], capsys)
    assert huge["n_tasks"] == fine["n_tasks"] > default["n_tasks"]
    assert huge["latency_us"] == fine["latency_us"] >= huge["bandwidth_floor_us"]


def test_accepted_config_in_a_model_folder(bad: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--model hfdir/config.json``: the config of a Hugging Face model folder is the model, named after
    the folder; the same copy under a built-in's name gives the built-in's workload."""
    got = _json_ok(["workload", "--model", str(bad / "hfdir" / "config.json")], capsys)
    ref = _json_ok(["workload", "--model", "llama-3.2-1b"], capsys)
    assert got["name"] == "hfdir decode b1 kv1024"
    assert {k: v for k, v in got.items() if k != "name"} == {k: v for k, v in ref.items() if k != "name"}


def _measured_subset(tmp_path: Path, names: tuple[str, ...]) -> Path:
    """A copy of the committed H200 run's measured.json holding only the cases ``names``."""
    measured = json.loads((ROOT / "validation/results/h200/measured.json").read_text())
    measured["cases"] = [c for c in measured["cases"] if c["name"] in names]
    assert [c["name"] for c in measured["cases"]] == list(names)
    run = tmp_path / "run"
    run.mkdir()
    (run / "measured.json").write_text(json.dumps(measured))
    return run


SUITE_GPU = "h200-mk-kernels"  # the model validation/results/h200/summary.json was predicted with


def test_accepted_validate_without_matplotlib(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The base install (no matplotlib): ``validate report`` writes summary.json and table.md, no plots,
    with the committed run's measured and predicted times; ``validate suite --dry-run`` predicts the same."""
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)
    names = ("llama-3.2-1b/b1/stream", "llama-3.2-1b/b1/graph")
    committed = {c["name"]: c for c in json.loads((ROOT / "validation/results/h200/summary.json").read_text())["cases"]}
    run = _measured_subset(tmp_path, names)
    # the suite ran the kernels of the mksim-attn1 profile (the profile the committed summary was predicted with)
    summary = _json_ok(["validate", "report", str(run), "--gpu", SUITE_GPU], capsys)
    assert sorted(p.name for p in run.iterdir()) == ["measured.json", "summary.json", "table.md"]
    assert json.loads((run / "summary.json").read_text())["cases"] == summary["cases"]
    assert [c["name"] for c in summary["cases"]] == list(names)
    for case in summary["cases"]:
        ref = committed[case["name"]]
        assert case["measured_us"] == ref["measured_us"]
        assert case["predicted_us"] == pytest.approx(ref["predicted_us"], rel=1e-9)
    table = (run / "table.md").read_text()
    assert all(f"{committed[n]['measured_us']:.1f}" in table for n in names)
    dry = _json_ok(["validate", "suite", "--dry-run", "--only", names[0], "--gpu", SUITE_GPU], capsys)
    assert [(c["name"], c["error"]) for c in dry] == [(names[0], None)]
    assert dry[0]["predicted_us"] == pytest.approx(committed[names[0]]["predicted_us"], rel=1e-9)


# -- the Python API ----------------------------------------------------------------------------------
API_CASES: list[tuple[str, Any]] = [
    ("config-kvstr", lambda d: models.config_from_hf(_hf(num_key_value_heads="8"))),
    ("config-rope", lambda d: models.config_from_hf(_hf(rope_theta="abc"))),
    ("config-textcfg", lambda d: models.config_from_hf({"text_config": "x"})),
    ("config-nondiv", lambda d: models.config_from_hf(_hf(hidden_size=2000, num_attention_heads=3,
                                                          num_key_value_heads=3, head_dim=...))),
    ("workload-layers", lambda d: models.workload(
        models.config_from_hf(_hf(num_hidden_layers=10**9)))),
    ("workload-batch-bool", lambda d: models.workload("llama-3.2-1b", batch=True)),
    ("build-blocks-str", lambda d: build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel", blocks_per_sm="abc")),
    ("build-page-nan", lambda d: build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel", page_KiB=float("nan"))),
    ("build-tasks-inf", lambda d: build_schedule("llama-3.2-1b", "h200-datasheet", "stream",
                                                 tasks_per_sm=float("inf"))),
    ("build-policy-options", lambda d: build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel",
                                                      policy_options="abc")),  # type: ignore[arg-type]
    ("build-too-big", lambda d: build_schedule(models.workload("llama-3.2-1b", batch=10**6), "h200-datasheet",
                                               "stream")),
    ("from-json-bool", lambda d: Schedule.from_json(d / "sched-bool.json")),
    ("from-json-version", lambda d: Schedule.from_json(d / "sched-version99.json")),
    ("from-json-opt-str", lambda d: Schedule.from_json(d / "sched-opt-str.json")),
    ("hw-garbage", lambda d: hwmodels.load(d / "hw-garbage.toml")),
    ("hw-utf16", lambda d: hwmodels.load(d / "hw-binary-utf16.toml")),
]


@pytest.mark.parametrize("call", [pytest.param(c, id=i) for i, c in API_CASES])
def test_api_bad_input_raises_mksim_error(call: Any, bad: Path) -> None:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ONE_LINE_S)
    try:
        with pytest.raises(MksimError) as info:
            call(bad)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert "\n" not in str(info.value)


# -- bounded time and memory: in a child process under limits -------------------------------------------
MEMORY_LIMIT_B = 3 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_B, MEMORY_LIMIT_B))


def run_child(argv: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mksim", *argv], capture_output=True, text=True,
                          timeout=timeout_s, preexec_fn=_limit_memory, cwd=ROOT)


@pytest.mark.parametrize("argv", [
    pytest.param(["workload", "--model", "{d}/hf-layers-1e9.json"], id="layers-1e9"),
    pytest.param(["workload", "--model", "{d}/hf-layers-1e6.json"], id="layers-1e6"),
    pytest.param(["workload", "--model", "llama-3.2-1b", "--batch", "1000000"], id="batch-1e6"),
    pytest.param(["compare", "--batch", "100000"], id="compare-batch-1e5"),
    pytest.param(["workload", "--model", "llama-3.2-1b", "--batch", "1000000000"], id="batch-1e9"),
])
def test_absurd_sizes_are_refused_in_bounded_memory(argv: list[str], bad: Path) -> None:
    r = run_child([a.replace("{d}", str(bad)) for a in argv])
    assert_one_line(r.returncode, r.stderr, "")


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a hung PostgreSQL server)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in conns:
        c.close()
    srv.close()


@pytest.mark.slow  # 2 s: the connection's timeout
def test_silent_postgresql_server_times_out(silent_server: int, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that accepts and never answers: one line once the connection times out (libpq's least, 2 s,
    here instead of the 10 s a search gives it), not a hang."""
    pytest.importorskip("psycopg2")
    from mksim.search import _study

    monkeypatch.setattr(_study, "CONNECT_TIMEOUT_S", 2)
    code, _, err = run_cli(["search", "--storage", f"postgresql+psycopg2://u@127.0.0.1:{silent_server}/db"], capsys)
    assert_one_line(code, err, "cannot open study storage")
    assert "timeout" in err


@pytest.mark.slow  # 2.5 s of CPU
def test_read_only_study_answers_in_one_line(tmp_path: Path) -> None:
    """An existing study that cannot be written (SQLite opened read-only, as a file in a folder one may
    not write is): one line naming the cause, not optuna's 121-line 'invalid data in the commit'. The
    study is made here (a small GPU, the fewest trials); the read-only run is a real child."""
    from mksim.search import baseline_params, search
    from tests.mksim.searchkit import TINY_MODEL, small_gpu

    db, gpu, model = tmp_path / "ro.db", str(small_gpu(tmp_path)), str(TINY_MODEL)
    trials = len(baseline_params(hwmodels.load(gpu)))
    search(model, gpu, trials=trials, storage=f"sqlite:///{db}")
    r = run_child(["search", "--model", model, "--gpu", gpu, "--trials", str(trials + 4), "--storage",
                   f"sqlite:///file:{db}?mode=ro&uri=true"])
    assert_one_line(r.returncode, r.stderr, "read-only")


# -- nothing finished is lost ------------------------------------------------------------------------
@pytest.mark.slow  # 1.5 s of CPU
def test_result_is_printed_when_writing_it_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The output folder vanishes during the search: the result still reaches stdout, then one line."""
    from mksim.search import _study
    from tests.mksim.searchkit import small_gpu

    target = tmp_path / "gone"
    target.mkdir()
    real = _study.summarize

    def summarize_then_remove(*args: Any, **kw: Any) -> Any:
        res = real(*args, **kw)
        target.rmdir()
        return res

    monkeypatch.setattr(_study, "summarize", summarize_then_remove)
    code, out, err = run_cli(["search", "--gpu", str(small_gpu(tmp_path)), "--kv-len", "64", "--storage", "memory",
                              "--trials", "26", "--json", "--out", str(target / "best.json")], capsys)
    assert_one_line(code, err, str(target))
    assert json.loads(out)["best"]


# -- Ctrl-C ------------------------------------------------------------------------------------------------
def test_ctrl_c_in_a_command_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """typer turns a KeyboardInterrupt into exit status 130 and prints nothing: mksim says why."""
    import mksim.sim

    def interrupt(*args: Any, **kw: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(mksim.sim, "simulate", interrupt)  # what `mksim simulate` calls
    code, _, err = run_cli(["simulate"], capsys)
    assert (code, err) == (130, "error: interrupted\n")


@pytest.mark.slow  # 2.5 s of CPU
def test_ctrl_c_during_search_keeps_the_study(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) mid-search: one line saying how to
    resume, exit status 130, no optuna traceback, and no trial left failed by the interrupt."""
    import optuna

    from tests.mksim.searchkit import count, small_gpu

    db = tmp_path / "c.db"
    p = subprocess.Popen([sys.executable, "-m", "mksim", "search", "--gpu", str(small_gpu(tmp_path)), "--kv-len", "64",
                          "--trials", "5000", "--storage", f"sqlite:///{db}", "--study", "c"], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=as_from_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while count(db, ("COMPLETE", "PRUNED")) < 8:  # some trials have finished (read without optuna)
            assert p.poll() is None and time.monotonic() < deadline, "the search ended or stalled before 8 trials"
            time.sleep(0.01)
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, err[-2000:]
    assert err.splitlines()[-1:] == [err.strip()] and err.startswith("error: interrupted"), err[-2000:]
    assert "run the same command again to resume" in err
    states = {t.state.name for t in optuna.load_study(study_name="c", storage=f"sqlite:///{db}").trials}
    assert "FAIL" not in states and "RUNNING" not in states, states

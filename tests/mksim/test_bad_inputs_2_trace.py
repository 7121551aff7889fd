"""The trace rows of the second bad-inputs table (shared/notes/bad-inputs-2026-12-02.md).

Rows A1-A48 and A173-A176 (``mksim trace import`` / ``mksim trace cut``), the two "data lost" rows of
the trace commands (A132, A133: the input stays byte-identical) and the "Big and compressed traces"
memory table. Every bad input answers with one line on stderr, ``error: ...``, exit status 2, no
traceback; the rows the note found fine still work (exit 0). The trace files are variants of the
committed step trace (``tests/data/trace-llama-3.2-1b-b1-step.json.gz``) with the one defect the row
names. Each test id starts with its row id.

Bounds: an in-process row answers in under 20 s (they take well under 1 s); the memory rows run in a
child process and state their bound on its peak RSS (``ru_maxrss``) and time.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mksim import trace_read
from mksim.trace import import_trace
from tests.mksim.test_bad_inputs import assert_one_line, run_cli

ROOT = Path(__file__).resolve().parents[2]
STEP = ROOT / "tests/data/trace-llama-3.2-1b-b1-step.json.gz"
BASE: dict[str, Any] = json.loads(gzip.decompress(STEP.read_bytes()))


def _kernels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in d["traceEvents"] if e.get("cat") == "kernel"]


def _each_kernel(**change: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        for e in _kernels(d):
            for k, v in change.items():
                if k.startswith("args."):
                    e["args"][k[5:]] = v
                elif v is ...:
                    e.pop(k, None)
                else:
                    e[k] = v
    return edit


def _first_kernel(**change: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        e = _kernels(d)[0]
        for k, v in change.items():
            if k.startswith("args."):
                e["args"][k[5:]] = v
            else:
                e[k] = v
    return edit


def _launch_corr(d: dict[str, Any]) -> None:
    next(e for e in d["traceEvents"] if e.get("name") == "cudaGraphLaunch")["args"]["correlation"] = {"id": 8865}


def _two_devices(d: dict[str, Any]) -> None:
    for e in _kernels(d)[::2]:
        e["args"]["device"] = 1


def _mixed_devices(d: dict[str, Any]) -> None:
    for e in _kernels(d)[::2]:
        e["args"]["device"] = "0"


def _step_nan(d: dict[str, Any]) -> None:
    d["traceEvents"].append({"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#3", "pid": 0, "tid": 7,
                             "ts": float("nan"), "dur": 5000.0})


def _junk(d: dict[str, Any]) -> None:
    d["traceEvents"][3:3] = [1, "x", None, [1, 2], {"ph": "X"}, {"ph": "X", "cat": 5}, {"cat": "kernel"}]


def _props(value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d["deviceProperties"] = value
    return edit


def _name(value: str) -> Callable[[dict[str, Any]], None]:
    return _first_kernel(name=value)


def _variant(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    edit(d)
    return d


#: name -> bytes of the file (the variants of the step trace, and a few files that are not traces)
def _files() -> dict[str, bytes]:
    good = json.dumps(BASE).encode()
    dumps: dict[str, Callable[[dict[str, Any]], None]] = {
        "t-nokernels.json": lambda d: d.update(traceEvents=[e for e in d["traceEvents"] if e.get("cat") != "kernel"]),
        "t-dur-str.json": _first_kernel(dur="5"),
        "t-ts-nan.json": _first_kernel(ts=float("nan")),
        "t-dur-inf.json": _first_kernel(dur=float("inf")),
        "t-dur-zero.json": _each_kernel(dur=0),
        "t-stream-list.json": _first_kernel(**{"args.stream": [7, 8]}),
        "t-device-list.json": _first_kernel(**{"args.device": [0]}),
        "t-corr-dict.json": _launch_corr,
        "t-devprops-int.json": _props(5),
        "t-devprops-str.json": _props("NVIDIA H200"),
        "t-devprops-id-list.json": _props([{"id": [0], "name": "NVIDIA H200"}]),
        "t-huge-ts.json": _each_kernel(ts=1e308, dur=1e308),
        "t-long-span.json": _first_kernel(ts=1e15),
        "t-two-devices.json": _two_devices,
        "t-device-mixed.json": _mixed_devices,
        "t-longname.json": _name("k" * 100_000),
        "t-markup.json": _name("[red]k[/red]<b>"),
        "t-ts-bool.json": _first_kernel(ts=True),
        "t-no-ts.json": _first_kernel(ts=None),
        "t-step-nan.json": _step_nan,
        "t-events-mixed.json": _junk,
        "t-devprops-potato.json": _props([{"id": 0, "name": "Potato GPU", "numSms": 7}]),
        "t-devprops-nonum.json": _props([{"id": 0, "name": "NVIDIA", "numSms": 7}]),
    }
    files = {name: json.dumps(_variant(edit)).encode() for name, edit in dumps.items()}
    files.update({
        "t-empty.json": b"",
        "t-trunc.json.gz": gzip.compress(good)[:2000],
        "t-trunc.json": good[: len(good) // 2],
        "t-gzjunk.json.gz": b"\x1f\x8b\x09" + b"junk" * 50,
        "t-number.json": b"5",
        "t-events-dict.json": b'{"traceEvents": {"a": 1}}',
        "t-events-null.json": b'{"traceEvents": null}',
        "t-nested.json": b'{"traceEvents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "t-bom.json": b"\xef\xbb\xbf" + good,
        "t-utf16.json": json.dumps(BASE).encode("utf-16"),
        "t.json.gz": STEP.read_bytes(),
    })
    return files


@pytest.fixture(scope="session")
def bad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad2-trace")
    for name, data in _files().items():
        (d / name).write_bytes(data)
    (d / "folder").mkdir()
    (d / "loop.json").symlink_to(d / "loop.json")
    os.mkfifo(d / "fifo.json")
    return d


LONG = "a" * 5000
M = ["--model", "llama-3.2-1b"]

#: (row id, argv ({d}: the folder of files, {T}: the step trace), fragment of the one line)
REFUSED = [
    ("A1-empty", ["{d}/t-empty.json"], "not JSON (line 1)"),
    ("A2-trunc-gz", ["{d}/t-trunc.json.gz"], "cannot read (Compressed file ended"),
    ("A3-trunc", ["{d}/t-trunc.json"], "not JSON (line"),
    ("A4-gzjunk", ["{d}/t-gzjunk.json.gz"], "cannot read"),
    ("A5-number", ["{d}/t-number.json"], "JSON without a 'traceEvents' list"),
    ("A6-events-dict", ["{d}/t-events-dict.json"], "JSON without a 'traceEvents' list"),
    ("A7-nokernels", ["{d}/t-nokernels.json"], "no GPU kernel events"),
    ("A8-dur-str", ["{d}/t-dur-str.json"], "has dur = '5'; expected a number >= 0"),
    ("A9-ts-nan", ["{d}/t-ts-nan.json"], "has ts = nan; expected a number"),
    ("A10-dur-inf", ["{d}/t-dur-inf.json"], "has dur = inf; expected a number >= 0"),
    ("A12-stream-list", ["{d}/t-stream-list.json"], "has args.stream = [7, 8]; expected an integer"),
    ("A13-device-list", ["{d}/t-device-list.json"], "has args.device = [0]; expected an integer"),
    ("A14-corr-dict", ["{d}/t-corr-dict.json"],
     "graph launch 'cudaGraphLaunch' has args.correlation = {'id': 8865}; expected an integer"),
    ("A16-huge-ts", ["{d}/t-huge-ts.json"], "has ts = 1e+308; expected a number of µs within"),
    ("A16-span-of-years", ["{d}/t-long-span.json"], "lasts 9.95e+08 s; a decode step lasts milliseconds"),
    ("A17-two-devices", ["{d}/t-two-devices.json"], "kernels on 2 GPUs (0, 1); pick one with --device"),
    ("A21-nested", ["{d}/t-nested.json"], "JSON nested more than 1000 levels deep"),
    ("A22-ts-bool", ["{d}/t-ts-bool.json"], "has ts = True; expected a number"),
    ("A23-no-ts", ["{d}/t-no-ts.json"], "has ts = None; expected a number"),
    ("A27-events-null", ["{d}/t-events-null.json"], "JSON without a 'traceEvents' list"),
    ("A29-devprops-potato", ["{d}/t-devprops-potato.json", *M], "no mksim hardware file for the trace's GPU 'Potato"),
    ("A30-devprops-nonum", ["{d}/t-devprops-nonum.json", *M], "no mksim hardware file for the trace's GPU 'NVIDIA'"),
    ("A31-devprops-int-model", ["{d}/t-devprops-int.json", *M], "does not name its GPU; give --gpu"),
    ("A32-huge-ts-model", ["{d}/t-huge-ts.json", *M], "has ts = 1e+308"),
    ("A33-device-7", ["{d}/t-two-devices.json", "--device", "7"], "no kernels on GPU 7; it has kernels on 0, 1"),
    ("A36-model-deepseek", ["{T}", "--model", "{d}/hf-deepseek.json"], "multi-head latent attention"),
    ("A37-step-0", ["{T}", "--step", "0"], "step 0 out of range: the trace has 1 step(s)"),
    ("A38-step-99", ["{T}", "--step", "99"], "step 99 out of range"),
    ("A39-gpu-profile", ["{T}", *M, "--gpu", "h200-datasheet+nope"], "'nope'"),
    ("A40-dir", ["{d}/folder"], "a folder, not a regular file"),
    ("A41-symlink-loop", ["{d}/loop.json"], "a loop of symbolic links"),
    ("A42-fifo", ["{d}/fifo.json"], "a FIFO (named pipe), not a regular file; save it to a file"),
    ("A44-dev-zero", ["/dev/zero"], "a character device, not a regular file"),
    ("A45-longpath", [LONG], "the name is too long for a file name (5000 characters)"),
    ("A46-json-missing-dir", ["{T}", "--json", "/nonexistent/x.json"], "folder /nonexistent does not exist"),
    ("A173-json-as-flag", ["{T}", "--json"], "--json of trace import takes a file to write the JSON to, or '-'"),
]


@pytest.mark.parametrize("argv,fragment", [pytest.param(a, f, id=i) for i, a, f in REFUSED])
def test_trace_import_bad_input_is_one_line(argv: list[str], fragment: str, bad: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    if "{d}/hf-deepseek.json" in argv:  # a config the importer refuses
        cfg = json.loads((ROOT / "mksim/models/configs/llama-3.2-1b.json").read_text())
        cfg.update(model_type="deepseek_v3", n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=512,
                   kv_lora_rank=512)
        (bad / "hf-deepseek.json").write_text(json.dumps(cfg))
    args = [a.format(d=bad, T=STEP) for a in argv]
    code, out, err = run_cli(["trace", "import", *args], capsys)
    assert_one_line(code, err, fragment)
    assert out == ""


def test_A43_process_substitution_is_a_pipe(capsys: pytest.CaptureFixture[str]) -> None:
    """``mksim trace import <(zcat t.gz)`` names ``/dev/fd/63``, a pipe: refused as one, not as "no such file"."""
    r, w = os.pipe()
    try:
        code, _, err = run_cli(["trace", "import", f"/dev/fd/{r}"], capsys)
    finally:
        os.close(r)
        os.close(w)
    assert_one_line(code, err, "a FIFO (named pipe), not a regular file; save it to a file and give that file")


@pytest.mark.parametrize("argv,fragment", [
    pytest.param(["{T}", "/nonexistent/x.json"], "DEST /nonexistent/x.json: folder /nonexistent does not exist",
                 id="A47-cut-dest-missing-dir"),
    pytest.param(["{T}", "{d}/one.json", "--step", "5"], "step 5 out of range", id="A48-cut-step-5"),
    pytest.param(["{d}/t-stream-list.json", "{d}/one.json"], "has args.stream = [7, 8]", id="A12-cut-stream-list"),
    pytest.param(["{d}/folder", "{d}/one.json"], "a folder, not a regular file", id="A40-cut-dir"),
])
def test_trace_cut_bad_input_is_one_line(argv: list[str], fragment: str, bad: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["trace", "cut", *[a.format(d=bad, T=STEP) for a in argv]], capsys)
    assert_one_line(code, err, fragment)
    assert not (bad / "one.json").exists()


#: rows the note found fine, and rows that were wrong and now work: (row id, argv, a fragment of stdout)
ACCEPTED = [
    ("A11-dur-zero", ["{d}/t-dur-zero.json"], "= kernels 0.8 µs"),  # the memset's 0.8 µs
    ("A15-devprops-int", ["{d}/t-devprops-int.json"], "GPU not named"),
    ("A15-devprops-str", ["{d}/t-devprops-str.json"], "GPU not named"),
    ("A15-devprops-id-list", ["{d}/t-devprops-id-list.json"], "GPU not named"),
    ("A18-device-mixed", ["{d}/t-device-mixed.json"], "648 GPU activities"),
    ("A19-longname", ["{d}/t-longname.json"], "648 GPU activities"),
    ("A20-markup", ["{d}/t-markup.json"], "[red]k[/red]<b>"),
    ("A24-bom", ["{d}/t-bom.json"], "648 GPU activities"),
    ("A25-utf16", ["{d}/t-utf16.json"], "648 GPU activities"),
    ("A26-step-nan", ["{d}/t-step-nan.json"], "by cuda graph launches"),
    ("A28-events-mixed", ["{d}/t-events-mixed.json"], "648 GPU activities"),
]


@pytest.mark.parametrize("argv,fragment", [pytest.param(a, f, id=i) for i, a, f in ACCEPTED])
def test_trace_import_accepted(argv: list[str], fragment: str, bad: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["trace", "import", *[a.format(d=bad, T=STEP) for a in argv]], capsys)
    assert code == 0 and err == "", err
    assert fragment in out, out[:3000]


def test_A18_device_0_and_string_0_are_one_gpu(bad: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Device ids written as digits are numbers: kernels on 0 and "0" ran on one GPU, which --device 0 picks."""
    code, out, err = run_cli(["trace", "import", str(bad / "t-device-mixed.json"), "--device", "0", "--json", "-"],
                         capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["n_kernels"] == 648 and d["gpu_name"] == "NVIDIA H200"


def test_A34_another_model_warns() -> None:
    """(The command line's warning line is tested in test_trace_import.py; here without the prediction.)"""
    t = import_trace(STEP, model="llama-3.1-8b", predict=False)
    assert t.warnings == ("the trace has 16 attention kernels, llama-3.1-8b has 32 layers: is --model the traced "
                          "model?",)


@pytest.mark.slow  # 1.3 s of CPU
def test_A35_batch_64_on_a_batch_1_trace_warns(capsys: pytest.CaptureFixture[str]) -> None:
    """The traced attention kernels ran ~105 µs; batch 64 x KV 1024 of llama-3.2-1b is 2.15 GB of KV cache,
    at least 447 µs at the H200's 4.8 TB/s: the trace cannot be that step, and one warning line says so
    (exit 0: a quantized KV cache would read fewer bytes)."""
    code, out, err = run_cli(["trace", "import", str(STEP), *M, "--batch", "64", "--json", "-"], capsys)
    assert code == 0 and err == ""
    d = json.loads(out)
    assert len(d["warnings"]) == 1
    w = d["warnings"][0]
    assert "batch 64 x KV 1024 (2.15 GB)" in w and "give --batch and --kv-len as traced" in w
    assert import_trace(STEP, model="llama-3.2-1b", predict=False).warnings == ()   # as traced: no doubt


def test_A174_json_to_stdout_with_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["trace", "import", str(STEP), *M, "--json", "-"], capsys)
    assert code == 0 and err == ""
    assert json.loads(out)["prediction"]["gpu"] == "h200-calibrated"


# -- outputs that are the input (data lost before) ---------------------------------------------------------
@pytest.mark.parametrize("argv", [
    pytest.param(["import", "{v}", "--json", "{v}"], id="A132-import-json-is-the-trace"),
    pytest.param(["import", "{v}", "--json", "./{name}"], id="A132-import-json-dot-slash"),
    pytest.param(["import", "{v}", "--json", "{link}"], id="A132-import-json-via-symlink"),
    pytest.param(["cut", "{v}", "{v}"], id="A133-cut-dest-is-the-trace"),
    pytest.param(["cut", "{link}", "./{name}"], id="A133-cut-dest-via-symlink"),
])
def test_an_output_that_is_the_trace_is_refused(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim.json.gz"
    victim.write_bytes(STEP.read_bytes())
    (tmp_path / "link.json.gz").symlink_to(victim)
    before = victim.read_bytes()
    args = [a.format(v=victim, name=victim.name, link=tmp_path / "link.json.gz") for a in argv]
    code, out, err = run_cli(["trace", *args], capsys)
    flag = "--json" if argv[0] == "import" else "DEST"
    assert_one_line(code, err, f"{flag} ")
    assert "is the trace this command reads; writing it would destroy it" in err
    assert out == "" and victim.read_bytes() == before


def test_A133_cut_a_multi_step_trace_to_another_file_still_works(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["trace", "cut", str(STEP), str(tmp_path / "one.json")], capsys)
    assert code == 0 and err == "" and "events written to" in out
    assert json.loads((tmp_path / "one.json").read_text())["traceEvents"]


# -- folders that cannot be written ------------------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: these rows need an ordinary user")
@pytest.mark.parametrize("argv,fragment", [
    pytest.param(["import", "{T}", "--json", "{ro}/x.json"], "--json", id="A175-ro-import-json"),
    pytest.param(["cut", "{T}", "{ro}/x.json"], "DEST", id="A176-ro-cut"),
])
def test_folder_that_cannot_be_written(argv: list[str], fragment: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        code, _, err = run_cli(["trace", *[a.format(T=STEP, ro=ro) for a in argv]], capsys)
    finally:
        ro.chmod(0o755)
    assert_one_line(code, err, fragment)
    assert "cannot write there (permission denied)" in err


# -- big and compressed traces (memory) --------------------------------------------------------------------
KERNEL = ('{"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4, at::native::'
          'FillFunctor<c10::BFloat16>, std::array<char*, 1ul> >(int, at::native::FillFunctor<c10::BFloat16>, '
          'std::array<char*, 1ul>)", "pid": 0, "tid": 7, "ts": %.3f, "dur": 1.5, "args": {"queued": 0, "device": 0, '
          '"context": 1, "stream": 7, "correlation": %d, "registers per thread": 32, "shared memory": 0, '
          '"grid": [16, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %%": 1}}')
LAUNCH = ('{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": %.3f, '
          '"dur": 5, "args": {"correlation": %d}}')


def _big_trace(path: Path, steps: int, per_step: int) -> int:
    """A trace of ``steps`` CUDA graph replays of ``per_step`` kernels each (one step when ``steps`` is 1,
    every kernel its own launch); returns its size in bytes."""
    with path.open("w") as f:
        f.write('{"deviceProperties": [{"id": 0, "name": "NVIDIA H200", "numSms": 132}], "traceEvents": [\n')
        t, sep = 1000.0, ""
        for s in range(steps):
            if steps > 1:
                f.write(sep + LAUNCH % (t - 10, 10 + s))
                sep = ",\n"
            f.write(sep + ",\n".join(KERNEL % (t + 2 * i, 10 + s if steps > 1 else i) for i in range(per_step)))
            sep = ",\n"
            t += 2 * per_step + 100
        f.write("\n]}")
    return path.stat().st_size


def _child(code: str, timeout: float = 120) -> tuple[int, str, float, float]:
    """Run ``code`` in a child Python (this worktree's mksim); its exit status, stderr, peak RSS (MiB,
    from /proc: Linux only) and wall time (s)."""
    # VmHWM: the peak RSS of this process image (ru_maxrss would include the parent's at fork)
    probe = ("import re, sys\ntry:\n" + "".join(f"    {line}\n" for line in code.splitlines())
             + "finally:\n    hwm = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1)\n"
             + "    sys.stderr.write('\\nRSS %s\\n' % hwm)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout, env=env,
                       cwd=ROOT)
    wall = time.monotonic() - started
    rss = re.findall(r"^RSS (\d+)$", r.stderr, re.M)
    err = re.sub(r"^RSS \d+$", "", r.stderr, flags=re.M).strip()
    return r.returncode, err, int(rss[-1]) / 1024, wall


CLI = "from mksim.cli import main\nmain({argv!r})"
RSS_BOUND_MIB = 200   # peak RSS of a child reading a big trace (mksim importing the 300 kB step trace: ~55 MiB;
                      # 64 MiB of events: ~70 MiB; 200 MiB of events: ~95 MiB)


@pytest.mark.slow
def test_big_trace_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    """~64 MiB of kernel events in 210 CUDA graph replays: imported, with a peak RSS under RSS_BOUND_MIB
    (before: ~10 MiB of memory per MiB of JSON, 0.66 GB for 64 MiB; at the 2 GiB cap about 20 GB)."""
    size = _big_trace(tmp_path / "big.json", 210, 650)
    assert size > 60 << 20
    code, err, rss, wall = _child(CLI.format(argv=["trace", "import", str(tmp_path / "big.json"), "--json", "-"]))
    assert code == 0, err[-2000:]
    assert rss < RSS_BOUND_MIB, f"peak RSS {rss:.0f} MiB for a {size >> 20} MiB trace"


@pytest.mark.slow
def test_one_step_of_210k_kernels_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """Like the note's big-64.json (430,512 kernels, no step marks, so one 'step' of them all), a little
    over the cap to stay quick: a decode step has a few thousand activities, one of more than
    MAX_STEP_ACTIVITIES (200,000) is refused in one line, memory bounded all along."""
    _big_trace(tmp_path / "whole.json", 1, 210_000)
    code, err, rss, _ = _child(CLI.format(argv=["trace", "import", str(tmp_path / "whole.json")]))
    assert_one_line(code, err, "holds 210,000 GPU activities, over 200,000")
    assert rss < RSS_BOUND_MIB


@pytest.mark.slow
def test_gzip_bomb_of_blank_space_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    """2.1 GiB of spaces in a 2.2 MB gzip (before: read whole into 2.16 GB of memory, 5.9 s): refused after
    MAX_VALUE_BYTES (16 MiB) of blank, in under 10 s and RSS_BOUND_MIB."""
    member = gzip.compress(b'{"traceEvents": [' + b" " * (64 << 20), 9)
    with (tmp_path / "bomb.json.gz").open("wb") as f:
        f.write(member)
        f.write(gzip.compress(b" " * (64 << 20), 9) * 33)
    code, err, rss, wall = _child(CLI.format(argv=["trace", "import", str(tmp_path / "bomb.json.gz")]))
    assert_one_line(code, err, "over 16 MiB of blank space")
    assert rss < RSS_BOUND_MIB and wall < 10


@pytest.mark.slow
def test_gzip_of_many_events_is_refused_at_the_callers_caps(tmp_path: Path) -> None:
    """The explorer's upload (row B27: 19 MiB of gzip holding 500 MiB of events) read with a server's smaller
    caps: refused in one line once the cap is passed, in bounded memory and time, without reading the rest."""
    with gzip.open(tmp_path / "many.json.gz", "wt", compresslevel=1) as f:
        f.write('{"traceEvents": [')
        for k in range(30):
            f.write(",\n".join(KERNEL % (1000.0 + 2 * i, i) for i in range(10_000 * k, 10_000 * (k + 1))) + ",\n")
        f.write("{}]}")
    code, err, rss, wall = _child(
        "from mksim.trace import import_trace, TraceError\n"
        "try:\n"
        f"    import_trace({str(tmp_path / 'many.json.gz')!r}, max_events=100_000)\n"
        "except TraceError as exc:\n"
        "    sys.exit(str(exc))\n")
    assert code == 1 and "more than 100,000 GPU activities; profile fewer steps" in err, err
    assert rss < RSS_BOUND_MIB and wall < 30



# -- the stream reader agrees with json.loads, wherever a chunk ends -----------------------------------------
DOC = ('{"a": 1, "traceEvents": [1, 2.5e3, -0.0, 12345678901234567890, 1E-7, "x\\u00e9\\"", {"b": [true, false, '
       'null]}, [], {}], "z": {"q": "w"}}')


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64], ids=lambda n: f"A3-chunk-of-{n}-bytes")
def test_stream_reader_agrees_with_json_loads(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value split between two reads (``2.`` then ``5e3``) is read whole; a document cut short is not JSON."""
    monkeypatch.setattr(trace_read, "CHUNK", chunk)
    got: list[Any] = []
    meta = trace_read.JsonEvents(io.BytesIO(DOC.encode()), "t").read(got.append)
    ref = json.loads(DOC)
    assert got == ref["traceEvents"] and meta == {"a": 1, "z": {"q": "w"}}
    for cut in (len(DOC) - 1, 30, 27):
        with pytest.raises(trace_read.TraceError, match="not JSON"):
            trace_read.JsonEvents(io.BytesIO(DOC[:cut].encode()), "t").read(lambda e: None)

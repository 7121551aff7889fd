"""The explorer against hostile requests: table B of the 2026-12-02 bad-input note (61 HTTP requests), its
security findings, and the explorer's rows of table A (184-187, 192).

A real ``mksim explore`` serves (a subprocess, as a user starts it); the requests are the Dash callback POSTs
the pages send, built from ``/_dash-dependencies``, with values no page sends. Every callback answers with the
page's one-line ``error: ...`` (HTTP 200), never HTTP 500; Dash's own routes answer 400, 404, 413 or 414 with
one short line; the server keeps serving after every request and its log stays small (one line a request,
never the request's body). The security rows: nothing in the explorer's folder is ever unpickled (a planted
pickle creates no file), the folder is 0700 and this user's (another user's, or a world-writable one, is
refused), a planted ``job.json`` never makes Cancel signal a foreign process, and no code under mksim/,
hwmodels/, explorer/ or validation/ uses pickle, marshal, shelve, eval, exec or diskcache.

Bounds (rows B27, B4): a 19 MB gzip upload of a 500 MiB trace is refused in under 5 s, with the server's peak
memory (VmHWM) under 1 GiB; a 200 MB POST is refused before it is read and adds under 64 KiB to the log.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import http.client
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

pytest.importorskip("dash")
pytest.importorskip("optuna")

from explorer import jobs, store  # noqa: E402
from mksim.errors import MksimError  # noqa: E402
from tests.clirun import as_from_a_terminal  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "data" / "trace-llama-3.2-1b-b1-step.json.gz"
CONFIG = ROOT / "mksim" / "models" / "configs" / "llama-3.2-1b.json"
WAIT_S = 90
GIB = 1 << 30


# -- the server ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


class Server:
    """``mksim explore`` in a subprocess, its log in a file."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.port = _free_port()
        self.log = tmp / f"explore-{self.port}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "mksim", "explore", "--port", str(self.port), *args],
                                         cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=as_from_a_terminal)
        deadline = time.monotonic() + WAIT_S
        while True:
            with contextlib.suppress(OSError):
                if self.get("/")[0] == 200:
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"mksim explore did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.3)
        self.deps = json.loads(self.get("/_dash-dependencies")[1])

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 120,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request("GET", path, timeout=30)

    def serving(self) -> bool:
        return self.proc.poll() is None and self.get("/")[0] == 200

    def hwm_bytes(self) -> int:
        """The server's peak resident memory so far (VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")

    # the callbacks
    def dep(self, output: str) -> dict:
        found = [d for d in self.deps if output in d["output"].strip(".").split("...")]
        assert len(found) == 1, output
        return found[0]

    def callback(self, output: str, values: dict, changed: str | None = None) -> tuple[int, bytes]:
        """POST the callback whose outputs include ``output`` with ``values`` ("id.prop" -> value; a
        pattern-matching input gets ``[]``); ``changed`` is the input that fired (default: the first)."""
        d = self.dep(output)

        def props(specs: list[dict]) -> list:
            return [[] if s["id"].startswith("{") else
                    {"id": s["id"], "property": s["property"], "value": values.get(f"{s['id']}.{s['property']}")}
                    for s in specs]

        outs = [dict(zip(("id", "property"), o.rsplit(".", 1), strict=True))
                for o in d["output"].strip(".").split("...")]
        body = {"output": d["output"], "outputs": outs if len(outs) > 1 else outs[0], "inputs": props(d["inputs"]),
                "state": props(d["state"]),
                "changedPropIds": [changed or f"{d['inputs'][0]['id']}.{d['inputs'][0]['property']}"]}
        raw = json.dumps(body).replace('"__INF__"', "1e400").encode()
        return self.request("POST", "/_dash-update-component", raw, headers={"Content-Type": "application/json"})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("hostile"))
    yield s
    s.stop()


def _text(node) -> str:
    """The text of a Dash component tree (or a plain value) as the page shows it."""
    if node is None:
        return ""
    if isinstance(node, str | int | float):
        return str(node)
    if isinstance(node, list):
        return "".join(_text(n) for n in node)
    if isinstance(node, dict):
        return _text(node.get("props", {}).get("children")) if "props" in node else ""
    return ""


def _answer(status: int, raw: bytes, output: str) -> str:
    """The text the page shows in ``output`` ("id.prop") of a callback's answer; the answer must be 200."""
    assert status == 200, (status, raw[:300])
    cid, prop = output.rsplit(".", 1)
    return _text(json.loads(raw)["response"][cid][prop])


def _one_line_error(text: str) -> None:
    assert text.startswith("error: ") and "\n" not in text and "Traceback" not in text and len(text) < 800, text


def _upload(raw: bytes, kind: str = "application/json") -> str:
    return f"data:{kind};base64," + base64.b64encode(raw).decode()


# -- the pages' normal values, then each row's ------------------------------------------------------
COMPARE = {"compare-run.n_clicks": 1, "compare-model.value": "llama-3.2-1b", "compare-gpu.value": "h200-datasheet",
           "compare-batch.value": 1, "compare-kv-len.value": 1024, "compare-phase.value": "decode",
           "compare-profile.value": "none", "compare-stack.value": "none", "compare-upload.filename": "config.json",
           "compare-trace-upload.filename": "step.json.gz"}
TIMELINE = {"timeline-run.n_clicks": 1, "timeline-model.value": "llama-3.2-1b", "timeline-gpu.value": "h200-datasheet",
            "timeline-batch.value": 1, "timeline-kv-len.value": 1024, "timeline-phase.value": "decode",
            "timeline-mode.value": "megakernel", "timeline-prefill-tokens.value": 128, "timeline-trace.n_clicks": 1,
            "timeline-upload.filename": "s.json"}
SEARCH = {"search-start.n_clicks": 1, "search-model.value": "llama-3.2-1b", "search-gpu.value": "h200-datasheet",
          "search-batch.value": 1, "search-kv-len.value": 1024, "search-trials.value": 60,
          "search-objectives.value": "latency", "search-cancel.n_clicks": 1}
SCHEDULE = {"format": "mksim-schedule", "version": 1, "mode": "stream", "gpu": "h200-datasheet",
            "workload": {"model": "llama-3.2-1b", "batch": 1, "kv_len": 1024}, "tiling": {"default": 1}}


def _trace(edit=None) -> bytes:
    d = json.loads(gzip.decompress(TRACE.read_bytes()))
    if edit:
        edit(d)
    return gzip.compress(json.dumps(d).encode())


def _stream_list(d: dict) -> None:
    next(e for e in d["traceEvents"] if e.get("cat") == "kernel")["args"]["stream"] = [7]


def _cfg(**over) -> bytes:
    return json.dumps({**json.loads(CONFIG.read_text()), **over}).encode()


def _sched(**over) -> str:
    s = json.loads(json.dumps(SCHEDULE))
    for k, v in over.items():
        if k.startswith("wl_"):
            s["workload"][k[3:]] = v
        else:
            s[k] = v
    return json.dumps(s)


CFG_OUT, CMP_OUT, TRACE_OUT = "compare-upload-message.children", "compare-message.children", \
    "compare-trace-message.children"
TL_OUT, SEARCH_OUT, POLL_OUT = "timeline-message.children", "search-job.data", "search-message.children"

# (row id, output shown, page values, the input that fired, what the answer holds: "error" (the one-line error,
# with this text in it) or "ok" (this text in a good answer))
CALLBACK_ROWS = [
    ("B5-cfg-base64-garbage", CFG_OUT, {"compare-upload.contents": "data:application/json;base64,@@@!!"}, None,
     "error", "bad base64"),
    ("B6-cfg-no-comma", CFG_OUT, {"compare-upload.contents": "data:application/json;base64"}, None,
     "error", "not an uploaded file"),
    ("B7-cfg-contents-number", CFG_OUT, {"compare-upload.contents": 5}, None, "error", "not an uploaded file"),
    ("B8-cfg-contents-list", CFG_OUT, {"compare-upload.contents": [1, 2]}, None, "error", "not an uploaded file"),
    ("B9-cfg-nested-50000", CFG_OUT, {"compare-upload.contents": _upload(b"[" * 50000 + b"]" * 50000)}, None,
     "error", "nested more than"),
    ("B10-cfg-mixtral", CFG_OUT, {"compare-upload.contents": _upload(_cfg(model_type="mixtral")),
                                  "compare-upload.filename": "mixtral.json"}, None, "error", "mixtral.json: "),
    ("B11-cfg-filename-traversal-fine", CFG_OUT, {"compare-upload.contents": _upload(_cfg()),
                                                  "compare-upload.filename": "../../../../tmp/pwned.json"}, None,
     "ok", "loaded pwned: "),
    ("B12-cfg-nan-hidden", CFG_OUT, {"compare-upload.contents": _upload(_cfg(hidden_size=float("nan"))),
                                     "compare-upload.filename": "nan.json"}, None, "error", "nan.json: "),
    ("B13-cfg-utf16", CFG_OUT, {"compare-upload.contents": _upload('{"a": 1}'.encode("utf-16")),
                                "compare-upload.filename": "u16.json"}, None, "error", "u16.json: "),
    ("B14-cmp-batch-1e9", CMP_OUT, {"compare-batch.value": 10**9}, None, "error", "GB"),
    ("B15-cmp-batch-str", CMP_OUT, {"compare-batch.value": "many"}, None, "error", "batch must be a whole number"),
    ("B16-cmp-batch-1e400", CMP_OUT, {"compare-batch.value": 1.5, "compare-kv-len.value": "__INF__"}, None,
     "error", "batch must be a whole number, got 1.5"),
    ("B17-cmp-model-abs-path", CMP_OUT, {"compare-model.value": str(CONFIG.with_suffix(""))}, None,
     "error", "unknown model"),
    ("B18-cmp-gpu-etc-passwd", CMP_OUT, {"compare-gpu.value": "/etc/passwd"}, None, "error", "unknown GPU"),
    ("B19-cmp-gpu-etc-shadow", CMP_OUT, {"compare-gpu.value": "/etc/shadow"}, None, "error", "unknown GPU"),
    ("B20-cmp-model-dict", CMP_OUT, {"compare-model.value": {"a": 1}}, None, "error", "unknown model a dict"),
    ("B21-cmp-config-dict-hostile", CMP_OUT, {"compare-model.value": "uploaded: x",
                                              "compare-config.data": {"name": "x", "config": "notadict"}}, None,
     "error", "the uploaded config is gone"),
    ("B22-trace-good-fine", TRACE_OUT, {"compare-trace-upload.contents": _upload(TRACE.read_bytes())}, None,
     "ok", "imported step.json.gz"),
    ("B23-trace-nested", TRACE_OUT, {"compare-trace-upload.contents": _upload(b"[" * 50000 + b"]" * 50000)}, None,
     "error", "step.json.gz: "),
    ("B24-trace-stream-list", TRACE_OUT, {"compare-trace-upload.contents": _upload(_trace(_stream_list))}, None,
     "error", "step.json.gz: "),
    ("B25-trace-filename-traversal-fine", TRACE_OUT, {"compare-trace-upload.contents": _upload(TRACE.read_bytes()),
                                                      "compare-trace-upload.filename": "../../../../tmp/x.json.gz"},
     None, "ok", "imported x.json.gz"),
    ("B26-trace-model-server-path", TRACE_OUT, {"compare-trace-upload.contents": _upload(TRACE.read_bytes()),
                                                "compare-model.value": str(CONFIG)}, None, "error", "unknown model"),
    ("B28-tl-schedule-gpu-etc-passwd", TL_OUT,
     {"timeline-upload.contents": _upload(_sched(gpu="/etc/passwd").encode())}, "timeline-upload.contents",
     "error", "the explorer reads GPU names only"),
    ("B29-tl-schedule-gpu-toml-path", TL_OUT,
     {"timeline-upload.contents": _upload(_sched(gpu="/root/.bashrc.toml").encode())}, "timeline-upload.contents",
     "error", "the explorer reads GPU names only"),
    ("B30-tl-schedule-model-abs-path", TL_OUT,
     {"timeline-upload.contents": _upload(_sched(wl_model=str(CONFIG)).encode())}, "timeline-upload.contents",
     "error", "schedule workload unknown model"),
    ("B31-tl-schedule-unknown-workload-key", TL_OUT,
     {"timeline-upload.contents": _upload(_sched(wl_foo=1).encode())}, "timeline-upload.contents", "error", ""),
    ("B32-tl-schedule-nested", TL_OUT, {"timeline-upload.contents": _upload(b"{" + b'"a":[' * 50000)},
     "timeline-upload.contents", "error", ""),
    ("B33-tl-token-traversal", TL_OUT, {"timeline-token.data": "../../../../etc/passwd"}, "timeline-token.data",
     "error", "no schedule kept under '../../../../etc/passwd'"),
    ("B37-search-cancel-dotdot", "search-cancel-message.children", {"search-job.data": {"job": ".."}}, None,
     "ok", "no running search to cancel"),
    ("B39-search-poll-job-not-dict", POLL_OUT, {"search-job.data": "search-1"}, "search-job.data", "error",
     "not one it made"),
    ("B40-search-trials-1e12", SEARCH_OUT, {"search-trials.value": 10**12}, None, "error",
     "trials must be at most 2000"),
]


@pytest.mark.parametrize("output,values,changed,verdict,text",
                         [pytest.param(*r[1:], id=r[0]) for r in CALLBACK_ROWS])
def test_callback_rows(server, output, values, changed, verdict, text):
    page = {**COMPARE, **TIMELINE, **SEARCH, **values}
    status, raw = server.callback(output, page, changed)
    if output == SEARCH_OUT:  # the followed study's dict: an error is {"error": line}
        assert status == 200, raw[:300]
        got = json.loads(raw)["response"]["search-job"]["data"]
        assert set(got) == {"error"} and text in got["error"] and "\n" not in got["error"]
    else:
        shown = _answer(status, raw, output)
        if verdict == "error":
            _one_line_error(shown)
            assert text in shown
        else:
            assert text in shown and "error" not in shown
    assert server.serving()


@pytest.mark.parametrize("row", ["B11-B25-uploads-write-nothing-outside"])
def test_uploads_write_nothing_outside_their_folders(server, row):
    """Rows B11 and B25 ran above (module order): the names they gave wrote nothing where they point."""
    assert not Path("/tmp/pwned.json").exists() and not Path("/tmp/x.json.gz").exists()


@pytest.mark.parametrize("job", [
    pytest.param({"job": None, "storage": "postgresql://evil.example:5432/x", "study": "s", "trials": None},
                 id="B35-search-storage-postgres-remote-ignored"),
    pytest.param({"job": None, "storage": "sqlite:////etc/passwd", "study": "s", "trials": None},
                 id="B38-search-poll-hostile-storage-ignored"),
])
def test_followed_storage_is_the_servers(server, job):
    """The followed study's storage comes from the server, never from the browser's copy."""
    shown = _answer(*server.callback(POLL_OUT, {"search-job.data": job}, "search-job.data"), POLL_OUT)
    _one_line_error(shown)
    assert "evil" not in shown and "/etc/passwd" not in shown
    assert "no study 's'" in shown or "no study storage at" in shown


@pytest.mark.parametrize("row", ["B36-search-study-list-is-the-servers"])
def test_study_list_is_the_servers(server, row):
    status, raw = server.callback("search-studies.options", {"search-job.data": {"storage": "/etc/passwd"}})
    assert status == 200 and json.loads(raw)["response"]["search-studies"]["options"] == []


@pytest.mark.parametrize("row", ["B34-tl-trace-download-hostile-schedule"])
def test_trace_download_of_a_hostile_schedule(server, row):
    status, raw = server.callback("timeline-trace-file.data", {"timeline-trace.n_clicks": 1,
                                                               "timeline-schedule.data": _sched(gpu="/etc/passwd")})
    assert status in (200, 204) and b"passwd" not in raw  # no download, no error page
    assert server.serving()


@pytest.mark.parametrize("study", [
    pytest.param("../../../tmp/made-by-b59.db", id="B59-search-study-is-a-path"),
    pytest.param("sqlite:////tmp/made-by-b59.db", id="B59-search-study-is-a-url"),
    pytest.param("VICTIM", id="B60-search-study-is-an-existing-file"),
])
def test_search_cannot_write_outside_its_folder(server, study, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    page = {**SEARCH, "search-trials.value": 26, "search-study.value": study.replace("VICTIM", str(victim))}
    status, raw = server.callback(SEARCH_OUT, page)
    got = json.loads(raw)["response"]["search-job"]["data"]
    assert status == 200 and "give a name of letters" in got["error"]
    assert not Path("/tmp/made-by-b59.db").exists() and victim.read_text() == "keep me"


# -- Dash's routes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("body,status", [
    pytest.param(b"not json at all", 400, id="B1-raw-not-json"),
    pytest.param(b"{}", 400, id="B2-raw-empty-object"),
    pytest.param(json.dumps({"output": "nope.children", "inputs": [], "state": []}).encode(), 400,
                 id="B3-raw-unknown-output"),
    pytest.param(b"[" * 50000 + b"]" * 50000, 400, id="B3-raw-nested-body"),
    pytest.param(json.dumps({"output": "compare-roofline.figure", "inputs": 5}).encode(), 400,
                 id="B3-raw-inputs-not-a-list"),
])
def test_raw_posts(server, body, status):
    got, raw = server.request("POST", "/_dash-update-component", body, headers={"Content-Type": "application/json"})
    assert got == status and raw.startswith(b"error: ") and raw.count(b"\n") == 1 and len(raw) < 300
    assert server.serving()


@pytest.mark.parametrize("value", [pytest.param(5, id="B3-dash-own-callback-number"),
                                   pytest.param({"a": 1}, id="B3-dash-own-callback-dict")])
def test_dashs_own_callback_type_confused(server, value):
    """Dash's own page-routing callback given a pathname no browser sends: 400 and one line, not 500."""
    status, raw = server.callback("_pages_content.children", {"_pages_location.pathname": value})
    assert status == 400 and raw.startswith(b"error: ") and raw.count(b"\n") == 1
    assert server.serving()


@pytest.mark.parametrize("path,status", [
    pytest.param("/_dash-component-suites/dash/../../../../../../etc/passwd", 404, id="B41-suites-dotdot"),
    pytest.param("/_dash-component-suites/dash/..%2f..%2f..%2f..%2f..%2fetc%2fpasswd", 404, id="B42-suites-2f"),
    pytest.param("/_dash-component-suites/dash/deps/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/", 404,
                 id="B43-suites-2e2e"),
    pytest.param("/assets/../../../../etc/passwd", 404, id="B44-assets-dotdot"),
    pytest.param("/assets/..%2f..%2f..%2fetc%2fpasswd", 404, id="B45-assets-2f"),
    pytest.param("/_dash-component-suites/mksim/cli.py", 404, id="B46-suites-mksim"),
    pytest.param("/_dash-component-suites/explorer/app.py", 404, id="B47-suites-explorer"),
    pytest.param("/_dash-component-suites/dash/__init__.py", 404, id="B48-suites-dash-init"),
    pytest.param("/_favicon.ico?v=../../etc/passwd", 200, id="B50-favicon-fine"),
    pytest.param("/timeline?schedule=../../../etc/passwd", 200, id="B51-timeline-token-fine"),
    pytest.param("/..%2f..%2fetc/passwd", 404, id="B52-root-2f"),
    pytest.param("/" + "a" * 100_000, 414, id="B53-long-path"),
    pytest.param("/_dash-layout", 200, id="B55-layout-fine"),
    pytest.param("/console", 404, id="B56-console"),
    pytest.param("/_dash-component-suites/dash/dcc/../../../../../../../../tmp/x", 404, id="B57-suites-tmp"),
])
def test_gets(server, path, status):
    got, raw = server.get(path)
    assert got == status and b"root:" not in raw
    assert server.serving()


@pytest.mark.parametrize("row", ["B49-registered-script-fine", "B54-reload-hash-fine"])
def test_dash_assets_fine(server, row):
    """A script Dash registered is served (B49: one the page names), and Dash's reload hash (B54)."""
    if row.startswith("B49"):
        page = server.get("/")[1].decode()
        script = re.search(r'src="(/_dash-component-suites/[^"]+\.js[^"]*)"', page)
        assert script and server.get(script.group(1))[0] == 200
    else:
        assert server.get("/_reload-hash")[0] in (200, 404)  # some Dash versions serve it in debug mode only
    assert server.serving()


@pytest.mark.parametrize("size", [pytest.param(200 << 20, id="B4-200mb-post")])
def test_huge_post_is_refused_unread(server, size):
    """Refused (413) from its Content-Length, before it is read: the log grows by a line, not by the body."""
    before = server.log.stat().st_size
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    status = None
    try:
        conn.putrequest("POST", "/_dash-update-component")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        chunk = b'{"output": "' + b"x" * (1 << 20)
        with contextlib.suppress(OSError):
            for _ in range(size >> 20):
                conn.send(chunk[: 1 << 20])
        with contextlib.suppress(OSError, http.client.HTTPException):
            status = conn.getresponse().status
    finally:
        conn.close()
    assert status in (413, None)  # None: the server answered and closed while the client still sent
    time.sleep(0.5)
    assert server.log.stat().st_size - before < 64 << 10
    assert server.serving()


def _bomb(path: Path) -> Path:
    """A gzip of a 500 MiB trace of kernel events (about 19 MB: each MiB carries incompressible padding)."""
    if path.exists():
        return path
    d = json.loads(gzip.decompress(TRACE.read_bytes()))
    one = (json.dumps(next(e for e in d["traceEvents"] if e.get("cat") == "kernel")) + ",").encode()
    chunk = one * ((1 << 20) // len(one))
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    parts = [c.compress(b'{"traceEvents": [')]
    for _ in range(500):
        pad = os.urandom(19_000).hex().encode()
        parts.append(c.compress(b'{"ph": "i", "name": "pad", "args": {"p": "' + pad + b'"}},' + chunk))
    parts += [c.compress(one[:-1] + b"]}"), c.flush()]
    path.write_bytes(b"".join(parts))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("row", ["B27-gz-bomb-19MB-of-500MiB"])
def test_gz_bomb_is_refused_fast_in_bounded_memory(server, tmp_path_factory, row):
    bomb = _bomb(tmp_path_factory.getbasetemp() / "bomb-500MiB.json.gz")
    assert 15e6 < bomb.stat().st_size < 25e6
    values = {**COMPARE, "compare-trace-upload.contents": _upload(bomb.read_bytes(), "application/gzip"),
              "compare-trace-upload.filename": "bomb.json.gz"}
    t0 = time.monotonic()
    status, raw = server.callback(TRACE_OUT, values)
    took = time.monotonic() - t0
    shown = _answer(status, raw, TRACE_OUT)
    _one_line_error(shown)
    assert "bomb.json.gz: over 64 MiB uncompressed" in shown
    assert took < 5, took
    assert server.hwm_bytes() < GIB, server.hwm_bytes()
    assert server.serving()


@pytest.mark.parametrize("row", ["B27-run-does-not-import-again"])
@pytest.mark.slow  # 1.4 s of CPU
def test_run_does_not_import_again(monkeypatch, row):
    """Run re-imports the page's trace with its inputs: the same upload and inputs are remembered by digest,
    an import and a refusal alike, so a refused bomb is not inflated again at each Run."""
    from collections import OrderedDict

    from explorer import stacks

    calls = []
    real = stacks._trace_data
    monkeypatch.setattr(stacks, "_TRACES", OrderedDict())
    monkeypatch.setattr(stacks, "_trace_data", lambda *a: calls.append(a[1]) or real(*a))
    good = _upload(TRACE.read_bytes(), "application/gzip")
    first = stacks.trace_data(good, "t.json.gz", "llama-3.2-1b", "h200-datasheet")
    assert stacks.trace_data(good, "t.json.gz", "llama-3.2-1b", "h200-datasheet") == first
    bad = _upload(gzip.compress(b" " * (65 << 20), 1), "application/gzip")
    for _ in range(2):
        with pytest.raises(MksimError, match=r"^b\.json\.gz: over 64 MiB uncompressed"):
            stacks.trace_data(bad, "b.json.gz", "llama-3.2-1b", "h200-datasheet")
    assert calls == ["t.json.gz", "b.json.gz"]
    stacks.trace_data(good, "t.json.gz", "llama-3.2-1b", "h200-datasheet", kv_len=2048)  # other inputs: imported again
    assert calls == ["t.json.gz", "b.json.gz", "t.json.gz"]


@pytest.mark.slow
@pytest.mark.parametrize("row", ["B58-flood-of-compares-fine"])
def test_flood_of_compares(server, row):
    """Distinct comparisons at once all answer (the note sent 12: all 200 in 9 s; 4 here, a core each is
    shared by the test machine's other work)."""
    results: list[int] = []

    def one(kv: int) -> None:
        results.append(server.callback(CMP_OUT, {**COMPARE, "compare-kv-len.value": kv})[0])

    threads = [threading.Thread(target=one, args=(512 + 64 * i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert results == [200] * 4 and server.serving()


@pytest.mark.slow
@pytest.mark.parametrize("row", ["B61-search-cancel-fine"])
def test_cancel_a_running_search(server, row):
    """A search started from the page (bounded trials) is cancelled from the page."""
    page = {**SEARCH, "search-trials.value": 2000, "search-study.value": "b61"}
    status, raw = server.callback(SEARCH_OUT, page)
    job = json.loads(raw)["response"]["search-job"]["data"]
    assert status == 200 and job["job"].startswith("search-"), job
    shown = _answer(*server.callback("search-cancel-message.children", {"search-cancel.n_clicks": 1,
                                                                        "search-job.data": job}),
                    "search-cancel-message.children")
    assert shown == "search cancelled"
    assert server.serving()


# -- security: the explorer's folder, the cache, the registry ---------------------------------------
class _Plant:
    """Unpickling this creates ``path`` (what a planted pickle would do, harmlessly)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_S1_planted_pickle_is_never_run(tmp_path, monkeypatch):
    """A pickle planted in the cache folder (as a diskcache row of mode 4, and as a schedule file) is never
    unpickled: looking its token up finds no schedule, and the file the pickle would create never appears."""
    home = tmp_path / "home"
    monkeypatch.setenv("MKSIM_EXPLORER_CACHE", str(home))
    sentinel = tmp_path / "PWNED"
    token = "deadbeef" * 4
    folder = store.home() / "schedules"
    folder.mkdir(mode=0o700)
    payload = pickle.dumps(_Plant(sentinel))
    (folder / f"{token}.json").write_bytes(payload)
    (folder / "deadbeefdeadbeef.json").write_bytes(payload)
    (store.home() / "deadbeefdeadbeef.val").write_bytes(payload)
    try:  # the row of the demonstrated attack, where diskcache kept it (cache.db)
        import diskcache
    except ImportError:
        pass
    else:
        with diskcache.Cache(str(store.home())) as c:
            c.set("schedule:deadbeefdeadbeef", _Plant(sentinel))
            c.set(f"schedule:{token}", _Plant(sentinel))
    from explorer.pages.timeline import show_timeline

    assert store.get_schedule("deadbeefdeadbeef") is None
    assert store.get_schedule(token) is None  # not UTF-8 text: no schedule
    for t in ("deadbeefdeadbeef", token):
        msg = show_timeline(None, None, None, None, None, None, None, None, token=t)[0]
        _one_line_error(msg)
    assert not sentinel.exists()


def test_S2_planted_pickle_through_the_server(server, explorer_folder, tmp_path):
    """The demonstrated attack end to end: plant in the folder of a running server (the session's explorer
    folder, which the module's server uses), then open /timeline?schedule=<token>."""
    sentinel = tmp_path / "PWNED"
    planted = explorer_folder / "schedules" / ("deadbeef" * 4 + ".json")
    planted.parent.mkdir(mode=0o700, exist_ok=True)
    planted.write_bytes(pickle.dumps(_Plant(sentinel)))
    try:
        with contextlib.suppress(ImportError):
            import diskcache

            with diskcache.Cache(str(explorer_folder)) as c:
                c.set("schedule:deadbeefdeadbeef", _Plant(sentinel))
        for token in ("deadbeefdeadbeef", "deadbeef" * 4):
            shown = _answer(*server.callback(TL_OUT, {**TIMELINE, "timeline-token.data": token},
                                             "timeline-token.data"), TL_OUT)
            _one_line_error(shown)
            assert "no schedule kept" in shown
    finally:
        planted.unlink()
    assert not sentinel.exists()


def test_S3_folder_is_0700_and_ours(tmp_path, monkeypatch):
    monkeypatch.delenv("MKSIM_EXPLORER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    home = store.home()
    assert home == tmp_path / "xdg" / "mksim" / "explorer"
    st = home.stat()
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.getuid()
    token = store.put_schedule('{"a": 1}')
    assert re.fullmatch(r"[0-9a-f]{32}", token) and store.get_schedule(token) == '{"a": 1}'
    f = home / "schedules" / f"{token}.json"
    assert f.stat().st_mode & 0o777 == 0o600 and f.read_text() == '{"a": 1}'  # plain JSON text
    monkeypatch.setenv("MKSIM_EXPLORER_JOBS", "")
    assert jobs.jobs_dir() == home / "jobs" and jobs.jobs_dir().stat().st_mode & 0o777 == 0o700
    monkeypatch.delenv("MKSIM_EXPLORER_STORAGE", raising=False)
    assert jobs.default_storage() == f"sqlite:///{home / 'studies.db'}"


@pytest.mark.parametrize("bad", ["world-writable", "group-writable", "another-user", "a-file", "a-link-of-another"])
def test_S4_foreign_or_open_folder_is_refused(tmp_path, monkeypatch, bad):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    if bad == "world-writable":
        folder.chmod(0o777)
    elif bad == "group-writable":
        folder.chmod(0o770)
    elif bad == "another-user":
        if os.getuid() == 0:
            os.chown(folder, 65534, 65534)
        else:
            real = os.getuid()
            monkeypatch.setattr(store.os, "getuid", lambda: real + 1)
    elif bad == "a-file":
        folder.rmdir()
        folder.write_text("")
    else:  # a link planted by another user pointing at a folder of ours
        if os.getuid() != 0:
            pytest.skip("needs root to make a link owned by another user")
        target = tmp_path / "mine"
        target.mkdir(mode=0o700)
        folder.rmdir()
        folder.symlink_to(target)
        os.lchown(folder, 65534, 65534)
    monkeypatch.setenv("MKSIM_EXPLORER_CACHE", str(folder))
    with pytest.raises(MksimError) as err:
        store.put_schedule("{}")
    assert "\n" not in str(err.value) and "MKSIM_EXPLORER_CACHE" in str(err.value)
    monkeypatch.setenv("MKSIM_EXPLORER_JOBS", str(folder))
    with pytest.raises(MksimError):
        jobs.jobs_dir()


def test_S8_cache_keeps_the_recently_used_within_its_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("MKSIM_EXPLORER_CACHE", str(tmp_path / "h"))
    monkeypatch.setattr(store, "SIZE_LIMIT_BYTES", 250)
    a = store.put_schedule('{"a": "' + "a" * 90 + '"}')
    time.sleep(0.02)
    b = store.put_schedule('{"b": "' + "b" * 90 + '"}')
    time.sleep(0.02)
    assert store.get_schedule(a) is not None  # used now: b is the least recently used
    time.sleep(0.02)
    c = store.put_schedule('{"c": "' + "c" * 90 + '"}')
    assert store.get_schedule(b) is None and store.get_schedule(a) and store.get_schedule(c)


def test_S5_token_validated_before_any_lookup(monkeypatch, tmp_path):
    monkeypatch.setenv("MKSIM_EXPLORER_CACHE", str(tmp_path / "h"))
    for token in ("../../etc/passwd", "DEADBEEF" * 4, "a" * 31, "a" * 33, 5, None, ["a"], {"a": 1}):
        assert store.get_schedule(token) is None
    assert not (tmp_path / "h").exists()  # nothing was looked up, not even the folder made


@pytest.fixture()
def victim():
    """A process of this user in a session of its own: what a planted job.json names."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    yield p
    p.kill()
    p.wait()


def _stat_start(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("how", ["pid-only", "pid-and-start-time", "our-own-pid"])
def test_S6_planted_job_json_never_signals(tmp_path, monkeypatch, victim, how):
    """A registry folder planted with a job.json naming another process, its lock held (so it reads as
    running): Cancel refuses in one line and signals nothing."""
    import fcntl

    monkeypatch.setenv("MKSIM_EXPLORER_JOBS", str(tmp_path / "jobs"))
    folder = jobs.jobs_dir() / "search-7"
    folder.mkdir()
    pid = os.getpid() if how == "our-own-pid" else victim.pid
    record = {"job": "search-7", "pid": pid, "model": "llama-3.2-1b", "gpu": "h200-datasheet", "study": "s",
              "storage": "sqlite:///x.db", "trials": 26, "objectives": "latency", "started": time.time()}
    if how != "pid-only":
        record["pid_start"] = _stat_start(pid)  # even the right start time: the process is no worker
    (folder / "job.json").write_text(json.dumps(record))
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert jobs.job_state("search-7")[0] == "running"
        got = jobs.cancel("search-7")
    assert got.startswith("cannot cancel search-7: its process is not a search worker") and "\n" not in got
    assert victim.poll() is None  # still alive: never signalled


BANNED_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "diskcache", "dill", "cloudpickle", "joblib"}
#: What a source must hold for a name or a string of it to be a banned module, eval or exec: the word itself,
#: or an escape (\x70, \u0070, \N{...}, octal, a line continuation) a string could spell it with.
_MAY_NAME_BANNED = re.compile("|".join(sorted(BANNED_MODULES | {"eval", "exec"})) + r"|\\[xuUN0-7\n]")


def banned_uses(path: Path, root: Path = ROOT) -> list[str]:
    """The places in a Python file's code (comments and docstrings aside: prose may say "pickle") that name a
    module of :data:`BANNED_MODULES` (as a name, or as a string such as ``import_module("pickle")``) or call
    ``eval(`` or ``exec(`` (a method ``.eval()``, torch's, is no call of the built-in)."""
    import ast
    import io
    import tokenize

    hits: list[str] = []
    source = path.read_text()
    if not _MAY_NAME_BANNED.search(source):
        return hits  # no name or string of the source can be one of them: not worth the (slow) tokenizer
    toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)]
    for i, t in enumerate(toks):
        prev = toks[i - 1].string if i else ""
        nxt = toks[i + 1].string if i + 1 < len(toks) else ""
        if t.type == tokenize.NAME and (t.string in BANNED_MODULES
                                        or t.string in ("eval", "exec") and nxt == "(" and prev != "."):
            hits.append(f"{path.relative_to(root)}:{t.start[0]}: {t.line.strip()}")
        elif t.type == tokenize.STRING and t.string[:1] in "'\"":
            with contextlib.suppress(ValueError, SyntaxError):
                if ast.literal_eval(t.string) in BANNED_MODULES:
                    hits.append(f"{path.relative_to(root)}:{t.start[0]}: {t.line.strip()}")
    return hits


def test_S7_no_pickle_eval_exec_in_the_code(tmp_path):
    """No code a file can reach unpickles, evaluates or executes: the packages' code (not tests) names no
    pickle, marshal, shelve, diskcache (or dill, joblib), and calls no eval( or exec(. Prose and doctests may
    say "pickle": the errors' documented ``__reduce__``, which lets mksim's own fork pool pass errors between
    its processes; torch modules' ``.eval()`` is a method, not the built-in."""
    hits = [h for pkg in ("mksim", "hwmodels", "explorer", "validation")
            for path in sorted((ROOT / pkg).rglob("*.py")) for h in banned_uses(path)]
    assert hits == []
    probe = tmp_path / "probe.py"  # the grep finds what it must
    probe.write_text('import pickle\nx = eval("1")\nm.eval()\nimportlib.import_module("marshal")\n'
                     '"""we never pickle"""\n')
    assert [h.split(":")[1] for h in banned_uses(probe, tmp_path)] == ["1", "2", "4"]
    probe.write_text('m = import_module("\\x70ickle")\n')  # spelt with an escape: found too
    assert [h.split(":")[1] for h in banned_uses(probe, tmp_path)] == ["1"]
    probe.write_text('"""prose: unpickling, evaluation and execution are not calls"""\nx = "\\n"\n')
    assert banned_uses(probe, tmp_path) == []


# -- mksim explore (table A's explorer rows) ---------------------------------------------------------
@pytest.mark.parametrize("row", ["A184-registry-folder-missing"])
def test_search_with_a_missing_registry_folder(tmp_path, monkeypatch, row):
    """A registry folder that does not exist yet is made (0700); a search's bad input still answers in one line."""
    monkeypatch.setenv("MKSIM_EXPLORER_JOBS", str(tmp_path / "new" / "jobs"))
    with pytest.raises(MksimError, match="trials must be at least"):
        jobs.start_search("llama-3.2-1b", "h200-datasheet", 1, 1024, 3)
    assert jobs.jobs_dir().stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("kind", [pytest.param("unwritable", id="A185-cache-unwritable"),
                                  pytest.param("file", id="A186-cache-is-a-file")])
def test_cache_folder_unusable(tmp_path, monkeypatch, kind):
    path = Path("/proc/nonexistent/cache") if kind == "unwritable" else tmp_path / "f"
    if kind == "file":
        path.write_text("")
    monkeypatch.setenv("MKSIM_EXPLORER_CACHE", str(path))
    with pytest.raises(MksimError) as err:
        store.put_schedule("{}")
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    from explorer.pages.search import open_best

    assert open_best(1, {"job": None, "storage": "x", "study": "s", "trials": None})[1].startswith("error: ")


@pytest.mark.parametrize("row", ["A187-tmpdir-missing-fine"])
def test_tmpdir_missing_is_fine(tmp_path, monkeypatch, row):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    monkeypatch.setenv("MKSIM_EXPLORER_CACHE", str(tmp_path / "home"))
    assert store.get_schedule(store.put_schedule("{}")) == "{}"


@pytest.mark.parametrize("row", ["A192-debug-refused-off-loopback"])
def test_debug_refused_off_loopback(row):
    """Refused before anything is imported or listened on (in this process: the servers below are real ones)."""
    from tests.clirun import mksim

    r = mksim("explore", "--host", "0.0.0.0", "--port", str(_free_port()), "--debug")
    assert r.returncode == 2 and r.stderr.startswith("error: --debug") and r.stderr.count("\n") == 1


@pytest.mark.slow
@pytest.mark.parametrize("row", ["A192-debug-serves"])
def test_debug_serves(tmp_path, row):
    """``mksim explore --debug`` serves (the reloader's child no longer finds its own port in use)."""
    s = Server(tmp_path, "--debug")  # it answered: the reloader's child serves (it used to exit 2 at once)
    try:
        assert s.serving() and "already in use" not in s.log.read_text()
    finally:
        s.stop()


@pytest.mark.slow
@pytest.mark.parametrize("row", ["A192-host-off-loopback-warns"])
def test_host_off_loopback_warns(tmp_path, row):
    """Listening on every address prints a warning that the server has no authentication."""
    s = Server(tmp_path, "--host", "0.0.0.0")
    try:
        log = s.log.read_text()
        assert "warning: the explorer has no authentication" in log
    finally:
        s.stop()

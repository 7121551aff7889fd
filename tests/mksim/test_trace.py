"""The Perfetto (Chrome) trace of a run: valid JSON, a track per SM and per loader, an HBM counter."""

import json

import pytest

import mksim


@pytest.fixture(scope="module", params=["graph", "megakernel"])
def trace(request, tmp_path_factory):
    res = mksim.simulate(mksim.build_schedule("llama-3.2-1b", "h200-datasheet", request.param))
    path = res.to_perfetto(tmp_path_factory.mktemp("trace") / "t.json")
    return res, json.loads(path.read_text())  # valid JSON


@pytest.mark.slow  # 2.0 s of CPU
def test_trace_structure(trace):
    res, tr = trace
    ev = tr["traceEvents"]
    assert {e["ph"] for e in ev} <= {"M", "X", "C"}
    for e in ev:
        assert e["pid"] == 0 and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert e["tid"] >= 0 and e["dur"] > 0 and -1e-9 <= e["ts"] <= res.latency_us + 1e-6
    tids = {e["tid"] for e in ev if e["ph"] == "X"}
    named = {e["tid"]: e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert tids <= set(named)  # every event on a named track
    tasks = [e for e in ev if e.get("cat") == "task"]
    assert len(tasks) == res.n_tasks


def test_loader_tracks(trace):
    res, tr = trace
    ev = tr["traceEvents"]
    named = {e["tid"]: e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    loads = [e for e in ev if e.get("cat", "").startswith("loader")]
    if res.mode == "graph":  # no loaders
        assert not loads and not any(n.endswith("loader") for n in named.values())
        return
    assert sum(n.endswith("loader") for n in named.values()) == 132
    assert all(named[e["tid"]].endswith("loader") for e in loads)
    assert {e["cat"] for e in loads} == {"loader memory", "loader bubble"}
    assert sum(e["name"].startswith("load ") for e in loads) >= res.n_tasks // 2
    sort = {e["tid"]: e["args"]["sort_index"] for e in ev if e["name"] == "thread_sort_index"}
    assert len(set(sort.values())) == len(sort)
    assert sort[named_tid(named, "SM 5")] + 1 == sort[named_tid(named, "SM 5 loader")]  # under its SM


def named_tid(named, name):
    (tid,) = [t for t, n in named.items() if n == name]
    return tid


def test_hbm_counter(trace):
    res, tr = trace
    c = [e for e in tr["traceEvents"] if e["ph"] == "C"]
    assert c and all(e["name"] == "HBM bandwidth" for e in c)
    ts = [e["ts"] for e in c]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)  # monotone timestamps
    v = [e["args"]["GB/s"] for e in c]
    peak = res.hbm_spec_Bps / 1e9
    assert all(0 <= x <= peak * (1 + 1e-9) for x in v) and max(v) > 0
    assert ts[-1] == pytest.approx(res.latency_us) and v[-1] == 0
    # the counter integrates to the bytes the run moved
    moved = sum(v[i] * (ts[i + 1] - ts[i]) for i in range(len(c) - 1)) * 1e3  # GB/s * µs -> B
    assert moved == pytest.approx(res.dram_bytes, rel=1e-6)


def test_no_counter_without_log(tmp_path):
    res = mksim.simulate(mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "graph"), timeline=False)
    ev = json.loads(res.to_perfetto(tmp_path / "t.json").read_text())["traceEvents"]
    assert not [e for e in ev if e["ph"] in "XC"]

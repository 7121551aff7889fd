"""The explorer: data extraction, pure figures, page callbacks called directly, the app's pages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("dash")

from explorer import data, figures  # noqa: E402
from mksim.sim import CATEGORIES  # noqa: E402

MODES = ["stream", "graph", "graph_pdl", "persistent_barrier", "megakernel"]


@pytest.fixture(scope="module")
def cmp():
    return data.compare_data("llama-3.2-1b", "h200-datasheet")


# -- data -------------------------------------------------------------------------------
def test_compare_data_lists_the_modes_and_the_breakdown_order(cmp):
    """compare_data is mksim.compare.compare_modes (one copy of the comparison) plus the category order."""
    assert list(cmp["modes"]) == MODES
    assert cmp["categories"] == list(CATEGORIES)
    assert set(cmp["modes"]["megakernel"]["breakdown_us"]) == set(CATEGORIES)


def test_compare_data_bad_input_raises_mksim_error():
    from mksim.errors import MksimError

    with pytest.raises(MksimError, match="batch"):
        data.compare_data("llama-3.2-1b", "h200-datasheet", batch=0)


def test_names_for_the_dropdowns():
    assert "llama-3.2-1b" in data.models()
    assert {"h200-datasheet", "h200-calibrated"} <= set(data.gpus())


@pytest.mark.parametrize("name", ["h200", "h200-heldout"])
def test_validation_data_from_committed_summaries(name):
    import json

    summary = json.loads((data._results_dir() / name / "summary.json").read_text())
    d = data.validation_data(name)
    assert len(d["cases"]) == summary["metrics"]["compared"]
    assert all(c["predicted_us"] > 0 and c["measured_us"] > 0 for c in d["cases"])
    assert set(d["by_mode"]) == set(MODES)
    assert d["metrics_line"].startswith(f"MAPE {summary['metrics']['mape_pct']:.1f} % over")
    assert name in data.validation_sets()


def test_validation_data_unknown_set():
    from mksim.errors import MksimError

    with pytest.raises(MksimError, match="unknown validation set"):
        data.validation_data("nope")


# -- figures (pure: plain data in, figure out) -------------------------------------------
def test_mode_figures_have_one_trace_per_mode(cmp):
    for fn, key in ((figures.latency_figure, "latency_us"), (figures.tokens_figure, "tokens_per_s"),
                    (figures.hbm_figure, "hbm_util")):
        fig = fn(cmp)
        assert [t.name for t in fig.data] == MODES
        assert [t.y[0] for t in fig.data] == pytest.approx([cmp["modes"][m][key] for m in MODES])


def test_breakdown_is_stacked_by_category_and_sums_to_latency(cmp):
    fig = figures.breakdown_figure(cmp)
    assert fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == list(CATEGORIES)
    for i, mode in enumerate(MODES):
        assert list(fig.data[0].x) == MODES
        total = sum(t.y[i] for t in fig.data)
        assert total == pytest.approx(cmp["modes"][mode]["latency_us"], rel=1e-3)


def test_scatter_has_band_identity_and_a_trace_per_mode():
    d = {"name": "t", "predicted_with": "m", "by_mode": {},
         "cases": [{"name": "a", "mode": "stream", "schedule": "default", "predicted_us": 90.0,
                    "measured_us": 100.0, "error_pct": -10.0},
                   {"name": "b", "mode": "megakernel", "schedule": "default", "predicted_us": 1100.0,
                    "measured_us": 1000.0, "error_pct": 10.0}]}
    fig = figures.scatter_figure(d)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    lower, upper, ident = fig.data[:3]
    for x, yl, yu, yi in zip(lower.x, lower.y, upper.y, ident.y, strict=True):
        assert yl == pytest.approx(0.9 * x) and yu == pytest.approx(1.1 * x) and yi == pytest.approx(x)
    assert upper.fill == "tonexty"
    assert [t.name for t in fig.data[3:]] == ["stream", "megakernel"]
    assert list(fig.data[3].x) == [100.0] and list(fig.data[3].y) == [90.0]


def test_error_figure_per_mode():
    d = data.validation_data("h200")
    fig = figures.error_figure(d)
    assert [t.name for t in fig.data] == ["MAPE %", "mean error %"]
    assert list(fig.data[0].x) == MODES
    assert list(fig.data[0].y) == pytest.approx([d["by_mode"][m]["mape_pct"] for m in MODES])


# -- callbacks, called directly ----------------------------------------------------------
def test_compare_callback_good_input(cmp):
    from explorer.pages.compare import run_compare

    msg, lat, tok, hbm, brk, _table, _result = run_compare(1, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode")
    assert msg == ""
    assert [t.name for t in lat.data] == MODES
    assert [t.y[0] for t in lat.data] == pytest.approx([cmp["modes"][m]["latency_us"] for m in MODES])
    assert len(brk.data) == len(CATEGORIES)


@pytest.mark.parametrize("batch,kv_len,match", [
    (0, 1024, "batch must be a positive integer"),
    (1, 10_000_000, "exceeds llama-3.2-1b's context"),
    (None, 1024, "batch must be a whole number"),
])
def test_compare_callback_bad_input_returns_the_message(batch, kv_len, match):
    from explorer.pages.compare import run_compare

    msg, *figs, table, result = run_compare(1, "llama-3.2-1b", "h200-datasheet", batch, kv_len, "decode")
    assert msg.startswith("error: ") and match in msg and "\n" not in msg
    assert table is None and result is None
    assert all(len(f.data) == 0 for f in figs)


def test_validation_callback():
    from explorer.pages.validation import show_set

    line, scatter, errors = show_set("h200")
    assert "MAPE" in line and "h200-mk-kernels" in line
    assert {t.name for t in scatter.data} >= set(MODES)
    assert show_set("nope")[0].startswith("error: unknown validation set")


# -- the app -----------------------------------------------------------------------------
def test_create_app_registers_both_pages_and_serves():
    import dash

    from explorer.app import create_app

    app = create_app()
    pages = {p["path"]: p["name"] for p in dash.page_registry.values()}
    assert {"/": "Compare", "/validation": "Validation"}.items() <= pages.items()  # the other pages: in their tests
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    assert client.get("/validation").status_code == 200
    deps = client.get("/_dash-dependencies").get_json()
    outputs = " ".join(d["output"] for d in deps)
    assert "compare-message.children" in outputs and "validation-scatter.figure" in outputs


@pytest.mark.slow  # 2.0 s of CPU
def test_a_new_process_serves_every_page_with_its_callbacks():
    """In a process of its own: Dash gives the pages' callbacks to the first app a process creates."""
    code = """if True:
        import json, dash
        from explorer.app import create_app
        app = create_app()
        client = app.server.test_client()
        print(json.dumps({"pages": {p["path"]: p["name"] for p in dash.page_registry.values()},
                          "status": [client.get(u).status_code
                                     for u in ("/", "/timeline", "/search", "/timeline?schedule=0123", "/hardware")],
                          "outputs": " ".join(d["output"] for d in client.get("/_dash-dependencies").get_json())}))
    """
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"/timeline": "Timeline", "/search": "Search", "/hardware": "Hardware"}.items() <= got["pages"].items()
    assert got["status"] == [200] * 5
    for out in ("timeline-graph.figure", "search-progress.children", "hardware-whatif.figure",
                "hardware-table.children", "compare-roofline.figure", "compare-model.options",
                "compare-table.children"):
        assert out in got["outputs"]


@pytest.mark.parametrize("path,status", [
    ("/", 200), ("/search", 200), ("/timeline/", 200), ("/hardware?gpu=h200", 200), ("/_dash-layout", 200),
    ("/nope", 404), ("/search/x", 404), ("/404", 404), ("/assets/nope.css", 404),
])
def test_unknown_paths_answer_404(path, status):
    """Dash serves its page for any path: an unknown one says "page not found" with status 404."""
    from explorer.app import create_app, not_found_layout

    r = create_app().server.test_client().get(path)
    assert r.status_code == status
    if status == 404 and not path.startswith("/assets"):
        assert "<html" in r.get_data(as_text=True).lower()  # the app still loads and shows the page below
    assert "Page not found" in str(not_found_layout())


def test_explore_without_dash_says_how_to_install():
    code = "import sys; sys.modules['dash'] = None; from mksim.cli import main; main(['explore'])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install" in lines[0] and "[explorer]" in lines[0]

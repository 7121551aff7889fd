"""Mixture of experts in the explorer: the routing input (Compare, Timeline), expert names in the simulator's
timeline, the Timeline's colour by expert and the MoE designs' stats."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("dash")

import mksim  # noqa: E402
import mksim.models  # noqa: E402
from explorer import data, figures  # noqa: E402
from explorer.pages.compare import routing_disabled, run_compare  # noqa: E402
from explorer.pages.timeline import show_timeline, timeline_view  # noqa: E402
from mksim.errors import MksimError  # noqa: E402
from mksim.sim import task_experts  # noqa: E402

EXPERT_NAME = re.compile(r"(?P<op>L\d+\.experts_\w+) e(?P<e>\d+) t(?P<t>\d+)")


# -- the routing input ---------------------------------------------------------------------
@pytest.mark.parametrize(("text", "want"), [(None, "uniform"), ("", "uniform"), ("  ", "uniform"),
                                            ("uniform", "uniform"), (" zipf:1.2 ", "zipf:1.2"), ("zipf:3", "zipf:3")])
def test_check_routing_takes_the_named_models(text, want):
    assert data.check_routing(text) == want


@pytest.mark.parametrize(("text", "says"), [
    ("zipf:abc", "the skew S of zipf:S must be a number > 0"), ("zipf:0", "must be a number > 0"),
    ("gauss", "give uniform or zipf:S"), ("uniform:2", "uniform takes no argument"),
    ("/etc/counts.json", "give uniform or zipf:S"), ("file:/tmp/c.json", "give uniform or zipf:S"),
    ("counts.json", "give uniform or zipf:S"), ("zipf:" + "1" * 60, "at most 40 characters"),
    (["zipf:1.2"], "a list"), (1.2, "a float"),
])
def test_check_routing_refuses_in_one_line(text, says):
    with pytest.raises(MksimError) as err:
        data.check_routing(text)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_compare_with_zipf_routing_reads_fewer_experts():
    msg, *_figs, table, d = run_compare(1, "olmoe-1b-7b", "h200-datasheet", 8, 1024, "decode", None, "none", "torch",
                                        "zipf:1.2")
    assert msg == "" and d["routing"] == "zipf:1.2" and d["workload"].endswith("routing=zipf:1.2")
    assert "routing=zipf:1.2" in json.dumps(table.to_plotly_json(), default=str)  # the table's caption says it
    uni = data.compare_run("olmoe-1b-7b", "h200-datasheet", 8, 1024)
    assert uni["routing"] == "uniform"
    # skewed tokens share experts: fewer distinct experts, less to read, a faster step; the stack follows
    assert d["modes"]["megakernel"]["latency_us"] < uni["modes"]["megakernel"]["latency_us"]
    assert d["stack"]["latency_us"] < data.compare_run("olmoe-1b-7b", "h200-datasheet+torch", 8, 1024,
                                                      )["modes"]["graph"]["latency_us"] * 1.01


def test_compare_routing_bad_value_one_line_and_dense_ignores_it():
    msg, *figs, table, d = run_compare(1, "olmoe-1b-7b", "h200-datasheet", 1, 1024, "decode", None, "none", "none",
                                       "zipf:x")
    assert msg.startswith("error: routing 'zipf:x'") and "\n" not in msg and table is None and d is None
    msg, *_ = run_compare(1, "olmoe-1b-7b", "h200-datasheet", 1, 1024, "decode", None, "none", "none",
                          "../counts.json")
    assert msg == "error: routing '../counts.json': give uniform or zipf:S (S > 0, 1.2 is typical)"
    msg, *_f, d = run_compare(1, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode", None, "none", "none", "zipf:1.2")
    assert msg == "" and d["routing"] == "uniform" and "routing" not in d["workload"]
    assert d == run_compare(1, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode")[-1]


def test_routing_input_is_on_for_moe_models_only():
    assert [routing_disabled(m) for m in ("llama-3.2-1b", "qwen3-30b-a3b", "olmoe-1b-7b", "mixtral-8x7b")] == \
        [True, False, False, False]
    assert routing_disabled(None) and routing_disabled(["x"]) and routing_disabled("uploaded: gone", None)


# -- expert names in the simulator's timeline ------------------------------------------------
@pytest.fixture(scope="module")
def qwen_b8():
    s = mksim.build_schedule(mksim.models.workload("qwen3-30b-a3b", batch=8), "h200-datasheet", "megakernel")
    return s, mksim.simulate(s)


def test_every_expert_task_names_its_expert(qwen_b8):
    s, r = qwen_b8
    g = s.graph
    seen: dict[str, dict[int, set[int]]] = {}
    n_expert_tasks = 0
    for t, name in enumerate(r.task_names):
        op = g.ops[int(g.op_of[t])]
        m = EXPERT_NAME.fullmatch(name)
        if op.attrs.get("grouped") == "experts":
            n_expert_tasks += 1
            assert m and m["op"] == op.name, name
            seen.setdefault(op.name, {}).setdefault(int(m["e"]), set()).add(int(m["t"]))
        else:
            assert not m and name == g.name(t)
    assert n_expert_tasks > 0 and len(set(r.task_names)) == len(r.task_names)  # every name once
    for op in g.ops:
        if op.attrs.get("grouped") == "experts":
            assert set(seen[op.name]) == set(op.attrs["group_experts"])  # experts = the op's group_experts
            tiles = int(g.n_tiles[g.workload.index[op.name]])
            assert all(ts == set(range(len(ts))) for ts in seen[op.name].values())  # t0, t1, ... per expert
            assert sum(len(ts) for ts in seen[op.name].values()) == tiles
    # what mksim simulate --timeline and the trace carry
    names = {seg["task"] for seg in r.to_dict(timeline=True)["timeline"]}
    assert any(EXPERT_NAME.fullmatch(n) for n in names)
    assert [et is not None for et in task_experts(g)] == \
        [g.ops[int(j)].attrs.get("grouped") == "experts" for j in g.op_of]


def test_the_expert_of_a_name_is_the_one_its_design_stats_count(qwen_b8):
    s = mksim.build_schedule(mksim.models.workload("qwen3-30b-a3b", batch=8), "h200-datasheet", "megakernel",
                             moe_dispatch="stride")
    r = mksim.simulate(s)
    layer = r.design_stats["moe_stride"]["layers"][0]
    ran: dict[int, set[int]] = {}
    for lane, _a, _b, t, cat in r.timeline:
        m = EXPERT_NAME.fullmatch(r.task_names[t])
        if cat == "task" and m and m["op"].startswith(f"L{layer['layer']}."):
            ran.setdefault(lane, set()).add(int(m["e"]))
    assert {sm: sorted(e) for sm, e in sorted(ran.items())} == layer["sm_experts"]


def test_dense_timeline_names_are_unchanged():
    s = mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel")
    r = mksim.simulate(s)
    g = s.graph
    assert r.task_names == [f"{op.name}[{i}]" for op, k in zip(g.ops, g.n_tiles.tolist(), strict=True)
                            for i in range(k)]
    assert r.task_names[:2] == ["embed[0]", "embed[1]"] and set(task_experts(g)) == {None}


# -- the Timeline page -----------------------------------------------------------------------
@pytest.mark.slow
def test_timeline_moe_step_colours_by_expert_and_shows_the_design_stats():
    msg, summary, fig, sched, moe = timeline_view("timeline-run", "olmoe-1b-7b", "h200-datasheet", 1, 1024, "decode",
                                                  "megakernel", None, routing="zipf:1.2",
                                                  design="megakernel:moe_stride", colour_by="expert")
    assert msg == "" and "routing=zipf:1.2" in summary and "(moe_stride)" in summary
    d = json.loads(sched)
    assert d["workload"]["routing"] == "zipf:1.2" and d["options"]["moe_dispatch"] == "stride"
    legend = [t.name for t in fig.data if t.showlegend is not False]
    experts = sorted(int(n.removeprefix("expert ")) for n in legend if n.startswith("expert "))
    assert "other tasks" in legend and experts and len(experts) == len(set(experts))
    page = json.dumps(moe.to_plotly_json(), default=str)
    assert "timeline-moe-moe_stride" in page and "mean imbalance" in page and "top-k's serial time" in page
    assert "distinct experts a layer expected" in page
    # by op kind (the default), the same step has no expert traces
    _, _, by_kind, _, _ = timeline_view("timeline-run", "olmoe-1b-7b", "h200-datasheet", 1, 1024, "decode",
                                        "megakernel", None, routing="zipf:1.2", design="megakernel:moe_stride")
    assert not any(str(t.name).startswith("expert ") for t in by_kind.data)


def test_timeline_data_expert_column():
    d = data.timeline_data("olmoe-1b-7b", "h200-datasheet", mode="graph")
    names, experts = d["tasks"]["name"], d["tasks"]["expert"]
    for n, e in zip(names, experts, strict=True):
        m = EXPERT_NAME.fullmatch(n)
        assert (int(m["e"]) if m else -1) == e
    assert d["moe"]["routing"] == "uniform" and d["design_stats"] == {}


def test_timeline_bad_moe_inputs_answer_in_one_line():
    args = ("timeline-run", "olmoe-1b-7b", "h200-datasheet", 1, 1024, "decode", "megakernel", None)
    for kw, says in ((dict(routing="zipf:-2"), "error: routing 'zipf:-2'"),
                     (dict(routing="/etc/passwd.json"), "error: routing '/etc/passwd.json'"),
                     (dict(design="megakernel:fast"), "error: unknown MoE design 'megakernel:fast'"),
                     (dict(design=["x"]), "error: MoE design: choose none"),
                     (dict(colour_by="rainbow"), "error: colour by: choose op kind or expert")):
        msg, summary, fig, sched, moe = timeline_view(*args, **kw)
        assert msg.startswith(says) and "\n" not in msg and sched is None and moe is None and not fig.data
    msg, *_ = show_timeline("timeline-run", "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode", "megakernel", None,
                            design="megakernel:moe_queue")
    assert msg == "error: moe_dispatch='queue' places a mixture of experts' expert tiles; llama-3.2-1b has no experts"


def test_timeline_dense_model_ignores_the_routing():
    msg, summary, _fig, sched, moe = timeline_view("timeline-run", "llama-3.2-1b", "h200-datasheet", 1, 1024,
                                                   "decode", "megakernel", None, routing="zipf:1.2")
    assert msg == "" and moe is None and "routing" not in summary
    assert json.loads(sched)["workload"].get("routing", "uniform") == "uniform"


def test_a_schedule_file_naming_a_routing_file_is_refused():
    s = mksim.build_schedule(mksim.models.workload("olmoe-1b-7b"), "h200-datasheet", "megakernel")
    d = json.loads(s.to_json())
    d["workload"]["routing"] = "/etc/hosts.json"
    with pytest.raises(MksimError, match=r"^schedule workload routing '/etc/hosts.json': give uniform or zipf:S"):
        data.timeline_data(schedule=json.dumps(d))


def test_expert_colours_differ():
    assert len({figures.expert_colour(e) for e in range(128)}) > 100

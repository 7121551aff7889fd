"""The ``[interconnect]`` table: the node's GPUs and links, every number sourced, bad files refused in one line."""

from __future__ import annotations

import re

import pytest

import hwmodels
from hwmodels import HardwareFileError

MULTI_GPU = ("h100", "h200-datasheet", "b200", "a100", "mi300x")


@pytest.mark.parametrize("name", sorted(hwmodels.available()))
def test_every_file_has_a_sourced_interconnect(name):
    g = hwmodels.load(name)
    node = g.node
    assert node is not None
    assert node.bandwidth_per_direction_GBps == pytest.approx(node.links_count * node.link_bandwidth_GBps, rel=0.02)
    for key in [k for k in g.numbers() if k.startswith("node.")] + ["node.topology"]:
        if g.numbers().get(key, "text") is not None:
            assert g.source_of(key).title


def test_topologies_and_links():
    nodes = {n: hwmodels.load(n).node for n in (*MULTI_GPU, "l40s", "rtx4090", "h200")}
    assert {n: x.topology for n, x in nodes.items()} == {
        "h100": "nvswitch", "h200-datasheet": "nvswitch", "b200": "nvswitch", "a100": "nvswitch", "mi300x": "mesh",
        "l40s": "pcie", "rtx4090": "pcie", "h200": "nvswitch"}
    # per direction: the datasheets' NVLink figures are both directions together (900, 1800, 600, 896 GB/s)
    assert [nodes[n].bandwidth_per_direction_GBps for n in MULTI_GPU] == [450, 450, 900, 300, 448]
    assert nodes["h200"] == nodes["h200-datasheet"]  # the calibrated files inherit it
    assert nodes["a100"].multicast_GBps is None and nodes["h100"].multicast_GBps == 450  # NVLink SHARP: Hopper on


def _with(tmp_path, text: str):
    p = tmp_path / "x.toml"
    p.write_text('extends = "h200-datasheet"\nname = "x"\n' + text + '\n[sources.t]\nkind = "estimate"\ntitle = "t"\n')
    return p


def test_bad_topology_is_one_line(tmp_path):
    p = _with(tmp_path, '[interconnect]\ntopology = { value = "torus", source = "t" }')
    with pytest.raises(HardwareFileError, match=re.escape("interconnect.topology = 'torus'; expected one of "
                                                          "nvswitch, mesh, pcie")):
        hwmodels.load(p)


def test_inconsistent_aggregate_is_refused(tmp_path):
    p = _with(tmp_path, '[interconnect]\nbandwidth_per_direction_GBps = { value = 900, source = "t" }')
    with pytest.raises(HardwareFileError, match="is not links_count x link_bandwidth_GBps"):
        hwmodels.load(p)


def test_a_file_without_the_table_has_no_node(tmp_path):
    text = hwmodels.resolve("h100").read_text()
    head, _, rest = text.partition("\n[interconnect]")
    p = tmp_path / "solo.toml"
    p.write_text(head.replace('name = "h100"', 'name = "solo"') + "\n[sources." + rest.split("\n[sources.", 1)[1])
    g = hwmodels.load(p)
    assert g.node is None and not any(k.startswith("node.") for k in g.numbers())

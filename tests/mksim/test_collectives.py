"""Communication between GPUs (mksim.costs): each algorithm against its closed form, no Environment."""

from __future__ import annotations

import pytest

import hwmodels
from mksim.costs import (
    COLLECTIVE_ALGORITHMS,
    Link,
    NcclProtocol,
    collective_us,
    direct_all_to_all_us,
    group_Bpus,
    link_rates,
    multicast_all_reduce_us,
    nccl_all_gather_us,
    nccl_all_reduce_us,
    one_shot_all_reduce_us,
    push_us,
    two_shot_all_reduce_us,
)

LL, SIMPLE = NcclProtocol("LL", 6.6, 0.6, 0.5), NcclProtocol("Simple", 8.4, 3.4, 1.0)
SWITCH = Link("nvswitch", 8, 18, 25e3, 450e3, 0.6, 450e3, (LL, SIMPLE))
MESH = Link("mesh", 8, 7, 64e3, 448e3, 0.8, 0.0, (LL,))


def test_nccl_takes_ll_for_small_messages_and_simple_for_large():
    # 8 KiB over 2 GPUs: LL, 6.6 + 2 x 0.6 + 8192 / (0.5 x 450 GB/s)
    assert nccl_all_reduce_us(8192, 2, SWITCH) == pytest.approx(6.6 + 1.2 + 8192 / 225e3)
    # 64 MiB: Simple, 8.4 + 2 x 3.4 + 64 MiB / 450 GB/s (LL would take 7.8 + 298 us)
    assert nccl_all_reduce_us(64 << 20, 2, SWITCH) == pytest.approx(8.4 + 6.8 + (64 << 20) / 450e3)
    # 8 GPUs: 14 steps of the ring, each GPU sending 2 x 7/8 of the message
    assert nccl_all_reduce_us(8192, 8, SWITCH) == pytest.approx(6.6 + 14 * 0.6 + 1.75 * 8192 / 225e3)
    assert nccl_all_gather_us(8192, 8, SWITCH) == pytest.approx(6.6 + 7 * 0.6 + 7 / 8 * 8192 / 225e3)


def test_in_kernel_all_reduce_has_no_launch_floor():
    B = 16 * 4096 * 2  # 16 tokens of a 4096-wide hidden state, bf16
    assert one_shot_all_reduce_us(B, 2, SWITCH) == pytest.approx(0.6 + B / 450e3)
    assert two_shot_all_reduce_us(B, 2, SWITCH) == pytest.approx(1.2 + B / 450e3)
    assert one_shot_all_reduce_us(B, 8, SWITCH) < nccl_all_reduce_us(B, 8, SWITCH) / 6  # 2.6 us against 16.0


def test_one_shot_and_two_shot_cross_where_the_bytes_pay_for_a_hop():
    # equal when 0.6 = 7 B / W - 1.75 B / W, B = 0.6 x 450e3 / 5.25
    b = 0.6 * 450e3 / 5.25
    assert one_shot_all_reduce_us(b, 8, SWITCH) == pytest.approx(two_shot_all_reduce_us(b, 8, SWITCH))
    assert one_shot_all_reduce_us(b / 2, 8, SWITCH) < two_shot_all_reduce_us(b / 2, 8, SWITCH)
    assert one_shot_all_reduce_us(2 * b, 8, SWITCH) > two_shot_all_reduce_us(2 * b, 8, SWITCH)


def test_a_mesh_reaches_one_peer_through_one_link():
    assert group_Bpus(2, MESH) == 64e3 and group_Bpus(8, MESH) == 448e3 and group_Bpus(2, SWITCH) == 450e3
    assert one_shot_all_reduce_us(64e3, 2, MESH) == pytest.approx(0.8 + 1.0)
    assert direct_all_to_all_us(128e3, 2, MESH) == pytest.approx(0.8 + 1.0)


def test_multicast_is_a_what_if_of_switches_that_have_it():
    B = 1 << 20
    assert multicast_all_reduce_us(B, 8, SWITCH) == pytest.approx(1.2 + 9 / 8 * B / 450e3)
    with pytest.raises(ValueError, match="no multicast"):
        multicast_all_reduce_us(B, 8, MESH)
    with pytest.raises(ValueError, match="no multicast"):
        collective_us("all_reduce", "multicast", B, 8, link_rates(hwmodels.load("a100").node))


def test_push_splits_the_links_between_the_tasks_that_push():
    assert push_us(1000, 1, 2, SWITCH) == pytest.approx(1000 / 450e3)
    assert push_us(1000, 132, 8, SWITCH) == pytest.approx(7 * 132e3 / 450e3)
    assert collective_us("all_reduce", "push", 1 << 20, 8, SWITCH) == 0.6  # only the last flag is left


def test_one_gpu_communicates_nothing():
    assert {collective_us(kind, a, 4096, 1, SWITCH) for kind in ("all_reduce", "all_gather", "all_to_all")
            for a in COLLECTIVE_ALGORITHMS} == {0.0}


def test_the_hardware_files_give_each_algorithm_its_numbers():
    h100, pcie = link_rates(hwmodels.load("h100").node), link_rates(hwmodels.load("l40s").node)
    assert h100 is not None and pcie is not None
    # NVLink: NCCL's 6.6 us LL base and 0.6 us steps; PCIe: 1.0 us steps and no LL128
    assert nccl_all_reduce_us(2048, 2, h100) == pytest.approx(6.6 + 1.2 + 2048 / (0.5 * 360e3))
    assert [p.name for p in pcie.nccl] == ["LL", "Simple"]
    assert one_shot_all_reduce_us(2048, 2, pcie) == pytest.approx(1.0 + 2048 / (0.8 * 32e3))

"""The megakernel designs are options whose defaults leave every existing prediction as it was.

The latencies below are what the simulator predicted before the designs were added (commit
e1c679b), to the last bit; the defaults, given explicitly, must predict the same.
"""

from __future__ import annotations

import pytest

import mksim
from mksim.schedule import MODES

BEFORE = {  # llama-3.2-1b, batch 1, KV 1024, µs
    ("h200-datasheet", "stream"): 862.769687111108,
    ("h200-datasheet", "graph"): 861.672247111108,
    ("h200-datasheet", "graph_pdl"): 592.8450498721633,
    ("h200-datasheet", "persistent_barrier"): 894.0722471111095,
    ("h200-datasheet", "megakernel"): 622.4514871891481,
    ("b200", "graph_pdl"): 403.9629284520375,
    ("b200", "megakernel"): 477.88692567351404,
    ("b200", "persistent_barrier"): 744.2711943788643,
    ("mi300x", "graph"): 982.0900694622096,
}
DEFAULTS = {"sync": "counter", "dispatch": "static", "schedulers": 0, "prelaunch": 1, "dies": False,
            "movement": "ideal"}


@pytest.mark.parametrize("gpu,mode", sorted(BEFORE))
def test_existing_predictions_are_unchanged(gpu, mode):
    assert mksim.simulate(mksim.build_schedule("llama-3.2-1b", gpu, mode)).latency_us == BEFORE[(gpu, mode)]


@pytest.mark.parametrize("mode", list(MODES))
def test_the_new_options_at_their_defaults_change_nothing(mode):
    opts = {k: v for k, v in DEFAULTS.items() if mode == "megakernel" or k in ("sync", "movement", "dies")}
    plain = mksim.simulate(mksim.build_schedule("llama-3.2-1b", "b200", mode))
    given = mksim.simulate(mksim.build_schedule("llama-3.2-1b", "b200", mode, **opts))
    assert given.latency_us == plain.latency_us and given.breakdown_us == plain.breakdown_us

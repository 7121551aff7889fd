"""Extension points, exercised as docs/extending.md describes them: a mode, a megakernel design and
a placement policy written here, registered at test time, and run (times in µs, toy GPU of simkit:
2 SMs, DRAM 1e6 B/µs, 1 µs latency, launch 1, 2 µs between graph nodes, a counter seen after 0.5)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import mksim
from mksim.costs import Rates
from mksim.errors import ScheduleError
from mksim.schedule import (
    CHAIN_MODES,
    MODE_DEFAULTS,
    MODES,
    POLICIES,
    BaseDesign,
    BasePolicy,
    ChainMode,
    Schedule,
    design_names,
    design_rows,
    register_design,
    register_mode,
    unregister_design,
    unregister_mode,
)
from mksim.workload import Tiling

from .simkit import chain, toy_gpu

TOL = 2e-3


class GraphEager(ChainMode):
    """A graph whose next kernel starts the instant the previous one ends (no node interval)."""

    name = "graph_eager"
    defaults = {"tasks_per_sm": 2.0, "blocks_per_sm": 2, "prefetch_depth": 0}

    def dispatch_us(self, k: int, prev_start_us: float, prev_end_us: float, r: Rates) -> float:
        return r.launch_latency_us if k == 0 else prev_end_us


class Lean(BaseDesign):
    """A megakernel that keeps no shared memory in reserve: its pages fill all of it."""

    name = "lean"
    option = "smem_reserve_KiB"
    value = 0.0
    compare_rows = (("megakernel:lean", {"smem_reserve_KiB": 0.0}),)

    def validate(self, schedule: Schedule) -> None:
        if self.on(schedule.options) and not self.applies_to(schedule.mode):
            raise ScheduleError(f"lean is a megakernel design, not one of mode {schedule.mode}")

    def adjust(self, options, gpu, mode, given):
        if "prefetch_depth" in given:
            return options
        return replace(options, prefetch_depth=int(gpu.sm.shared_memory_per_block_KiB // options.page_KiB))


class OneSM(BasePolicy):
    """Every task on SM 0, in task order."""

    name = "one_sm"

    def place(self, graph, r, n_sms):
        return [list(range(len(graph)))] + [[] for _ in range(n_sms - 1)]


@pytest.fixture
def eager():
    register_mode(GraphEager)
    yield GraphEager
    unregister_mode(GraphEager.name)


@pytest.fixture
def lean():
    register_design(Lean)
    yield Lean
    unregister_design(Lean.name)


@pytest.fixture
def one_sm():
    POLICIES.register(OneSM.name, OneSM)
    yield OneSM
    POLICIES.remove(OneSM.name)


def test_a_registered_mode_is_in_the_registry_and_runs(tmp_path, eager):
    assert "graph_eager" in MODES and "graph_eager" in CHAIN_MODES and MODES[-1] == "graph_eager"
    assert MODE_DEFAULTS["graph_eager"]["blocks_per_sm"] == 2
    gpu = toy_gpu(tmp_path)
    wl = chain(2e6, 1e6)
    # graph: launch 1, latency + 2 MB, node 2, latency + 1 MB; eager: the same without the node
    lat = {m: mksim.simulate(mksim.build_schedule(wl, gpu, m, tiling=Tiling(default=2), blocks_per_sm=1)).latency_us
           for m in ("graph", "graph_eager")}
    assert lat["graph"] == pytest.approx(1 + 3 + 2 + 2, abs=TOL)
    assert lat["graph_eager"] == pytest.approx(1 + 3 + 2, abs=TOL)


def test_an_unregistered_mode_is_gone(tmp_path):
    assert "graph_eager" not in MODES
    with pytest.raises(mksim.errors.UnknownNameError, match="unknown mode 'graph_eager'"):
        mksim.build_schedule(chain(1e6), toy_gpu(tmp_path), "graph_eager")


def test_a_registered_design_validates_adjusts_and_declares_its_rows(tmp_path, lean):
    assert design_names()[-1] == "lean"
    assert design_rows(["lean"]) == {"lean": [("megakernel:lean", {"smem_reserve_KiB": 0.0})]}
    gpu = toy_gpu(tmp_path)
    s = mksim.build_schedule(chain(2e6, 1e6), gpu, "megakernel", smem_reserve_KiB=0.0)
    assert s.options.prefetch_depth == int(gpu.sm.shared_memory_per_block_KiB // 32)
    with pytest.raises(ScheduleError, match="lean is a megakernel design, not one of mode persistent_barrier"):
        mksim.build_schedule(chain(2e6, 1e6), gpu, "persistent_barrier", smem_reserve_KiB=0.0)


def test_a_registered_policy_places_the_queues(tmp_path, one_sm):
    # every task on SM 0: op 0's two tiles back to back (launch 1, latency 1, 2 MB: ends at 4), the
    # counter 0.5, then op 1's (latency 1, 1 MB)
    gpu = toy_gpu(tmp_path)
    s = mksim.build_schedule(chain(2e6, 1e6), gpu, "megakernel", policy="one_sm", tiling=Tiling(default=2),
                             prefetch_depth=0)
    assert s.queues[0] == [0, 1, 2, 3] and s.policy == "one_sm"
    assert mksim.simulate(s).latency_us == pytest.approx(1 + 3 + 0.5 + 2, abs=TOL)


def test_every_registered_mode_runs_the_conformance_basics(tmp_path, eager):
    # the registry is what the suites iterate: a new mode is checked without naming it
    gpu = toy_gpu(tmp_path)
    for mode in MODES:
        opts: dict[str, Any] = {"blocks_per_sm": 1} if mode in CHAIN_MODES else {}
        r = mksim.simulate(mksim.build_schedule(chain(2e6, 1e6), gpu, mode, tiling=Tiling(default=2), **opts))
        assert sorted(t for (lane, _, _, t, c) in r.timeline if c == "task" and lane >= 0) == [0, 1, 2, 3], mode


def test_a_mode_file_dropped_into_the_modes_package_is_all_it_takes(tmp_path):
    # the file list docs/extending.md gives for a mode: mksim/schedule/modes/<name>.py, nothing else
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import mksim as pkg

    root = Path(pkg.__file__).parent
    shutil.copytree(root, tmp_path / "mksim", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root.parent / "hwmodels", tmp_path / "hwmodels", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "mksim" / "schedule" / "modes" / "graph_eager.py").write_text(
        "from mksim.costs import Rates\n"
        "from mksim.schedule import ChainMode, register_mode\n\n\n"
        "@register_mode\n"
        "class GraphEager(ChainMode):\n"
        "    name = 'graph_eager'\n"
        "    defaults = {'tasks_per_sm': 2.0, 'blocks_per_sm': 2, 'prefetch_depth': 0}\n\n"
        "    def dispatch_us(self, k: int, prev_start_us: float, prev_end_us: float, r: Rates) -> float:\n"
        "        return r.launch_latency_us if k == 0 else prev_end_us\n")
    code = ("import mksim; from mksim.schedule import MODES; "
            "g = [mksim.simulate(mksim.build_schedule('llama-3.2-1b', 'h200-datasheet', m)).latency_us "
            "for m in ('graph', 'graph_eager')]; print(MODES[-1], g[1] < g[0])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["graph_eager", "True"]


def test_a_registered_design_is_in_the_search_space(lean):
    # a search that includes it gives every megakernel candidate its option (search_options)
    pytest.importorskip("optuna")
    import optuna

    from mksim.search import suggest
    from mksim.search._space import check_designs

    assert check_designs("lean") == ("lean",)
    gpu = mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "graph").gpu
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):  # the first random draw that fits in shared memory
        try:
            c = suggest(study.ask(), gpu, designs=("lean",))
            break
        except optuna.TrialPruned:
            continue
    assert c.options["smem_reserve_KiB"] == 0.0


CAPPED_DESIGN = '''"""Capped loaders: every SM's loader streams at most loader_cap_GBps (0: no cap)."""

from typing import Any

from mksim.schedule import BaseDesign, register_design

CAPS_GBps = (10.0, 20.0)


def cap_Bpus(cap_GBps: float) -> float:
    """A loader's cap in bytes per microsecond."""
    return cap_GBps * 1e3


@register_design
class Capped(BaseDesign):
    name = "capped"
    option = "loader_cap_GBps"
    compare_rows = (("megakernel:capped", {"loader_cap_GBps": 10.0}),)

    def on(self, options) -> bool:
        return options.loader_cap_GBps > 0

    def search_options(self) -> dict[str, Any]:
        return {}

    def suggest(self, trial, fixed, gpu, included) -> dict[str, Any]:
        if not included or self.option in fixed:
            return {}
        return {self.option: trial.suggest_categorical(self.option, CAPS_GBps)}
'''

CAPPED_PIECE = '''"""The engine piece of capped loaders."""

from mksim.schedule.designs.capped import Capped, cap_Bpus
from mksim.sim import DesignRun, runs


@runs(Capped)
class CappedRun(DesignRun):
    def loader(self, ld) -> None:
        ld.cap = min(ld.cap, cap_Bpus(self.eng.s.options.loader_cap_GBps))

    def result(self):
        return {"cap_GBps": self.eng.s.options.loader_cap_GBps}
'''


def test_a_design_dropped_in_is_three_files(tmp_path):
    # the files docs/extending.md gives for a design with a knob and an engine side of its own: its
    # design file (with its arithmetic), its engine piece, and its Options field; nothing else. It
    # builds, runs (slower: its loaders are capped), reports, compares and is searched.
    pytest.importorskip("optuna")
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import mksim as pkg

    root = Path(pkg.__file__).parent
    shutil.copytree(root, tmp_path / "mksim", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root.parent / "hwmodels", tmp_path / "hwmodels", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "mksim" / "schedule" / "designs" / "capped.py").write_text(CAPPED_DESIGN)
    (tmp_path / "mksim" / "sim" / "designs" / "capped.py").write_text(CAPPED_PIECE)
    options = tmp_path / "mksim" / "schedule" / "_schedule.py"
    text = options.read_text()
    assert text.count("    l2_prefetch_KiB: float = 0.0\n") == 1
    options.write_text(text.replace("    l2_prefetch_KiB: float = 0.0\n",
                                    "    l2_prefetch_KiB: float = 0.0\n    loader_cap_GBps: float = 0.0\n"))
    code = """if True:
        import optuna
        import mksim
        from mksim.schedule import design_names, design_rows
        from mksim.search import suggest
        lat = {}
        for cap in (0.0, 10.0):
            s = mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel", loader_cap_GBps=cap)
            res = mksim.simulate(s, timeline=False)
            lat[cap] = res.latency_us
        print(design_names()[-1], lat[10.0] > 2 * lat[0.0], res.to_dict()["capped"])
        print(design_rows(["capped"]))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        caps = set()
        for _ in range(40):
            try:
                caps.add(suggest(study.ask(), s.gpu, designs=("capped",)).options["loader_cap_GBps"])
            except optuna.TrialPruned:
                pass
        print(sorted(caps))
    """
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["capped True {'cap_GBps': 10.0}",
                                     "{'capped': [('megakernel:capped', {'loader_cap_GBps': 10.0})]}",
                                     "[10.0, 20.0]"]

"""Workloads from blocks (mksim.workload.BLOCKS), the Step a workload travels with, and the KV split
derived in one place. A block written here, and one dropped into mksim/workload/blocks/ as a file, is
all a new FFN takes (docs/extending.md, "A model block")."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import mksim
from mksim import models
from mksim.errors import MksimError, WorkloadError
from mksim.schedule import Schedule
from mksim.workload import (
    BLOCKS,
    ROLES,
    BaseBlock,
    Build,
    Step,
    attended_tokens,
    blocks_of,
    build_llm_workload,
    resolved_kv_splits,
)

LLAMA = models.get("llama-3.2-1b")  # 16 layers, hidden 2048, intermediate 8192, 8 KV heads

PLAIN_MLP = '''
from mksim.workload import BLOCKS, BaseBlock, Input


@BLOCKS.add
class PlainMLP(BaseBlock):
    """up, GELU, down (GPT-2's MLP): no gate."""

    name = "plain_mlp"
    role = "ffn"

    def ops(self, b, layer, x):
        H, I, p = b.cfg.hidden_size, b.cfg.intermediate_size, f"L{layer}."
        up = b.matmul(p + "up_proj", b.norm(p + "mlp_norm", x, layer), H, I, layer, normed=True)
        act = b.add(name=p + "gelu", kind="elementwise", out_size=I, elem_bytes=b.rows * 2,
                    flops=8.0 * b.rows * I, inputs=(Input(up),), layer=layer, align=64)
        return b.matmul(p + "down_proj", act, I, H, layer, residual=x)

    def params(self, cfg, layer):
        return 2 * cfg.hidden_size * cfg.intermediate_size + cfg.hidden_size
'''


@pytest.fixture
def plain_mlp():
    namespace: dict = {}
    exec(compile(PLAIN_MLP, "plain_mlp.py", "exec"), namespace)
    yield namespace["PlainMLP"]
    BLOCKS.remove("plain_mlp")


def test_a_model_is_its_configs_blocks():
    assert ROLES == ("embedding", "attention", "ffn", "head")
    assert {r: b.name for r, b in blocks_of(LLAMA).items()} == {
        "embedding": "embed", "attention": "gqa", "ffn": "gated_mlp", "head": "lm_head"}
    assert all(BLOCKS[n].role in ROLES for n in BLOCKS)


def test_a_registered_block_builds_the_ffn_of_every_layer(plain_mlp):
    plain = models.workload(replace(LLAMA, ffn_block="plain_mlp"))
    dense = models.workload(LLAMA)
    assert [o.name for o in plain.ops if o.layer == 0][-4:] == ["L0.mlp_norm", "L0.up_proj", "L0.gelu", "L0.down_proj"]
    # the gate's weights are gone from every layer: 16 x 2048 x 8192 bf16 weights
    assert dense.weight_bytes - plain.weight_bytes == 16 * 2048 * 8192 * 2
    assert [o.name for o in plain.ops if o.layer is None] == ["embed", "final_norm", "lm_head"]
    # the model's parameters are what its blocks hold: the gates are gone
    assert LLAMA.param_count() - replace(LLAMA, ffn_block="plain_mlp").param_count() == 16 * 2048 * 8192


def test_a_registered_block_round_trips_through_a_schedule_file(plain_mlp):
    wl = models.workload(replace(LLAMA, ffn_block="plain_mlp"), batch=2, kv_len=256)
    s = mksim.build_schedule(wl, "h200-datasheet", "graph")
    assert s.workload_spec["model"]["mksim_blocks"] == {"ffn": "plain_mlp"}
    back = Schedule.from_json(s.to_json())
    assert back.workload == wl and back.workload.model.ffn_block == "plain_mlp"
    assert "mksim_blocks" not in mksim.build_schedule(models.workload(replace(LLAMA, name="mine")), "h200-datasheet",
                                                       "graph").workload_spec["model"]  # defaults: no key


@pytest.mark.parametrize("blocks,msg", [
    ({"ffn": "mla"}, "mksim_blocks: 'mla' is not a ffn block; known: gated_mlp, moe"),
    ({"mlp": "gated_mlp"}, "mksim_blocks names the role 'mlp'; give some of embedding, attention, ffn, head"),
    ("gated_mlp", "mksim_blocks = 'gated_mlp'; expected an object of role: block name"),
])
def test_a_config_naming_an_unknown_block_is_refused_in_one_line(blocks, msg):
    raw = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
           "num_attention_heads": 8, "vocab_size": 1000, "mksim_blocks": blocks}
    with pytest.raises(WorkloadError, match=msg) as exc:
        models.config_from_hf(raw)
    assert "\n" not in str(exc.value)


def test_a_block_of_another_role_or_no_block_is_refused_in_one_line():
    with pytest.raises(WorkloadError, match="ffn_block = 'gqa' is a attention block; give one of gated_mlp"):
        models.workload(replace(LLAMA, ffn_block="gqa"))
    with pytest.raises(MksimError, match="unknown block 'mla'; known: embed, gqa, gated_mlp, lm_head, moe"):
        models.workload(replace(LLAMA, ffn_block="mla"))
    with pytest.raises(ValueError, match="needs a role in"):
        BLOCKS.register("x", type("X", (BaseBlock,), {"name": "x", "role": "router", "ops": lambda *a: ""})())
    with pytest.raises(ValueError, match="must define ops"):
        BLOCKS.register("y", type("Y", (BaseBlock,), {"name": "y", "role": "ffn"})())
    assert "x" not in BLOCKS and "y" not in BLOCKS


def test_a_block_file_dropped_into_the_blocks_package_is_all_it_takes(tmp_path):
    # the files docs/extending.md gives for a block: mksim/workload/blocks/<name>.py (with its registration);
    # a config selects it by its <role>_block field (from Python here; a Hugging Face config's rule is the
    # importer's, mksim/models/_config.py)
    import mksim as pkg

    root = Path(pkg.__file__).parent
    shutil.copytree(root, tmp_path / "mksim", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root.parent / "hwmodels", tmp_path / "hwmodels", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "mksim" / "workload" / "blocks" / "plain_mlp.py").write_text(PLAIN_MLP)
    code = ("from dataclasses import replace; from mksim import models; from mksim.workload import BLOCKS; "
            "wl = models.workload(replace(models.get('llama-3.2-1b'), ffn_block='plain_mlp')); "
            "print(list(BLOCKS)[-1], sum(o.kind == 'elementwise' for o in wl.ops), len(wl.ops))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["plain_mlp", "16", "163"]


# -- the Step a workload travels with -----------------------------------------------------------------
def test_a_step_or_its_fields_make_the_same_workload():
    step = Step("llama-3.2-1b", batch=4, kv_len=512, phase="prefill", prefill_tokens=16, weight_dtype="fp8")
    wl = models.workload(step, fuse_norm=True, kv_splits=3)
    old = models.workload("llama-3.2-1b", batch=4, kv_len=512, phase="prefill", prefill_tokens=16,
                          weight_dtype="fp8", fuse_norm=True, kv_splits=3)
    assert wl == old and wl.name == old.name
    assert (wl.step.rows, wl.step.kv_total, wl.build) == (64, 528, Build(fuse_norm=True, kv_splits=3))
    assert build_llm_workload(LLAMA, Step(LLAMA, batch=4, kv_len=512, phase="prefill", prefill_tokens=16,
                                          weight_dtype="fp8"), fuse_norm=True, kv_splits=3) == wl


@pytest.mark.parametrize("call,msg", [
    (lambda: models.workload("llama-3.2-1b", batchsize=2), "unknown workload parameter 'batchsize'; known: batch"),
    (lambda: build_llm_workload(LLAMA, Step(LLAMA), batch=2), "batch is the step's; give it in the Step"),
    (lambda: models.workload(Step("llama-3.2-1b", tp=3)), "--tp 3 does not divide llama-3.2-1b's 32 attention heads"),
])
def test_a_step_given_twice_or_a_parameter_unknown_is_refused_in_one_line(call, msg):
    with pytest.raises(WorkloadError, match=msg) as exc:
        call()
    assert "\n" not in str(exc.value)


# -- the KV split, derived in one place ---------------------------------------------------------------
WINDOWED = replace(models.get("mistral-7b"), sliding_window=300, name="mistral-w300")


def test_the_kv_split_is_what_the_attention_ops_use():
    for cfg, step in ((LLAMA, Step(LLAMA, batch=2, kv_len=4000)), (WINDOWED, Step(WINDOWED, kv_len=4000)),
                      (LLAMA, Step(LLAMA, kv_len=300, phase="prefill", prefill_tokens=700))):
        for build in (Build(), Build(n_sms=16), Build(kv_splits=64)):
            wl = build_llm_workload(cfg, step, kv_splits=build.kv_splits, n_sms=build.n_sms)
            used = {op.attrs["kv_splits"] for op in wl.ops if op.kind == "attn_partial"}
            assert used == {resolved_kv_splits(cfg, step, build)}
    # a window of 300 tokens: 2 splits of at most 256 (not the 16 of 4001 tokens)
    assert attended_tokens(WINDOWED, Step(WINDOWED, kv_len=4000)) == 300
    assert resolved_kv_splits(WINDOWED, Step(WINDOWED, kv_len=4000), Build()) == 2


def test_the_search_scales_the_builders_kv_split_windows_and_prefill_included():
    import hwmodels
    from mksim.search._space import Problem

    gpu = hwmodels.load("h200-datasheet")

    def splits(problem: Problem, mult: float) -> int:
        return next(op.attrs["kv_splits"] for op in problem.workload(kv_split_mult=mult).ops
                    if op.kind == "attn_partial")

    p = Problem(WINDOWED, gpu, kv_len=4000)
    assert (splits(p, 1.0), splits(p, 2.0), splits(p, 0.5)) == (2, 4, 1)
    # prefill of 700 tokens after 300: 1000 attended, 4 splits by default, 8 doubled
    p = Problem("llama-3.2-1b", gpu, kv_len=300, phase="prefill", prefill_tokens=700)
    assert (splits(p, 1.0), splits(p, 2.0)) == (4, 8)
    assert splits(Problem("llama-3.2-1b", gpu, batch=4), 2.0) == 10  # decode, no window: as before

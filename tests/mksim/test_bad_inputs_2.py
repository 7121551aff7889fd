"""The second table of bad inputs (shared/notes/bad-inputs-2026-12-02.md), part A rows 49-138,
156-167, 172 and 177-191 (the trace rows, the search rows and the explorer rows have their own files).

Each row's id starts with the row's number (``A66-hf-tie-str``). A bad input answers with one line on
stderr, ``error: ...``, exit status 2 and no traceback, within ``ONE_LINE_S`` seconds (run_cli's alarm:
a FIFO that would block an ``open`` is interrupted by it, so a hang fails the test instead of the run);
a row the note found fine still works (exit 0); a row that lost data leaves its files byte-identical.
The files are small variants of llama-3.2-1b's config (``hf-*``) and of a schedule saved by
``build_schedule(...).to_json()`` (``s-*``), each with the one defect its name says.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mksim import build_schedule, models
from mksim.errors import MksimError, UnknownNameError
from tests.mksim.test_bad_inputs import HF, ROOT, _hf, assert_one_line, run_cli

H200_TOML = ROOT / "hwmodels/data/h200-datasheet.toml"
RAW = ROOT / "validation/results/h200-2026-11-29/quick.raw.json"
TRACE = ROOT / "tests/data/trace-llama-3.2-1b-b1-step.json.gz"
NESTED = "[" * 100_000  # deeper than any decoder's recursion limit


HF_FILES: dict[str, Any] = {
    "mixtral": _hf(model_type="mixtral", num_local_experts=8, num_experts_per_tok=2),
    "mixtral-as-mistral": _hf(model_type="mistral", num_local_experts=8, num_experts_per_tok=2),
    "qwen3moe": _hf(model_type="qwen3_moe", num_experts=128, moe_intermediate_size=768, num_experts_per_tok=8),
    "qwen3moe-as-qwen3": _hf(model_type="qwen3", num_experts=128, moe_intermediate_size=768, num_experts_per_tok=8),
    "deepseekv3": _hf(model_type="deepseek_v3", n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048,
                      kv_lora_rank=512, q_lora_rank=1536),
    "deepseekv3-as-llama": _hf(n_routed_experts=256, num_experts_per_tok=8, kv_lora_rank=512, q_lora_rank=1536),
    "mla-as-llama": _hf(kv_lora_rank=512, q_lora_rank=1536),
    "experts-per-tok": _hf(num_experts_per_tok=2),
    "experts-one": _hf(num_local_experts=1),  # one expert: a dense MLP
    "vocab0": _hf(vocab_size=0),
    "heads-neg": _hf(num_attention_heads=-4),
    "headdim-nondiv": _hf(head_dim=100),
    "hidden-str": _hf(hidden_size="2048"),
    "nan-eps": _hf(rms_norm_eps=float("nan")),
    "inf-theta": _hf(rope_theta=float("inf")),
    "nan-hidden": _hf(hidden_size=float("nan")),
    "unicode-key": {("hidden_siz\u0435" if k == "hidden_size" else k): v for k, v in HF.items()},
    "tie-str": _hf(tie_word_embeddings="false"),
    "tie-int": _hf(tie_word_embeddings=0),
    "bias-str": _hf(attention_bias="false"),
    "mtype-null": _hf(model_type=None),
    "kv-gt-heads": _hf(num_key_value_heads=64),
    "maxpos1": _hf(max_position_embeddings=1),
    "act-list": _hf(hidden_act=["silu"]),
    "llama4": _hf(model_type="llama4_text"),
    "textcfg-llama": {"model_type": "llava", "text_config": HF},
    "gemma": _hf(model_type="gemma"),
    "heads-huge": _hf(num_attention_heads=16384, num_key_value_heads=16384, head_dim=64),
    "inter-huge": _hf(intermediate_size=10**12),
    "sliding-mistral": _hf(model_type="mistral", sliding_window=512),
    "sliding-mistral-null": _hf(model_type="mistral", sliding_window=None),
    "sliding-str": _hf(model_type="mistral", sliding_window="512"),
    "sliding-zero": _hf(model_type="mistral", sliding_window=0),
    "sliding-qwen2": _hf(model_type="qwen2", use_sliding_window=True, sliding_window=512, max_window_layers=8),
    "sliding-qwen2-off": _hf(model_type="qwen2", use_sliding_window=False, sliding_window=512, max_window_layers=8),
    "sliding-qwen2-str": _hf(model_type="qwen2", use_sliding_window="true", sliding_window=512),
    "sliding-llama": _hf(sliding_window=512),  # transformers' Llama reads no window: neither does mksim
}


@pytest.fixture(scope="session")
def bad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding every bad file of the rows."""
    d = tmp_path_factory.mktemp("bad2")
    for name, cfg in HF_FILES.items():
        (d / f"hf-{name}.json").write_text(json.dumps(cfg))
    text = json.dumps(HF)
    (d / "hf-dupkey.json").write_text(text[:-1] + ', "hidden_size": 0}')
    (d / "hf-bom.json").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (d / "hf-nested.json").write_text(NESTED)
    (d / "evil.json").write_text(text)  # what `--model ../../evil` must not load as a built-in
    (d / "dir.json").mkdir()
    os.mkfifo(d / "fifo.json")
    os.mkfifo(d / "fifo.toml")
    os.symlink("loop.json", d / "loop.json")
    os.symlink("loop.toml", d / "loop.toml")
    good = json.loads(build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel").to_json())
    (d / "s-good.json").write_text(json.dumps(good))
    wl, q = good["workload"], good["queues"]

    def sched(name: str, **change: Any) -> None:
        s = json.loads(json.dumps(good))
        s.update(change)
        (d / f"s-{name}.json").write_text(json.dumps(s))

    sched("othermodel", workload={**wl, "model": "llama-3.2-3b"})
    sched("otherbatch", workload={**wl, "batch": 8})
    sched("unknown-wlkey", workload={**wl, "foo": 1})
    sched("traversal-model", workload={**wl, "model": "../" * 8 + str(d / "evil")[1:]})
    sched("a100", gpu="a100")
    sched("nsms0", workload={**wl, "n_sms": 0})
    sched("nsms-neg", workload={**wl, "n_sms": -3})
    sched("graph-mode", mode="graph", queues=None, policy=None, policy_options={})
    sched("dup-same-sm", queues=[[q[0][0], *q[0]], *q[1:]])
    sched("perop-missing", tiling={**good["tiling"], "per_op": {"L99.qkv_proj": 4}})
    sched("perkind-unknown", tiling={**good["tiling"], "per_kind": {**good["tiling"]["per_kind"], "foo": 2}})
    sched("tiling-huge", tiling={**good["tiling"], "default": 100_000})
    sched("kvsplits0", workload={**wl, "kv_splits": 0})
    sched("kvsplits-str", workload={**wl, "kv_splits": "abc"})
    sched("fuse-str", workload={**wl, "fuse_norm": "yes"})
    sched("dtype-bad", workload={**wl, "weight_dtype": "int4"})
    sched("gpu-profile-bad", gpu="h200-datasheet+nope")
    sched("policyopt-order-bad", policy_options={**good["policy_options"], "order": "random"})
    sched("policy-unknown-with-queues", policy="nonexistent")
    sched("queues-empty", queues=[])
    sched("queues-null", queues=None)
    sched("extra-toplevel", foo=1)
    sched("record-str", options={**good["options"], "record": "yes"})
    (d / "s-nested.json").write_text('{"format": "mksim-schedule", "queues": ' + NESTED)
    (d / "raw-empty.json").write_text("{}")
    (d / "raw-list.json").write_text("[]")
    (d / "raw-nested.json").write_text(NESTED)
    (d / "vr").mkdir()
    (d / "vr" / "measured.json").write_text("{}")
    (d / "measured-nested.json").write_text(NESTED)
    return d


LONG_A, LONG_G, LONG_S = "a" * 5000, "g" * 5000, "s" * 5000
TRAVERSAL = "../" * 12 + "tmp/evil"  # a relative path up to / and down again


def row(row_id: str) -> pytest.MarkDecorator:
    """A test of one row, with the row's id as its pytest id."""
    return pytest.mark.parametrize("row", [row_id])


def _wl(name: str) -> list[str]:
    return ["workload", "--model", f"{{d}}/hf-{name}.json"]


def _sim(name: str) -> list[str]:
    return ["simulate", "--schedule", f"{{d}}/s-{name}.json"]


#: (id, argv with {d} for the folder of bad files, a fragment the error line must hold)
REFUSED: list[tuple[str, list[str], str]] = [
    # Hugging Face configs
    ("A50-hf-mixtral-as-mistral", _wl("mixtral-as-mistral"), "mixture-of-experts config (8 experts"),
    ("A50-hf-experts-per-tok", _wl("experts-per-tok"), "mixture-of-experts"),
    ("A52-hf-qwen3moe-as-qwen3", _wl("qwen3moe-as-qwen3"), "mixture-of-experts config (128 experts"),
    ("A53-hf-deepseekv3", _wl("deepseekv3"), "deepseek_v3 uses multi-head latent attention (kv_lora_rank = 512"),
    ("A54-hf-deepseekv3-as-llama", _wl("deepseekv3-as-llama"), "mixture-of-experts config (256 experts"),
    ("A54-hf-mla-as-llama", _wl("mla-as-llama"), "latent attention"),
    ("A55-hf-vocab0", _wl("vocab0"), "vocab_size = 0"),
    ("A56-hf-heads-neg", _wl("heads-neg"), "num_attention_heads = -4"),
    ("A58-hf-hidden-str", _wl("hidden-str"), "hidden_size = '2048'"),
    ("A59-hf-nan-eps", _wl("nan-eps"), "rms_norm_eps = nan"),
    ("A60-hf-inf-theta", _wl("inf-theta"), "rope_theta = inf"),
    ("A61-hf-nan-hidden", _wl("nan-hidden"), "hidden_size = nan"),
    ("A62-hf-unicode-key", _wl("unicode-key"), "missing key 'hidden_size'"),
    ("A63-hf-dupkey", ["workload", "--model", "{d}/hf-dupkey.json"], "hidden_size = 0"),
    ("A65-hf-nested", ["workload", "--model", "{d}/hf-nested.json"], "nested more than"),
    ("A66-hf-tie-str", _wl("tie-str"), "tie_word_embeddings = 'false'; expected JSON true or false"),
    ("A66-hf-tie-int", _wl("tie-int"), "tie_word_embeddings = 0"),
    ("A67-hf-bias-str", _wl("bias-str"), "attention_bias = 'false'"),
    ("A68-hf-mtype-null", _wl("mtype-null"), "model_type = None; expected the architecture's name"),
    ("A69-hf-kv-gt-heads", _wl("kv-gt-heads"), "not a multiple"),
    ("A70-hf-maxpos1", _wl("maxpos1"), "context of 1"),
    ("A71-hf-act-list", _wl("act-list"), "hidden_act ['silu']"),
    ("A72-hf-llama4", _wl("llama4"), "model_type 'llama4_text'"),
    ("A74-hf-gemma", _wl("gemma"), "model_type 'gemma'"),
    ("A75-hf-heads-huge", _wl("heads-huge"), "GB"),
    ("A76-hf-inter-huge", _wl("inter-huge"), "GB"),
    ("A77-hf-sliding-str", _wl("sliding-str"), "sliding_window = '512'"),
    ("A77-hf-sliding-zero", _wl("sliding-zero"), "sliding_window = 0"),
    ("A77-hf-use-sliding-str", _wl("sliding-qwen2-str"), "use_sliding_window = 'true'"),
    ("A78-hf-fifo", ["workload", "--model", "{d}/fifo.json"], "a FIFO (named pipe), not a regular file"),
    ("A79-hf-symlink-loop", ["workload", "--model", "{d}/loop.json"], "a loop of symbolic links"),
    ("A81-hf-dir", ["workload", "--model", "{d}/dir.json"], "a folder without a config.json"),
    ("A82-hf-longname", ["workload", "--model", LONG_A], "too long for a file name (5000 characters)"),
    ("A83-hf-longname-compare", ["compare", "--model", "a" * 300], "too long for a file name (300 characters)"),
    ("A84-hf-model-traversal", ["workload", "--model", TRAVERSAL], "no such config file"),
    ("A85-hf-model-json-suffix", ["workload", "--model", "llama-3.2-1b.json"], "no such config file"),
    # implementation profiles
    ("A87-impl-gpu-nope", ["compare", "--gpu", "h200-datasheet+nope"], "unknown implementation profile 'nope'"),
    ("A88-impl-gpu-empty-profile", ["compare", "--gpu", "h200-datasheet+"], "unknown implementation profile ''"),
    ("A89-impl-gpu-empty-name", ["compare", "--gpu", "+torch"], "the GPU name is empty"),
    ("A90-impl-gpu-two-profiles", ["compare", "--gpu", "h200-datasheet+torch+torch"], "profile 'torch+torch'"),
    ("A91-impl-nope", ["compare", "--stack", "nope"], "unknown implementation profile 'nope'"),
    ("A92-impl-empty", ["compare", "--stack", ""], "unknown implementation profile ''"),
    ("A98-impl-hw-show-empty-profile", ["hw", "show", "h200-datasheet+"], "unknown implementation profile ''"),
    ("A99-impl-sweep-nope", ["sweep", "--batch", "1", "--impl", "nope"], "unknown implementation profile 'nope'"),
    ("A100-impl-search-nope", ["search", "--impl", "nope", "--storage", "memory", "--trials", "25"],
     "unknown implementation profile 'nope'"),
    # schedule files
    ("A103-sched-othermodel", _sim("othermodel"), "queues are for a different workload or tiling"),
    ("A104-sched-otherbatch", _sim("otherbatch"), "queues are for a different workload or tiling"),
    ("A105-sched-unknown-wlkey", _sim("unknown-wlkey"), "schedule workload has unknown key 'foo'; known: model"),
    ("A106-sched-traversal-model", _sim("traversal-model"), "unknown model"),
    ("A107-sched-a100", _sim("a100"), "132 queues for 108 SMs"),
    ("A108-sched-nsms0", _sim("nsms0"), "n_sms (SMs the workload is tiled for) must be a positive integer, got 0"),
    ("A109-sched-nsms-neg", _sim("nsms-neg"), "n_sms (SMs the workload is tiled for) must be a positive integer"),
    ("A111-sched-dup-same-sm", _sim("dup-same-sm"), "placed twice (SM 0 and SM 0)"),
    ("A112-sched-perop-missing", _sim("perop-missing"), "tiling.per_op names op 'L99.qkv_proj'"),
    ("A113-sched-perkind-unknown", _sim("perkind-unknown"), "tiling.per_kind names op kind 'foo'"),
    ("A114-sched-tiling-huge", _sim("tiling-huge"), "never placed"),
    ("A115-sched-kvsplits0", _sim("kvsplits0"), "kv_splits must be a positive integer, got 0"),
    ("A116-sched-kvsplits-str", _sim("kvsplits-str"), "kv_splits must be a positive integer, got 'abc'"),
    ("A117-sched-fuse-str", _sim("fuse-str"), "fuse_norm must be true or false"),
    ("A118-sched-dtype-bad", _sim("dtype-bad"), "weight dtype must be"),
    ("A119-sched-gpu-profile-bad", _sim("gpu-profile-bad"), "unknown implementation profile 'nope'"),
    ("A120-sched-policyopt-order-bad", _sim("policyopt-order-bad"), "order must be one of op, level, got 'random'"),
    ("A121-sched-policy-unknown", _sim("policy-unknown-with-queues"), "unknown policy 'nonexistent'"),
    ("A122-sched-queues-empty", _sim("queues-empty"), "never placed"),
    ("A123-sched-queues-null", _sim("queues-null"), "needs per-SM queues"),
    ("A124-sched-extra-toplevel", _sim("extra-toplevel"), "schedule has unknown key 'foo'; known: format"),
    ("A125-sched-record-str", _sim("record-str"), "record must be true or false"),
    ("A126-sched-nested", _sim("nested"), "nested more than"),
    ("A127-sched-flags-ignored", [*_sim("good"), "--model", "llama-3.1-8b", "--batch", "8", "--gpu", "b200"],
     "fixes the model, batch, GPU, mode and options; --model, --gpu, --batch would be ignored"),
    ("A127-sched-opt-ignored", [*_sim("good"), "--opt", "prefetch_depth=2"], "--opt would be ignored"),
    ("A127-validate-batch-ignored", ["validate", "--schedule", "{d}/s-good.json", "--batch", "8", "--dry-run"],
     "--batch would be ignored"),
    ("A128-sched-symlink-loop", ["simulate", "--schedule", "{d}/loop.json"], "a loop of symbolic links"),
    ("A128-sched-fifo", ["simulate", "--schedule", "{d}/fifo.json"], "a FIFO (named pipe)"),
    ("A129-validate-othermodel", ["validate", "--schedule", "{d}/s-othermodel.json", "--dry-run"],
     "queues are for a different workload"),
    # outputs
    ("A134-out-dev-full-trace", ["simulate", "--trace", "/dev/full"], "No space left on device"),
    ("A135-out-dev-full-save", ["simulate", "--save", "/dev/full"], "No space left on device"),
    ("A137-out-trace-loop", ["simulate", "--trace", "{d}/loop.json"], "Too many levels of symbolic links"),
    # calibration and validation files
    ("A156-cal-from-raw-empty", ["calibrate", "--from-raw", "{d}/raw-empty.json", "--out", "{d}/o.toml"],
     "no meta.device"),
    ("A157-cal-from-raw-list", ["calibrate", "--from-raw", "{d}/raw-list.json", "--out", "{d}/o.toml"],
     "no meta.device"),
    ("A158-cal-from-raw-nested", ["calibrate", "--from-raw", "{d}/raw-nested.json", "--out", "{d}/o.toml"],
     "nested more than"),
    ("A159-val-report-empty", ["validate", "report", "{d}/vr"], "not a validation measured.json"),
    ("A160-val-report-nested", ["validate", "report", "{d}/measured-nested.json"], "nested more than"),
    ("A164-hw-show-symlink-loop", ["hw", "show", "{d}/loop.toml"], "a loop of symbolic links"),
    ("A165-hw-show-fifo", ["hw", "show", "{d}/fifo.toml"], "a FIFO (named pipe), not a regular file"),
    ("A166-gpu-long", ["compare", "--gpu", LONG_G], "too long for a file name (5000 characters)"),
    ("A167-schedule-long-path", ["simulate", "--schedule", LONG_S], "too long for a file name (5000 characters)"),
    ("A172-cal-from-raw-trace", ["calibrate", "--from-raw", str(TRACE), "--out", "{d}/o.toml"],
     "cannot read raw calibration results"),
]


@pytest.mark.parametrize("argv,fragment", [pytest.param(a, f, id=i) for i, a, f in REFUSED])
def test_refused_in_one_line(argv: list[str], fragment: str, bad: Path, capsys: pytest.CaptureFixture[str],
                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a default search storage must not land in the checkout
    code, _, err = run_cli([a.replace("{d}", str(bad)) for a in argv], capsys)
    assert_one_line(code, err, fragment)


#: (id, argv): rows the note found fine, and valid inputs it found refused, that must work (exit 0)
WORKS: list[Any] = [
    ("A57-hf-headdim-nondiv", _wl("headdim-nondiv")),
    ("A64-hf-bom", ["workload", "--model", "{d}/hf-bom.json"]),
    ("A73-hf-textcfg-llama", _wl("textcfg-llama")),
    ("A50-hf-one-expert-is-dense", _wl("experts-one")),
    ("A49-hf-mixtral", _wl("mixtral")),  # mixtures of experts are simulated (tests/mksim/test_moe.py)
    ("A51-hf-qwen3moe", _wl("qwen3moe")),
    ("A86-hf-model-uppercase", ["workload", "--model", "LLAMA-3.2-1B"]),
    ("A93-impl-uppercase", ["compare", "--stack", "TORCH"]),
    ("A94-impl-gpu-and-impl", ["compare", "--gpu", "h200-datasheet+torch", "--stack", "torch"]),
    ("A95-impl-simulate-toml", ["simulate", "--gpu", str(H200_TOML), "--impl", "torch"]),
    ("A95-impl-simulate-toml-plus", ["simulate", "--gpu", f"{H200_TOML}+torch"]),
    ("A96-impl-compare-toml", ["compare", "--gpu", str(H200_TOML), "--stack", "torch"]),
    ("A97-impl-hw-show-profile", ["hw", "show", "h200-datasheet+torch"]),
    ("A101-impl-profile-on-a100", ["compare", "--gpu", "a100", "--stack", "mksim-fd0"]),
    ("A102-impl-mi300x-torch", ["compare", "--gpu", "mi300x", "--stack", "torch"]),
    ("A110-sched-graph-mode", _sim("graph-mode")),
    ("A127-sched-alone", [*_sim("good"), "--json"]),
    pytest.param(["compare", "--designs", "all", "--stack", "torch"], id="A163-compare-designs-all-impl",
                 marks=pytest.mark.slow),
    ("A191-env-hw-list", ["hw", "list"]),
]


@pytest.mark.parametrize("argv", [pytest.param(w[1], id=w[0]) if type(w) is tuple else w for w in WORKS])
def test_works(argv: list[str], bad: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli([a.replace("{d}", str(bad)) for a in argv], capsys)
    assert code == 0 and "Traceback" not in err, err[-2000:]


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    code, out, err = run_cli([*argv, "--json"], capsys)
    assert code == 0, err[-2000:]
    return json.loads(out)


# -- HF configs read as Hugging Face reads them ------------------------------------------------------------
@row("A66-hf-tie-false-is-false")
def test_A66_tie_and_bias_read_strictly(row: str, bad: Path) -> None:
    """JSON false is false; the built-ins keep their parameter counts."""
    untied = models.config_from_hf(_hf(tie_word_embeddings=False)).param_count()
    assert untied > models.get("llama-3.2-1b").param_count()
    assert models.get("llama-3.1-8b").param_count() == 8_030_261_248


@row("A77-hf-sliding-window-kv")
def test_A77_sliding_window_caps_the_kv_read(row: str, bad: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mistral's window of 512: KV 8192 reads what KV 512 reads (every layer); without a window, or with
    Qwen2's switched off, 16 times more; Qwen2's window from layer 8 of 16 on: half the layers capped;
    Llama reads no window, as transformers does."""
    def kv(name: str, kv_len: int) -> float:
        return _json(["workload", "--model", str(bad / f"hf-{name}.json"), "--kv-len", str(kv_len)],
                     capsys)["kv_cache_bytes"]

    win_512, win_8192 = kv("sliding-mistral", 512), kv("sliding-mistral", 8192)
    full_8192 = kv("sliding-mistral-null", 8192)
    assert win_8192 == win_512 and full_8192 > 15 * win_8192
    assert kv("sliding-qwen2-off", 8192) == kv("sliding-llama", 8192) == full_8192
    assert kv("sliding-qwen2", 8192) == pytest.approx((full_8192 + win_8192) / 2, rel=0.01)


@row("A77-hf-sliding-window-flops")
def test_A77_window_in_attention_flops_and_prefill(row: str, ) -> None:
    """A windowed prefill attends to at most ``window`` keys per token; a window wider than the context
    changes nothing, to the last digit."""
    cfg = models.config_from_hf(_hf(model_type="mistral", sliding_window=512))
    ref = models.config_from_hf(_hf(model_type="mistral"))
    wide = models.config_from_hf(_hf(model_type="mistral", sliding_window=10**6))
    for kw in ({"kv_len": 4096}, {"kv_len": 100, "phase": "prefill", "prefill_tokens": 1000}):
        a, b, c = (models.workload(x, **kw) for x in (cfg, ref, wide))
        assert a.flops < b.flops and a.kv_bytes <= b.kv_bytes  # 100 cached tokens: all within the window
        assert (c.flops, c.kv_bytes) == (b.flops, b.kv_bytes)
    assert models.workload(cfg, kv_len=4096).kv_bytes < models.workload(ref, kv_len=4096).kv_bytes
    part = next(op for op in models.workload(cfg, kv_len=100, phase="prefill", prefill_tokens=1000).ops
                if op.kind == "attn_partial")
    keys = sum(min(j, 512) for j in range(101, 1101))  # token at position j sees min(j, window) keys
    assert part.flops == 4.0 * cfg.num_heads * cfg.head_dim * keys


@row("A77-hf-sliding-window-schedule")
def test_A77_windowed_schedule_round_trips(row: str, ) -> None:
    from mksim.schedule import Schedule

    cfg = models.config_from_hf(_hf(model_type="qwen2", use_sliding_window=True, sliding_window=512,
                                    max_window_layers=8))
    wl = models.workload(cfg, kv_len=4096)
    back = Schedule.from_json(build_schedule(wl, "h200-datasheet", "megakernel").to_json())
    assert back.workload.model == cfg and back.workload.kv_bytes == wl.kv_bytes


@row("A80-hf-procsubst")
def test_A80_process_substitution_is_read(row: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--model <(cat config.json)`` is /dev/fd/N, a pipe with a writer: read, as the file would be."""
    r, w = os.pipe()
    try:
        os.write(w, json.dumps(HF).encode())
        os.close(w)
        got = _json(["workload", "--model", f"/dev/fd/{r}"], capsys)
    finally:
        os.close(r)
    ref = _json(["workload", "--model", "llama-3.2-1b"], capsys)
    assert {k: v for k, v in got.items() if k != "name"} == {k: v for k, v in ref.items() if k != "name"}


@row("A78-hf-fifo-child")
def test_A78_fifo_never_opened_in_a_child(row: str, bad: Path) -> None:
    """The same FIFO in a fresh process (no alarm to save it): refused at once, nothing blocks."""
    r = subprocess.run([sys.executable, "-m", "mksim", "workload", "--model", str(bad / "fifo.json")],
                       capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert_one_line(r.returncode, r.stderr, "FIFO")


@row("A84-hf-get-traversal")
def test_A84_builtin_names_are_never_paths(row: str, bad: Path) -> None:
    with pytest.raises(UnknownNameError):
        models.get("../" * 12 + str(bad / "evil")[1:])
    with pytest.raises(UnknownNameError):
        models.get(str(bad / "evil"))


@row("A50-from-torch-experts")
@pytest.mark.slow  # importing torch
def test_A50_from_torch_refuses_experts(row: str, ) -> None:
    torch = pytest.importorskip("torch")

    class MoE(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(4)])

        def forward(self, x: Any) -> Any:
            return self.experts[0](x)

    with pytest.raises(MksimError, match="mixture-of-experts model .4 experts in experts."):
        models.from_torch(MoE(), torch.zeros(1, 8))
    dense = torch.nn.Sequential(torch.nn.Linear(8, 8))
    dense.config = {"num_local_experts": 8}  # type: ignore[assignment]
    with pytest.raises(MksimError, match="8 experts, config.num_local_experts"):
        models.from_torch(dense, torch.zeros(1, 8))


# -- outputs that are inputs, and writes that fail ------------------------------------------------------------
@row("A130-trace-is-schedule")
def test_A130_trace_is_the_schedule(row: str, bad: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "s-victim.json"
    victim.write_bytes((bad / "s-good.json").read_bytes())
    before = victim.read_bytes()
    code, _, err = run_cli(["simulate", "--schedule", str(victim), "--trace", str(victim)], capsys)
    assert_one_line(code, err, "is the schedule this command reads")
    assert victim.read_bytes() == before


@row("A131-save-is-trace")
def test_A131_save_is_the_trace(row: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = tmp_path / "same.json"
    code, _, err = run_cli(["simulate", "--save", str(same), "--trace", str(same)], capsys)
    assert_one_line(code, err, "--save and --trace both name")
    assert not same.exists()
    same.write_text("kept")
    code, _, err = run_cli(["simulate", "--save", str(same), "--trace", f"{tmp_path}/./same.json"], capsys)
    assert_one_line(code, err, "both name")
    assert same.read_text() == "kept"


@row("A136-sweep-html-dev-full")
@pytest.mark.slow  # 1.2 s of CPU
def test_A136_sweep_html_dev_full_prints_the_table_first(row: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["sweep", "--batch", "1", "--html", "/dev/full"], capsys)
    assert_one_line(code, err, "--html /dev/full: cannot write (No space left on device)")
    assert "megakernel" in out  # the finished table is not lost


@row("A136-sweep-html-is-config")
def test_A136_sweep_html_is_the_model_config(row: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(HF))
    code, _, err = run_cli(["sweep", "--batch", "1", "--model", str(cfg), "--html", str(cfg)], capsys)
    assert_one_line(code, err, "is the model config this command reads")
    assert json.loads(cfg.read_text()) == HF


class _FakeComparison:
    def __init__(self, step: Any, target: Any) -> None:
        self.batch = step.batch

    def to_dict(self) -> dict[str, Any]:
        from mksim.schedule import MODES

        return {"modes": {m: {"latency_us": 100.0 + self.batch} for m in MODES}}


@pytest.mark.parametrize("batches,rows", [pytest.param(",".join(map(str, range(1, 41))), 40, id="A161-sweep-40"),
                                          pytest.param("1,1,1", 3, id="A162-sweep-dup")])
def test_sweep_takes_many_and_repeated_batches(batches: str, rows: int, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's side of the rows (the simulations stubbed: 40 batches take 23 s for real)."""
    import mksim.report

    monkeypatch.setattr(mksim.report, "compare", _FakeComparison)
    assert len(_json(["sweep", "--batch", batches], capsys)["rows"]) == rows


# -- folders that cannot be written (a read-only file system: even root cannot write there) ------------------
def _read_only(monkeypatch: pytest.MonkeyPatch, ro: Path) -> None:
    """``ro`` behaves as a read-only mount: access(W_OK) fails, and so do mkdir and writes under it."""
    real_access = os.access

    def access(path: Any, mode: int, *a: Any, **kw: Any) -> bool:
        if mode & os.W_OK and str(Path(path).resolve()).startswith(str(ro)):
            return False
        return real_access(path, mode, *a, **kw)

    def guard(path: Any) -> None:
        if str(Path(path).resolve()).startswith(str(ro)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))

    real_mkdir, real_write = Path.mkdir, Path.write_text
    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **kw: (guard(self), real_mkdir(self, *a, **kw))[1])
    monkeypatch.setattr(Path, "write_text", lambda self, *a, **kw: (guard(self), real_write(self, *a, **kw))[1])


@pytest.mark.parametrize("argv,fragment", [
    pytest.param(["sweep", "--batch", "1", "--html", "{ro}/s.html"], "permission denied", id="A177-ro-sweep-html"),
    pytest.param(["simulate", "--trace", "{ro}/t.json"], "permission denied", id="A178-ro-simulate-trace"),
    pytest.param(["search", "--storage", "memory", "--out", "{ro}/b.json"], "permission denied",
                 id="A179-ro-search-out"),
    pytest.param(["search", "--storage", "memory", "--report", "{ro}/r.html"], "permission denied",
                 id="A180-ro-search-report"),
    pytest.param(["calibrate", "--from-raw", str(RAW), "--out", "{ro}/h.toml"], "Read-only file system",
                 id="A182-ro-calibrate-out"),
    pytest.param(["calibrate", "--from-raw", str(RAW), "--out", "{ro}/sub/h.toml"], "Read-only file system",
                 id="A182-ro-calibrate-out-subfolder"),
])
def test_read_only_folder(argv: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    ro = (tmp_path / "ro").resolve()
    ro.mkdir()
    _read_only(monkeypatch, ro)
    code, _, err = run_cli([a.replace("{ro}", str(ro)) for a in argv], capsys)
    assert_one_line(code, err, fragment)
    assert list(ro.iterdir()) == []


@row("A182-cal-out-is-raw")
def test_A182_calibrate_out_is_its_raw_input(row: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "run.raw.json"
    raw.write_bytes(RAW.read_bytes())
    code, _, err = run_cli(["calibrate", "--from-raw", str(raw), "--out", str(raw)], capsys)
    assert_one_line(code, err, "is the raw results file this command reads")
    assert raw.read_bytes() == RAW.read_bytes()


# -- the environment --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [pytest.param("abc", id="A188-env-worker-warps-abc"),
                                   pytest.param("0", id="A189-env-worker-warps-0"),
                                   pytest.param("29", id="A189-env-worker-warps-29")])
def test_worker_warps_checked(value: str) -> None:
    from validation.megakernel.program import worker_warps

    with pytest.raises(MksimError, match="MKSIM_WORKER_WARPS"):
        worker_warps(value)
    assert worker_warps(None) == 8 and worker_warps("4") == 4


@row("A188-env-worker-warps-import")
def test_A188_worker_warps_at_import_is_one_line(row: str, ) -> None:
    """The variable is read when validation's kernel module is imported: one line, not a traceback."""
    r = subprocess.run([sys.executable, "-m", "mksim", "validate", "--model", "llama-3.2-1b", "--mode",
                        "megakernel", "--dry-run"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "MKSIM_WORKER_WARPS": "abc"})
    assert_one_line(r.returncode, r.stderr, "MKSIM_WORKER_WARPS='abc'")


@row("A190-env-columns-5")
def test_A190_narrow_columns(row: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "5")  # the note's row pipes compare into head; a table is a table
    code, out, err = run_cli(["hw", "show", "h200-datasheet"], capsys)
    assert code == 0 and "bandwidth" in out, err


@row("A191-env-no-color")
def test_A191_no_color(row: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("TERM", "dumb")
    code, out, _ = run_cli(["hw", "list"], capsys)
    assert code == 0 and "h200-datasheet" in out


@row("A138-search-out-dev-full")
@pytest.mark.slow
def test_A138_search_out_dev_full(row: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's result is printed, then one line for the file it could not write (the search machinery's
    point: a tiny model on a 16-SM H200, tests/mksim/searchkit.py)."""
    from tests.mksim.searchkit import TINY_MODEL, small_gpu

    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["search", "--model", str(TINY_MODEL), "--gpu", str(small_gpu(tmp_path)), "--kv-len",
                              "64", "--trials", "26", "--storage", "memory", "--out", "/dev/full"], capsys)
    assert_one_line(code, err, "/dev/full")
    assert "best" in out.lower()


@row("A136-sweep-html-is-hardware-file")
def test_A136_sweep_html_is_the_hardware_file(row: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU+PROFILE path is the file before the '+'; a built-in name (``--html h200``) is no input file."""
    hw = tmp_path / "gpu.toml"
    hw.write_bytes(H200_TOML.read_bytes())
    code, _, err = run_cli(["sweep", "--batch", "1", "--gpu", f"{hw}+torch", "--html", str(hw)], capsys)
    assert_one_line(code, err, "is the hardware file this command reads")
    assert hw.read_bytes() == H200_TOML.read_bytes()
    monkeypatch.chdir(tmp_path)
    import mksim.report

    monkeypatch.setattr(mksim.report, "compare", _FakeComparison)
    code, _, err = run_cli(["sweep", "--batch", "1", "--html", "h200"], capsys)
    assert code == 0 and (tmp_path / "h200").stat().st_size > 0, err


def test_A183_validate_dry_run_out_warns(bad: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``validate --dry-run --out DIR`` previews the run that --out would take: it predicts, says in one
    warning line that DIR gets nothing, and leaves DIR as it was (here: absent)."""
    code, out, err = run_cli(["validate", "--model", "llama-3.2-1b", "--mode", "megakernel", "--dry-run", "--out",
                              str(bad / "vout")], capsys)
    assert code == 0 and out
    warning = f"warning: --dry-run measures nothing and writes nothing: {bad / 'vout'} stays as it is"
    assert err.splitlines() == [warning]
    assert not (bad / "vout").exists()

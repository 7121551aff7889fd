"""Decoder-only LLM architectures, read from Hugging Face ``config.json`` files.

Every field read is checked by type (a boolean must be JSON ``true``/``false``, a count a positive
integer), and a config this reader would take for something it is not is refused in one line: a
mixture-of-experts config (Mixtral, Qwen3-MoE, DeepSeek) or DeepSeek's latent attention relabelled
as a dense model type.

>>> config_from_hf({**_read_builtin("llama-3.2-1b"), "tie_word_embeddings": "false"})
Traceback (most recent call last):
...
mksim.errors.WorkloadError: config: tie_word_embeddings = 'false'; expected JSON true or false
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hwmodels.files import is_pipe_name, names_a_file, parse_json, read_bytes
from mksim.errors import UnknownNameError, WorkloadError
from mksim.workload import BLOCKS, ROLES, blocks_of

_CONFIGS = Path(__file__).resolve().parent / "configs"

# model_type values whose decoder layer is the Llama block (RMSNorm, GQA, RoPE, SwiGLU);
# qwen3 adds a per-head RMSNorm on q and k.
_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3"}
#: model types whose config may hold a sliding attention window (Hugging Face reads none for llama)
_WINDOWED = {"mistral", "qwen2", "qwen3"}
#: keys that count a mixture-of-experts model's experts (Mixtral, Qwen-MoE, DeepSeek)
MOE_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
#: a config file is a few KiB; anything past this is not one
CONFIG_LIMIT_B = 16 << 20
#: how long a pipe (``<(cat config.json)``) may take to deliver its bytes


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only transformer: what the workload builder needs.

    Example::

        >>> from mksim import models
        >>> cfg = models.get("llama-3.2-1b")
        >>> cfg.num_layers, cfg.hidden_size
        (16, 2048)
    """
    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    model_type: str = "llama"
    #: tokens a layer with sliding-window attention attends to (None: every layer sees the whole context)
    sliding_window: int | None = None
    #: the first this many layers attend to the whole context even with a window (Qwen2's max_window_layers)
    full_attention_layers: int = 0
    #: the blocks the model is composed of (``mksim.workload.BLOCKS``, one per role): embedding + num_layers x
    #: (attention + ffn) + head
    embedding_block: str = "embed"
    attention_block: str = "gqa"
    ffn_block: str = "gated_mlp"
    head_block: str = "lm_head"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def param_count(self) -> int:
        """Parameters, counted as the model's state dict does (tied embeddings once): what its blocks
        hold (``BaseBlock.params``)."""
        blocks = blocks_of(self)
        per_layer = sum(blocks[r].params(self, layer) for layer in range(self.num_layers) for r in ("attention", "ffn"))
        return blocks["embedding"].params(self, None) + per_layer + blocks["head"].params(self, None)

    def window(self, layer: int) -> int | None:
        """The attention window of ``layer`` in tokens, or None where it attends to the whole context."""
        if self.sliding_window is None or layer < self.full_attention_layers:
            return None
        return self.sliding_window

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def builtin_names() -> list[str]:
    """Names of the built-in models, sorted."""
    return sorted(p.stem for p in _CONFIGS.glob("*.json"))


def get(name: str) -> ModelConfig:
    """A built-in model by name (any case); an unknown name lists the known ones. Only the names of
    :func:`builtin_names` are read: a name is never a path (``../x`` does not load ``x.json``)."""
    known = builtin_names()
    if not isinstance(name, str) or name.lower() not in known:
        shown = name if not isinstance(name, str) or len(name) <= 120 else f"{name[:60]}…({len(name)} characters)"
        raise UnknownNameError("model", shown, known)
    return config_from_hf(_CONFIGS / f"{name.lower()}.json", name=name.lower())


def _read_builtin(name: str) -> dict[str, Any]:
    return dict(parse_json((_CONFIGS / f"{name}.json").read_bytes(), name))


def is_config_path(name: str) -> bool:
    """Whether ``--model name`` names a file (a Hugging Face config) rather than a built-in model: not a
    built-in's name, and it ends in ``.json``, holds a ``/``, or names something that exists (a folder, a
    FIFO, a link loop, a name too long for a file: the reader then says which in one line)."""
    if name.lower() in builtin_names():
        return False
    return names_a_file(name, ".json")


def moe_experts(raw: Mapping[str, Any]) -> tuple[int, str] | None:
    """``(experts, key)`` when a Hugging Face config describes a mixture-of-experts model (more than one
    expert, or more than one expert per token), else None."""
    for key in MOE_COUNT_KEYS:
        v = raw.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            return v, key
    v = raw.get("num_experts_per_tok")
    if isinstance(v, int) and not isinstance(v, bool) and v > 1:
        return v, "num_experts_per_tok"
    return None


def config_from_hf(path_or_dict: str | Path | Mapping[str, Any], *, name: str | None = None) -> ModelConfig:
    """Read a Hugging Face ``config.json`` (a path or an already parsed dict); no network, no weights."""
    if isinstance(path_or_dict, Mapping):
        raw, where = dict(path_or_dict), "config"
    else:
        path = Path(path_or_dict)
        where = str(path) if len(str(path)) <= 120 else f"{str(path)[:60]}…({len(str(path))} characters)"
        if not is_pipe_name(path) and os.path.isdir(path):  # a Hugging Face model folder holds its config.json
            if not (path / "config.json").is_file():
                raise WorkloadError(f"{where}: a folder without a config.json; give the path of a Hugging Face "
                                    "config.json")
            path = path / "config.json"
        data = read_bytes(path, "", limit=CONFIG_LIMIT_B, error=WorkloadError,
                          missing="no such config file; give the path of a Hugging Face config.json")
        raw = parse_json(data, f"{where}: not a readable JSON config", error=WorkloadError)
        if not isinstance(raw, dict):
            raise WorkloadError(f"{where}: a config.json must hold a JSON object")
        name = name or (path.parent.name if path.name == "config.json" else path.stem)
        if is_pipe_name(path_or_dict) and name.isdigit():  # <(cat config.json): no name to take
            name = None
    # Multimodal/composite configs nest the language model's config.
    if "text_config" in raw and "hidden_size" not in raw:
        if not isinstance(raw["text_config"], Mapping):
            raise WorkloadError(f"{where}: text_config = {raw['text_config']!r}; expected an object (the language "
                                "model's config)")
        raw = dict(raw["text_config"])
    supported = ", ".join(sorted(_LLAMA_LIKE))
    if "model_type" in raw and not isinstance(raw["model_type"], str):
        raise WorkloadError(f"{where}: model_type = {_short(raw['model_type'])}; expected the architecture's name as "
                            f"a string, one of {supported}")
    model_type = raw.get("model_type", "llama")
    if model_type not in _LLAMA_LIKE:
        raise WorkloadError(f"{where}: model_type {model_type!r} is not supported by the config "
                            f"importer (supported: {supported}); use "
                            "mksim.models.from_torch for other architectures")
    moe = moe_experts(raw)
    if moe is not None:
        raise WorkloadError(f"{where}: this is a mixture-of-experts config ({moe[0]} "
                            f"{'experts per token' if moe[1] == 'num_experts_per_tok' else 'experts'}, {moe[1]}); "
                            "mksim does not simulate MoE yet")
    for key in ("kv_lora_rank", "q_lora_rank"):
        if raw.get(key) is not None:
            raise WorkloadError(f"{where}: {key} = {_short(raw[key])}: this config uses DeepSeek's multi-head latent "
                                f"attention, not the {model_type} block; mksim does not simulate it yet")

    def flag(key: str, default: bool) -> bool:
        v = raw.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise WorkloadError(f"{where}: {key} = {_short(v)}; expected JSON true or false")
        return v

    def positive(k: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise WorkloadError(f"{where}: {k} = {v!r}; expected a positive integer")
        return v

    def need(key: str, *alts: str) -> int:
        for k in (key, *alts):
            if raw.get(k) is not None:
                return positive(k, raw[k])
        raise WorkloadError(f"{where}: missing key {key!r} in the config")

    def maybe(key: str, default: int) -> int:
        return default if raw.get(key) is None else positive(key, raw[key])

    def number(key: str, default: float) -> float:
        v = default if raw.get(key) is None else raw[key]
        try:  # an integer too large for a float (rope_theta: 1e400 written out) overflows
            ok = not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < float(v) < math.inf
        except OverflowError:
            ok = False
        if not ok:
            raise WorkloadError(f"{where}: {key} = {v!r}; expected a positive number")
        return float(v)

    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head")
    kv_heads = maybe("num_key_value_heads", heads)
    if raw.get("head_dim") is None and hidden % heads:
        raise WorkloadError(f"{where}: hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}); "
                            "give head_dim, or a head count that divides hidden_size")
    head_dim = maybe("head_dim", hidden // heads)
    if heads % kv_heads:
        raise WorkloadError(f"{where}: num_attention_heads ({heads}) is not a multiple of "
                            f"num_key_value_heads ({kv_heads})")
    act = raw.get("hidden_act", "silu")
    if not isinstance(act, str) or act not in ("silu", "swish"):
        raise WorkloadError(f"{where}: hidden_act {_short(act)} is not supported (SwiGLU models only)")
    layers = need("num_hidden_layers", "n_layer")
    window, full_layers = _window(raw, model_type, layers, flag, where)
    named = raw.get("_name_or_path")
    return ModelConfig(
        name=name or (named if isinstance(named, str) and named else model_type),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size", "n_inner"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=need("vocab_size"),
        tie_word_embeddings=flag("tie_word_embeddings", False),
        qk_norm=model_type == "qwen3",
        attention_bias=flag("attention_bias", model_type == "qwen2"),
        rms_norm_eps=number("rms_norm_eps", 1e-5),
        rope_theta=number("rope_theta", 10000.0),
        max_position_embeddings=maybe("max_position_embeddings", 4096),
        model_type=model_type,
        sliding_window=window,
        full_attention_layers=full_layers,
        **_blocks(raw, where),
    )


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:60] + f"…({len(text)} characters)"


def _blocks(raw: Mapping[str, Any], where: str) -> dict[str, str]:
    """The ``<role>_block`` fields a config names in ``mksim_blocks`` (``{"ffn": "gated_mlp"}``: what a
    schedule file writes for a model whose blocks are not the defaults), each a registered block of its role."""
    given = raw.get("mksim_blocks")
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise WorkloadError(f"{where}: mksim_blocks = {_short(given)}; expected an object of role: block name")
    out = {}
    for role, name in given.items():
        if role not in ROLES:
            raise WorkloadError(f"{where}: mksim_blocks names the role {_short(role)}; give some of {', '.join(ROLES)}")
        known = [n for n in BLOCKS if BLOCKS[n].role == role]
        if name not in known:
            raise WorkloadError(f"{where}: mksim_blocks: {_short(name)} is not a {role} block; known: "
                                f"{', '.join(known)}")
        out[f"{role}_block"] = name
    return out


def _window(raw: Mapping[str, Any], model_type: str, layers: int, flag: Any, where: str) -> tuple[int | None, int]:
    """``(sliding_window, full_attention_layers)`` as Hugging Face reads them: Mistral's ``sliding_window``
    (null: none) applies to every layer; Qwen2 and Qwen3 use theirs only with ``use_sliding_window``, from
    layer ``max_window_layers`` on (default 28, as in transformers). Llama has no window."""
    if model_type not in _WINDOWED:
        return None, 0
    w = raw.get("sliding_window")
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w <= 0):
        raise WorkloadError(f"{where}: sliding_window = {_short(w)}; expected a positive integer (tokens) or null")
    if model_type == "mistral":
        return w, 0
    use = flag("use_sliding_window", False)
    full = raw.get("max_window_layers")
    if full is not None and (isinstance(full, bool) or not isinstance(full, int) or full < 0):
        raise WorkloadError(f"{where}: max_window_layers = {_short(full)}; expected an integer >= 0 (the layers "
                            "that attend to the whole context)")
    if not use or w is None:
        return None, 0
    full = 28 if full is None else full
    return (w, full) if full < layers else (None, 0)

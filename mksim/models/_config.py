"""Decoder-only LLM architectures, read from Hugging Face ``config.json`` files."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mksim.errors import UnknownNameError, WorkloadError

_CONFIGS = Path(__file__).resolve().parent / "configs"

# model_type values whose decoder layer is the Llama block (RMSNorm, GQA, RoPE, SwiGLU);
# qwen3 adds a per-head RMSNorm on q and k.
_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3"}


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

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def param_count(self) -> int:
        """Parameters, counted as the model's state dict does (tied embeddings once)."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        mlp = 3 * h * i
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + self.num_layers * (attn + mlp + norms) + h + head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def builtin_names() -> list[str]:
    """Names of the built-in models, sorted."""
    return sorted(p.stem for p in _CONFIGS.glob("*.json"))


def get(name: str) -> ModelConfig:
    """A built-in model by name; an unknown name lists the known ones."""
    path = _CONFIGS / f"{name.lower()}.json"
    if not path.is_file():
        raise UnknownNameError("model", name, builtin_names())
    return config_from_hf(path, name=name.lower())


def config_from_hf(path_or_dict: str | Path | Mapping[str, Any], *, name: str | None = None) -> ModelConfig:
    """Read a Hugging Face ``config.json`` (a path or an already parsed dict); no network, no weights."""
    if isinstance(path_or_dict, Mapping):
        raw, where = dict(path_or_dict), "config"
    else:
        path = Path(path_or_dict)
        where = str(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise WorkloadError(f"{where}: no such config file; give the path of a Hugging Face "
                                "config.json") from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"{where}: not a readable JSON config ({exc})") from None
        if not isinstance(raw, dict):
            raise WorkloadError(f"{where}: a config.json must hold a JSON object")
        name = name or (path.parent.name if path.name == "config.json" else path.stem)
    # Multimodal/composite configs nest the language model's config.
    if "text_config" in raw and "hidden_size" not in raw:
        if not isinstance(raw["text_config"], Mapping):
            raise WorkloadError(f"{where}: text_config = {raw['text_config']!r}; expected an object (the language "
                                "model's config)")
        raw = dict(raw["text_config"])
    model_type = str(raw.get("model_type", "llama"))
    if model_type not in _LLAMA_LIKE:
        raise WorkloadError(f"{where}: model_type {model_type!r} is not supported by the config "
                            f"importer (supported: {', '.join(sorted(_LLAMA_LIKE))}); use "
                            "mksim.models.from_torch for other architectures")

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
    if act not in ("silu", "swish"):
        raise WorkloadError(f"{where}: hidden_act {act!r} is not supported (SwiGLU models only)")
    return ModelConfig(
        name=name or str(raw.get("_name_or_path") or model_type),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size", "n_inner"),
        num_layers=need("num_hidden_layers", "n_layer"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=need("vocab_size"),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qk_norm=model_type == "qwen3",
        attention_bias=bool(raw.get("attention_bias", model_type == "qwen2")),
        rms_norm_eps=number("rms_norm_eps", 1e-5),
        rope_theta=number("rope_theta", 10000.0),
        max_position_embeddings=maybe("max_position_embeddings", 4096),
        model_type=model_type,
    )

"""Decoder-only LLM architectures, read from Hugging Face ``config.json`` files.

Every field read is checked by type (a boolean must be JSON ``true``/``false``, a count a positive
integer), and a config this reader would take for something it is not is refused in one line: a
mixture-of-experts config or DeepSeek's latent attention relabelled as a dense model type.
Mixture-of-experts models (:data:`MOE_TYPES`: Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE) are read with their
experts, router and dense layers (``ffn_block = "moe"``); DeepSeek-V2/V3 configs are read, and refused
for their multi-head latent attention, which mksim does not build yet.

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
#: mixture-of-experts model types: the Llama block with an MoE FFN (olmoe: q/k norms over the whole
#: q and k; qwen3_moe: per head; qwen2_moe: q/k/v biases and a gated shared expert; deepseek: shared
#: experts, and latent attention, which is refused)
MOE_TYPES = ("mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
#: model types whose config may hold a sliding attention window (Hugging Face reads none for llama)
_WINDOWED = {"mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"}
#: router scoring functions: softmax over the experts' logits, or a sigmoid of each (DeepSeek-V3)
SCORINGS = ("softmax", "sigmoid")
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
    #: q/k RMS norms (``qk_norm``) over each head (``"head"``: Qwen3) or the whole q and k (``"all"``: OLMoE)
    qk_norm_scope: str = "head"
    #: mixture of experts (0: a dense model): routed experts per MoE layer, and how many each token picks
    num_experts: int = 0
    experts_per_token: int = 0
    #: an expert's intermediate width (its gate/up/down, SwiGLU); ``intermediate_size`` is the dense layers'
    expert_intermediate_size: int = 0
    #: the shared expert(s) every token goes through, as one gated MLP this wide (0: none)
    shared_expert_intermediate_size: int = 0
    #: a sigmoid gate (a ``hidden_size`` -> 1 projection) scales the shared expert's output (Qwen2-MoE)
    shared_expert_gate: bool = False
    #: the router's scores: ``"softmax"`` over the experts' logits or ``"sigmoid"`` of each (:data:`SCORINGS`)
    router_scoring: str = "softmax"
    #: the top-k weights are renormalised to sum to 1 (Hugging Face's ``norm_topk_prob``)
    norm_topk_prob: bool = False
    #: layers of an MoE model whose FFN is the dense gated MLP (``mlp_only_layers``, ``first_k_dense_replace``...)
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:  # a config made in Python is checked as an imported one is
        if self.num_experts:
            check_moe(self.name, self.num_experts, self.experts_per_token, self.expert_intermediate_size,
                      self.router_scoring)
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    def moe_layer(self, layer: int) -> bool:
        """Whether ``layer``'s FFN is the mixture of experts (not a dense layer of an MoE model)."""
        return self.num_experts > 0 and layer not in self.dense_layers

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The layers whose FFN is the mixture of experts, in order."""
        return tuple(layer for layer in range(self.num_layers) if self.moe_layer(layer))

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


def check_moe(name: str, experts: Any, top_k: Any, width: Any, scoring: Any) -> None:
    """Refuse, in one line, an impossible mixture of experts: no experts, a top-k outside 1..experts,
    experts without a width, an unknown router scoring."""
    for key, v in (("num_experts", experts), ("experts_per_token", top_k), ("expert_intermediate_size", width)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise WorkloadError(f"{name}: {key} = {_short(v)}; a mixture of experts needs a positive integer")
    if top_k > experts:
        raise WorkloadError(f"{name}: each token picks {top_k} experts (top-k) but there are {experts}; top-k must "
                            "be at most the number of experts")
    if scoring not in SCORINGS:
        raise WorkloadError(f"{name}: router scoring {_short(scoring)}; known: {', '.join(SCORINGS)}")


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
    supported = ", ".join([*sorted(_LLAMA_LIKE), *MOE_TYPES[:4]])
    if "model_type" in raw and not isinstance(raw["model_type"], str):
        raise WorkloadError(f"{where}: model_type = {_short(raw['model_type'])}; expected the architecture's name as "
                            f"a string, one of {supported}")
    model_type = raw.get("model_type", "llama")
    if model_type not in _LLAMA_LIKE and model_type not in MOE_TYPES:
        raise WorkloadError(f"{where}: model_type {model_type!r} is not supported by the config "
                            f"importer (supported: {supported}); use "
                            "mksim.models.from_torch for other architectures")
    moe = moe_experts(raw)
    if moe is not None and model_type not in MOE_TYPES:
        raise WorkloadError(f"{where}: this is a mixture-of-experts config ({moe[0]} "
                            f"{'experts per token' if moe[1] == 'num_experts_per_tok' else 'experts'}, {moe[1]}) "
                            f"under the dense model_type {model_type!r}; give its own model_type (one of "
                            f"{', '.join(MOE_TYPES[:4])})")
    for key in ("kv_lora_rank", "q_lora_rank"):
        if raw.get(key) is not None and not model_type.startswith("deepseek"):
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
    experts = _moe(raw, model_type, layers, where, flag, need, maybe) if model_type in MOE_TYPES else {}
    if model_type.startswith("deepseek"):
        mla = ", ".join(f"{k} = {raw[k]}" for k in ("kv_lora_rank", "q_lora_rank") if raw.get(k) is not None)
        raise WorkloadError(f"{where}: {model_type} uses multi-head latent attention ({mla or 'kv_lora_rank'}): "
                            "mksim has no MLA attention block yet (its experts were read: "
                            f"{experts['num_experts']} routed, top-{experts['experts_per_token']}, "
                            f"{'a shared expert' if experts['shared_expert_intermediate_size'] else 'none shared'})")
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
        qk_norm=model_type in ("qwen3", "qwen3_moe", "olmoe"),
        qk_norm_scope="all" if model_type == "olmoe" else "head",
        attention_bias=flag("attention_bias", model_type == "qwen2" or (model_type == "qwen2_moe"
                                                                         and flag("qkv_bias", True))),
        rms_norm_eps=number("rms_norm_eps", 1e-5),
        rope_theta=number("rope_theta", 10000.0),
        max_position_embeddings=maybe("max_position_embeddings", 4096),
        model_type=model_type,
        sliding_window=window,
        full_attention_layers=full_layers,
        **{**experts, **_blocks(raw, where)},
    )


def _moe(raw: Mapping[str, Any], model_type: str, layers: int, where: str, flag: Any, need: Any,
         maybe: Any) -> dict[str, Any]:
    """The mixture-of-experts fields of a :data:`MOE_TYPES` config, as Hugging Face's modeling code reads
    them: the experts (count, top-k, width), the shared expert(s), the router, and the layers that stay dense."""
    count_key = {"mixtral": "num_local_experts", "deepseek_v2": "n_routed_experts",
                 "deepseek_v3": "n_routed_experts"}.get(model_type, "num_experts")
    width_key = "intermediate_size" if model_type in ("mixtral", "olmoe") else "moe_intermediate_size"
    # transformers 5 writes num_local_experts for every model type (num_experts is an alias of it)
    alt = "num_local_experts" if count_key == "num_experts" else "num_experts"
    for key in (count_key, alt):
        n = raw.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n <= 0:
            raise WorkloadError(f"{where}: {key} = {n}; a mixture of experts needs at least one expert")
    experts, top_k, width = need(count_key, alt), need("num_experts_per_tok"), need(width_key)
    check_moe(where, experts, top_k, width, "softmax")
    shared, gate = 0, False
    if model_type == "qwen2_moe":  # one shared expert, scaled by sigmoid(shared_expert_gate(x))
        if raw.get("shared_expert_intermediate_size") is None:
            raise WorkloadError(f"{where}: qwen2_moe has a shared expert; give its width, "
                                "shared_expert_intermediate_size")
        shared, gate = need("shared_expert_intermediate_size"), True
    elif model_type.startswith("deepseek") and raw.get("n_shared_experts"):  # n_shared experts as one MLP
        shared = maybe("n_shared_experts", 0) * width
    if model_type in ("qwen2_moe", "qwen3_moe"):  # sparse where (layer + 1) % decoder_sparse_step == 0
        only = raw.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
            raise WorkloadError(f"{where}: mlp_only_layers = {_short(only)}; expected a list of layer indices")
        if any(not 0 <= i < layers for i in only):
            raise WorkloadError(f"{where}: mlp_only_layers holds {next(i for i in only if not 0 <= i < layers)}, but "
                                f"the model has layers 0 to {layers - 1}")
        step = maybe("decoder_sparse_step", 1)
        dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
    elif model_type.startswith("deepseek"):  # sparse from first_k_dense_replace on, every moe_layer_freq-th
        first = raw.get("first_k_dense_replace") or 0
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise WorkloadError(f"{where}: first_k_dense_replace = {_short(first)}; expected an integer >= 0")
        freq = maybe("moe_layer_freq", 1)
        dense = tuple(i for i in range(layers) if i < first or i % freq)
    else:
        dense = ()
    scoring = raw.get("scoring_func") or ("sigmoid" if model_type == "deepseek_v3" else "softmax")
    if scoring not in SCORINGS:
        raise WorkloadError(f"{where}: scoring_func = {_short(scoring)}; known: {', '.join(SCORINGS)}")
    # Mixtral always renormalises its top-k weights; the others as norm_topk_prob says
    norm = True if model_type == "mixtral" else flag("norm_topk_prob", model_type == "deepseek_v3")
    return {"ffn_block": "moe", "num_experts": experts, "experts_per_token": top_k, "expert_intermediate_size": width,
            "shared_expert_intermediate_size": shared, "shared_expert_gate": gate, "router_scoring": scoring,
            "norm_topk_prob": norm, "dense_layers": dense}


def moe_hf_keys(cfg: ModelConfig) -> dict[str, Any]:
    """The Hugging Face keys that give :func:`config_from_hf` ``cfg``'s mixture of experts back (what a
    schedule file writes for an imported MoE model); ``{}`` for a dense model."""
    if not cfg.num_experts:
        return {}
    t = cfg.model_type
    out: dict[str, Any] = {{"mixtral": "num_local_experts"}.get(t, "num_experts"): cfg.num_experts,
                           "num_experts_per_tok": cfg.experts_per_token, "norm_topk_prob": cfg.norm_topk_prob}
    if t not in ("mixtral", "olmoe"):
        out["moe_intermediate_size"] = cfg.expert_intermediate_size
    if t == "qwen2_moe":
        out["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size
    if t in ("qwen2_moe", "qwen3_moe"):
        out["mlp_only_layers"] = list(cfg.dense_layers)
    return out


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
    if model_type in ("qwen2_moe", "qwen3_moe") and not flag("use_sliding_window", False):
        return None, 0  # transformers 5 writes sliding_window = 0 for Qwen2-MoE that uses none
    w = raw.get("sliding_window")
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w <= 0):
        raise WorkloadError(f"{where}: sliding_window = {_short(w)}; expected a positive integer (tokens) or null")
    if model_type in ("mistral", "mixtral"):
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

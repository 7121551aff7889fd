"""Models: built-in LLM configs, Hugging Face config import, torch tracing.

>>> from mksim import models
>>> models.names()[:2]
['llama-3.1-70b', 'llama-3.1-8b']
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mksim.extras import require
from mksim.workload import Step, Workload, build_llm_workload

from ._config import (
    MOE_TYPES,
    ModelConfig,
    builtin_names,
    config_from_hf,
    get,
    is_config_path,
    moe_experts,
    moe_hf_keys,
)

__all__ = ["MOE_TYPES", "ModelConfig", "config_from_hf", "from_hf_config", "from_torch", "get", "is_config_path",
           "moe_experts", "moe_hf_keys", "names", "workload"]


def names() -> list[str]:
    """Names of the built-in models."""
    return builtin_names()


def workload(model: str | ModelConfig | Step, **params: Any) -> Workload:
    """The op graph of one step of a built-in model (by name), a :class:`ModelConfig`, or a
    :class:`~mksim.workload.Step` (whose ``model`` is either).

    Parameters: the build choices of :func:`~mksim.workload.build_llm_workload` (``fuse_norm``, ...,
    ``kv_splits``, ``n_sms``); without a Step, also the step's ``batch``, ``kv_len``, ``phase``
    (``decode``/``prefill``), ``prefill_tokens`` and ``weight_dtype`` (``bf16``/``fp8``).

    >>> wl = workload(Step("llama-3.2-1b", batch=4, kv_len=512), fuse_norm=True)
    >>> wl == workload("llama-3.2-1b", batch=4, kv_len=512, fuse_norm=True), wl.step.rows
    (True, 4)
    """
    if isinstance(model, Step):
        cfg = get(model.model) if isinstance(model.model, str) else model.model
        return build_llm_workload(cfg, model.with_(model=cfg), **params)
    cfg = get(model) if isinstance(model, str) else model
    return build_llm_workload(cfg, **params)


def from_hf_config(path_or_dict: str | Path | Mapping[str, Any], **params: Any) -> Workload:
    """A workload from a Hugging Face ``config.json`` (path or dict); no network, no weights."""
    return build_llm_workload(config_from_hf(path_or_dict), **params)


def from_torch(module: Any, example_inputs: Any, **params: Any) -> Workload:
    """A workload from a torch ``nn.Module`` traced on the meta device (see :mod:`mksim.models._torch`)."""
    require("torch", "torch", "mksim.models.from_torch")  # one line naming the extra if torch is missing
    from ._torch import from_torch as _from_torch  # torch loads only here

    return _from_torch(module, example_inputs, **params)

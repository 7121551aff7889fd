"""Workloads: ops of a model step, built from blocks, and their tiling into task graphs."""

from importlib import import_module

from ._blocks import BLOCKS, ROLES, BaseBlock, blocks_of
from ._builder import (
    ACT_BYTES,
    DTYPE_BYTES,
    MATMUL_ALIGN,
    SWITCHES,
    VEC_ALIGN,
    Build,
    Builder,
    attended_tokens,
    default_kv_splits,
    resolved_kv_splits,
)
from ._kernels import CONTINUATION_KIND, expand_kernels, kernel_counts, kernel_of, kernels_per_op
from ._llm import build_llm_workload
from ._ops import Input, Op, Workload, check_op_graph
from ._tasks import Dep, TaskGraph, Tiling, tile_bounds
from .kinds import KINDS, OpKind, get_kind
from .parallel import COLLECTIVE_KINDS, check_parallel, rank_param_count, rank_view, shard_config
from .step import Step

# The built-in blocks, and any file added beside them, register as they are imported: last, so that such
# a file can import what it needs from mksim.workload.
blocks = import_module(f"{__name__}.blocks")

__all__ = ["ACT_BYTES", "BLOCKS", "BaseBlock", "Build", "Builder", "COLLECTIVE_KINDS",
           "CONTINUATION_KIND", "DTYPE_BYTES", "Dep", "Input",
           "KINDS", "MATMUL_ALIGN", "Op", "OpKind", "ROLES", "SWITCHES", "Step", "TaskGraph", "Tiling", "VEC_ALIGN",
           "Workload", "attended_tokens", "blocks", "blocks_of", "build_llm_workload", "check_op_graph",
           "check_parallel",
           "default_kv_splits", "expand_kernels", "get_kind", "kernel_counts", "kernel_of", "kernels_per_op",
           "rank_param_count", "rank_view", "resolved_kv_splits", "shard_config", "tile_bounds"]

"""Workloads: ops of a model step, and their tiling into task graphs."""

from ._kernels import CONTINUATION_KIND, expand_kernels, kernel_counts, kernel_of, kernels_per_op
from ._llm import ACT_BYTES, DTYPE_BYTES, MATMUL_ALIGN, VEC_ALIGN, build_llm_workload, default_kv_splits
from ._ops import OP_KINDS, Input, Op, Workload, check_op_graph
from ._tasks import Dep, TaskGraph, Tiling, tile_bounds
from .kinds import KINDS, OpKind, get_kind
from .step import Step

__all__ = ["ACT_BYTES", "CONTINUATION_KIND", "DTYPE_BYTES", "Dep", "Input", "KINDS", "MATMUL_ALIGN", "OP_KINDS", "Op",
           "OpKind", "Step", "TaskGraph", "Tiling", "VEC_ALIGN", "Workload", "build_llm_workload", "check_op_graph",
           "default_kv_splits", "expand_kernels", "get_kind", "kernel_counts", "kernel_of", "kernels_per_op",
           "tile_bounds"]

"""A workload from a torch ``nn.Module``, traced with torch.fx and run on the meta device.

Symbolic tracing records ``forward`` as a graph; running it on meta tensors gives every
node's output shape without allocating or reading a weight. Then, node by node:
Linear / linear / matmul → ``matmul`` (weights in ``weight_dtype``), Embedding → ``embed``
(the gathered rows), norms → ``rmsnorm``, SDPA → one ``attn_partial`` over heads,
``silu(a) * b`` → ``silu_mul``, ``+`` → ``add``, other math → ``elementwise``; views pass
their producer through. ``out_size`` is the last dimension (heads for attention) and
``elem_bytes`` the bf16 bytes of the rest, as in the built-in LLM builder. Only this module
of mksim imports torch.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.utils.flop_counter import FlopCounterMode

from mksim.errors import WorkloadError
from mksim.workload import ACT_BYTES, DTYPE_BYTES, MATMUL_ALIGN, VEC_ALIGN, Input, Op, Workload, build_llm_workload

from ._config import MOE_COUNT_KEYS, config_from_hf, moe_experts

# Nodes that only move or relabel data: their producer passes through, no op is made.
_VIEWS = {"view", "reshape", "permute", "transpose", "t", "contiguous", "unsqueeze", "squeeze",
          "flatten", "unflatten", "expand", "expand_as", "repeat", "repeat_interleave", "getitem",
          "float", "half", "bfloat16", "double", "to", "type", "type_as", "clone", "detach",
          "dropout", "identity", "chunk", "split", "tensor_split", "unbind", "narrow", "size", "dim",
          "numel", "getattr", "movedim", "swapaxes", "view_as", "reshape_as"}
# Ops whose output element i needs input element i only (given equal last dimensions).
_POINTWISE = {"add", "iadd", "sub", "isub", "mul", "imul", "truediv", "div", "neg", "pow", "rsqrt",
              "sqrt", "exp", "log", "tanh", "sigmoid", "silu", "gelu", "relu", "softplus", "mish",
              "leaky_relu", "elu", "hardswish", "clamp", "abs", "square", "where", "masked_fill",
              "sin", "cos", "erf", "reciprocal", "maximum", "minimum"}
# Parameterless torch.nn modules, handled as the function of the same meaning.
_MODULE_FNS = {"SiLU": "silu", "GELU": "gelu", "ReLU": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid",
               "Mish": "mish", "Softplus": "softplus", "LeakyReLU": "leaky_relu", "ELU": "elu",
               "Hardswish": "hardswish", "Softmax": "softmax", "Dropout": "dropout",
               "Identity": "identity", "Flatten": "flatten", "Unflatten": "unflatten"}


@dataclass(frozen=True)
class _Act:
    """An activation made by op ``op`` (None: a graph input); its last-dim element i is the
    producer's element ``i + off`` (None: layout lost, so a consumer needs all of it)."""
    op: str | None
    off: int | None


@dataclass(frozen=True)
class _Param:
    key: str
    numel: int
    ndim: int


@dataclass(frozen=True)
class _Silu:
    """A SiLU deferred into the multiply that is its only user (SwiGLU's silu_mul)."""
    src: fx.Node


def _is_norm(m: nn.Module) -> bool:
    return (isinstance(m, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm))
            or type(m).__name__.endswith(("RMSNorm", "LayerNorm")))


class _Tracer(fx.Tracer):
    """Keeps Linear, Embedding, norms and the caller's classes as single graph nodes."""

    def __init__(self, leaves: tuple[type, ...]):
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return _is_norm(m) or isinstance(m, self.leaves) or super().is_leaf_module(m, qualname)


def _name(n: fx.Node) -> str:
    name = str(n.target) if n.op == "call_method" else getattr(n.target, "__name__", str(n.target))
    return name if name.startswith("__") else name.rstrip("_")  # in-place x.add_ is add


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, (tuple, list, dict)):
        return [t for v in (x.values() if isinstance(x, dict) else x) for t in _tensors(v)]
    return [x] if isinstance(x, torch.Tensor) else []


def _to_meta(x: Any) -> Any:
    if isinstance(x, (tuple, list)):
        return type(x)(_to_meta(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_meta(v) for k, v in x.items()}
    return torch.empty_like(x, device="meta") if isinstance(x, torch.Tensor) else x


def _meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its tensors on meta; the caller's module stays as it was.
    Seeding deepcopy's memo with meta stand-ins means no real tensor is ever copied."""
    memo: dict[int, Any] = {}
    for m in module.modules():
        for t in [*m._parameters.values(), *m._buffers.values(), *vars(m).values()]:
            if isinstance(t, torch.Tensor) and id(t) not in memo:
                meta = torch.empty_like(t, device="meta")
                memo[id(t)] = nn.Parameter(meta, t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(module, memo)


def _experts(module: nn.Module) -> str | None:
    """How ``module`` shows it is a mixture of experts, or None: its ``config`` counts experts (as a
    Hugging Face config does: :func:`mksim.models.moe_experts`), or a submodule is named ``experts``
    (``block_sparse_moe.experts``, ``mlp.experts``) with more than one expert in it."""
    cfg = getattr(module, "config", None)
    keys = (*MOE_COUNT_KEYS, "num_experts_per_tok")
    raw = dict(cfg) if isinstance(cfg, dict) else {k: getattr(cfg, k, None) for k in keys} if cfg is not None else {}
    found = moe_experts(raw)
    if found is not None:
        return f"{found[0]} experts, config.{found[1]}"
    for qual, m in module.named_modules():
        if re.search(r"(^|[._])experts$", qual):
            n = len(m) if isinstance(m, (nn.ModuleList, nn.ModuleDict, nn.Sequential)) else \
                getattr(m, "num_experts", None)
            if n is None or (isinstance(n, int) and n > 1):
                return f"{n} experts in {qual}" if n else f"experts in {qual}"
    return None


def _last(x: Any) -> int | None:
    return int(x.shape[-1]) if isinstance(x, torch.Tensor) and x.dim() else None


def _slice_off(off: int, idx: Any, inp: torch.Tensor) -> int | None:
    """The last-dim offset after ``inp[idx]``: kept or shifted by a plain slice, else lost."""
    items = [i for i in (idx if isinstance(idx, tuple) else (idx,)) if i is not None]
    if any(i is Ellipsis for i in items):
        last = items[-1] if items[-1] is not Ellipsis else slice(None)
    else:
        last = items[-1] if len(items) == inp.dim() else slice(None)
    if not isinstance(last, slice) or last.step not in (None, 1) or not isinstance(last.start or 0, int):
        return None
    start = last.start or 0
    return off + (start + int(inp.shape[-1]) if start < 0 else start)


class _Builder:
    """Maps the nodes of a shape-propagated graph to ops, in graph (topological) order."""

    def __init__(self, gm: fx.GraphModule, scopes: dict[str, Any], env: dict[fx.Node, Any], dtype: str):
        self.gm, self.scopes, self.env, self.dtype, self.wb = gm, scopes, env, dtype, DTYPE_BYTES[dtype]
        self.ops: list[Op] = []
        self.refs: dict[fx.Node, Any] = {}
        self.kv_len = 0

    def val(self, a: Any) -> Any:
        return fx.node.map_arg(a, lambda n: self.env[n])

    def visit(self, n: fx.Node) -> None:
        if n.op == "placeholder":
            self.refs[n] = _Act(None, None)
        elif n.op == "get_attr":  # buffers (rotary tables, masks) are constants, not weights
            obj = functools.reduce(getattr, str(n.target).split("."), self.gm)
            self.refs[n] = _Param(str(n.target), obj.numel(), obj.dim()) if isinstance(obj, nn.Parameter) else None
        elif n.op in ("call_module", "call_function", "call_method"):
            m = self.gm.get_submodule(str(n.target)) if n.op == "call_module" else None
            name = _name(n) if m is None else _MODULE_FNS.get(type(m).__name__, "")
            self.node(n, None if name else m, name, self.env[n])

    def node(self, n: fx.Node, m: nn.Module | None, name: str, out: Any) -> None:
        data = n.all_input_nodes
        if m is None and name in _VIEWS:
            self.refs[n] = self.view(n, name, out)
        elif not _tensors(out) or all(self.refs.get(a) is None for a in data):
            self.refs[n] = None  # no data flows in: a constant (mask, position table, size)
        elif m is not None:
            self.module(n, m, out)
        elif name in ("linear", "matmul", "mm", "bmm"):
            a = self.val(n.args[0])
            inputs, params = self.gather(data, out, False)  # a 1-D parameter of linear is its bias
            self.matmul(n, out, _last(a) or 1, inputs,
                        sum(p.numel * (self.wb if p.ndim >= 2 else ACT_BYTES) for p in params))
        elif name == "embedding":
            idx = n.args[0]
            inputs, _ = self.gather([idx] if isinstance(idx, fx.Node) else [], out, False)
            rows = self.val(idx).numel()
            self.emit(n, "embed", out, inputs, 0.0, rows * (_last(out) or 1) * ACT_BYTES)
        elif name in ("layer_norm", "rms_norm", "group_norm"):
            inputs, params = self.gather(data, out, False)
            self.emit(n, "rmsnorm", out, inputs, 4.0 * out.numel(), sum(p.numel for p in params) * ACT_BYTES)
        elif name == "scaled_dot_product_attention":
            self.attention(n, out)
        elif name == "silu" and len(n.users) == 1 and _name(user := next(iter(n.users))) in ("mul", "imul") \
                and user.args[0] is not user.args[-1]:
            self.refs[n] = _Silu(data[0])
        else:
            nodes, kind, per_elem = list(data), "add" if name in ("add", "iadd") else "elementwise", 1.0
            if any(isinstance(self.refs.get(a), _Silu) for a in nodes):  # silu(gate) * up
                nodes = [self.refs[a].src if isinstance(self.refs.get(a), _Silu) else a for a in nodes]
                kind, per_elem = "silu_mul", 5.0  # sigmoid and two multiplies, as the built-in builder
            inputs, params = self.gather(nodes, out, name in _POINTWISE)
            self.emit(n, kind, out, inputs, per_elem * _tensors(out)[0].numel(),
                      sum(p.numel for p in params) * ACT_BYTES, fn=name)

    def gather(self, nodes: Iterable[fx.Node], out: Any, pointwise: bool) -> tuple[list[Input], list[Any]]:
        """Inputs on producer ops (identity where the layout is known, else full) and params read."""
        inputs: dict[str, list[Input]] = {}
        params: dict[str, _Param] = {}
        for a in nodes:
            ref = self.refs.get(a)
            for r in ref if isinstance(ref, tuple) else (ref,):
                if isinstance(r, _Param):
                    params[r.key] = r
                elif isinstance(r, _Act) and r.op is not None:
                    same = pointwise and r.off is not None and _last(self.env[a]) == _last(out) is not None
                    inp = Input(r.op, full=not same, segments=((r.off or 0, 1, 1),) if same else ((0, 1, 1),))
                    if inp not in inputs.setdefault(r.op, []):
                        inputs[r.op].append(inp)
        # an op read in full needs no finer ranges from it as well
        flat = [i for ins in inputs.values() for i in ([j for j in ins if j.full][:1] or ins)]
        return flat, list(params.values())

    def emit(self, n: fx.Node, kind: str, out: Any, inputs: list[Input], flops: float, weight: float = 0.0,
             *, size: int | None = None, align: int = VEC_ALIGN, dtype: str = "bf16", **extra: Any) -> None:
        t = _tensors(out)[0]
        size = size or _last(t) or 1
        if t.numel() == 0:
            self.refs[n] = None
            return
        scope = self.scopes.get(n.name, ("",))[0]  # FX node names go under the module that made them
        base = str(n.target) if n.op == "call_module" else f"{scope}.{n.name}" if scope else n.name
        taken, name, i = {op.name for op in self.ops}, base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        layer = re.search(r"\.(\d+)(?:\.|$)", name)  # layers.3.mlp -> 3
        self.ops.append(Op(name=name, kind=kind, out_size=int(size), elem_bytes=t.numel() / size * ACT_BYTES,
                           flops=float(flops), weight_bytes=float(weight), inputs=tuple(inputs),
                           layer=int(layer.group(1)) if layer else None, align=align, dtype=dtype,
                           kv_read_bytes=float(extra.pop("kv_read", 0.0)),
                           attrs={"fx_node": n.name, **extra}))
        # each part of a leaf module's tuple output lies somewhere in the op's output
        single = isinstance(out, torch.Tensor)
        self.refs[n] = _Act(name, 0) if single else tuple(_Act(name, None) for _ in out)

    def matmul(self, n: fx.Node, out: torch.Tensor, k: int, inputs: list[Input], weight: float) -> None:
        cols = _last(out) or 1
        rows = out.numel() // cols
        self.emit(n, "matmul", out, inputs, 2.0 * rows * k * cols, weight, align=MATMUL_ALIGN,
                  dtype=self.dtype if weight else "bf16", k=k, rows=rows)

    def module(self, n: fx.Node, m: nn.Module, out: Any) -> None:
        inputs, _ = self.gather(n.all_input_nodes, out, False)
        numel = _tensors(out)[0].numel()
        if isinstance(m, nn.Linear):
            bias = m.bias.numel() * ACT_BYTES if m.bias is not None else 0
            self.matmul(n, out, m.in_features, inputs, m.weight.numel() * self.wb + bias)
        elif isinstance(m, nn.Embedding):  # reads only the rows it gathers
            rows = self.val(n.args[0]).numel()
            self.emit(n, "embed", out, inputs, 0.0, rows * m.embedding_dim * ACT_BYTES)
        elif _is_norm(m):  # 4 FLOP/element (square, sum, scale, weight), as the built-in builder
            weight = sum(p.numel() for p in m.parameters()) * ACT_BYTES
            self.emit(n, "rmsnorm", out, inputs, 4.0 * numel, weight)
        else:  # a leaf we know nothing of: a matmul over its matrices, if it has any
            big = sum(p.numel() for p in m.parameters() if p.dim() >= 2)
            small = sum(p.numel() for p in m.parameters() if p.dim() < 2)
            try:  # torch's FLOP counter knows mm, conv and attention, and works on meta shapes
                with FlopCounterMode(display=False) as counter, torch.no_grad(), torch.device("meta"):
                    m(*self.val(n.args), **self.val(n.kwargs))
                flops = float(counter.get_total_flops()) or numel
            except Exception:  # an estimate will do: one multiply-add per weight per row
                flops = 2.0 * big * numel / (_last(_tensors(out)[0]) or 1) or numel
            self.emit(n, "matmul" if big else "elementwise", out, inputs, flops,
                      big * self.wb + small * ACT_BYTES, align=MATMUL_ALIGN if big else VEC_ALIGN,
                      module=type(m).__name__)

    def attention(self, n: fx.Node, out: torch.Tensor) -> None:
        keys = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
        arg = [n.args[i] if len(n.args) > i else n.kwargs.get(key) for i, key in enumerate(keys)]
        q, k, v = (self.val(a) for a in arg[:3])
        lq, hd, lk, hdv = int(q.shape[-2]), int(q.shape[-1]), int(k.shape[-2]), int(v.shape[-1])
        causal = bool(self.val(arg[5]))
        # pairs attended; SDPA's causal mask is aligned top-left
        pairs = lq * lk if not causal else \
            lq * (lq + 1) // 2 if lq <= lk else lk * (lk + 1) // 2 + (lq - lk) * lk
        # K/V handed in as graph inputs are a KV cache: read from memory, not made by an op
        kv = sum(self.val(a).numel() * ACT_BYTES for a in arg[1:3]
                 if isinstance(a, fx.Node) and self.refs.get(a) == _Act(None, None))
        self.kv_len = max(self.kv_len, lk - lq)
        inputs, _ = self.gather(n.all_input_nodes, out, False)
        bh = q.numel() // (lq * hd)  # batch x heads
        self.emit(n, "attn_partial", out, inputs, 2.0 * bh * pairs * (hd + hdv),
                  size=int(out.shape[-3]) if out.dim() >= 3 else 1, align=1, kv_read=kv, kv_splits=1,
                  kv_total=lk, causal=causal)

    def view(self, n: fx.Node, name: str, out: Any) -> Any:
        """What a view's output refers to: the producer, with the last-dim offset if still known."""
        src = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        r = self.refs.get(src) if src is not None else None
        if src is None or r is None or isinstance(r, _Silu) or not _tensors(out) or isinstance(out, dict):
            return None
        args = self.val(n.args)
        if isinstance(r, tuple):  # picking from a multi-output node
            return r[args[1]] if name == "getitem" and isinstance(args[1], (int, slice)) else None
        if isinstance(r, _Param):
            if isinstance(out, torch.Tensor):
                return _Param(r.key, min(r.numel, out.numel()), out.dim())
            return tuple(_Param(f"{r.key}[{i}]", t.numel(), t.dim()) for i, t in enumerate(out))
        inp = self.env[src]
        nd = max(inp.dim(), 1)

        def is_last(d: Any) -> bool:
            return isinstance(d, int) and d % nd == nd - 1
        if not isinstance(out, torch.Tensor):  # chunk / split / unbind: offsets along the last dim
            dim = args[1 if name == "unbind" else 2] if len(args) > (1 if name == "unbind" else 2) \
                else n.kwargs.get("dim", 0)
            if r.off is None or (is_last(dim) and name == "unbind"):
                return tuple(_Act(r.op, None) for _ in out)
            return tuple(_Act(r.op, r.off + (sum(_last(t) or 0 for t in out[:i]) if is_last(dim) else 0))
                         for i in range(len(out)))
        off = r.off if _last(inp) == _last(out) is not None else None
        if name in ("transpose", "swapaxes"):
            off = None if any(is_last(d) for d in args[1:3]) else off
        elif name == "permute":
            dims = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
            off = off if dims and is_last(dims[-1]) else None
        elif name in ("t", "movedim", "getattr"):  # x.T and x.mT are getattr
            off = off if name == "t" and inp.dim() < 2 else None
        elif name == "narrow" and r.off is not None:
            off = r.off + args[2] if is_last(args[1]) else off
        elif name == "getitem" and r.off is not None:
            off = _slice_off(r.off, args[1], inp)
        return _Act(r.op, off)


def _moe_workload(module: nn.Module, moe: str, example_inputs: Any, *, name: str | None, batch: int | None,
                  weight_dtype: str, phase: str, kv_len: int | None) -> Workload:
    """A mixture-of-experts module's workload, from its Hugging Face config (what ``config_from_hf``
    builds): a trace would run every token through one expert's shapes, as a dense model."""
    cls, cfg = type(module).__name__, getattr(module, "config", None)
    to_dict = getattr(cfg, "to_dict", None)
    raw = cfg if isinstance(cfg, dict) else to_dict() if callable(to_dict) else None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise WorkloadError(f"{cls} is a mixture-of-experts model ({moe}) without a Hugging Face config to read its "
                            "experts from, and tracing it would run every token through one expert's shapes; give "
                            "mksim.models.from_hf_config the model's config.json")
    try:
        mc = config_from_hf(raw, name=name)
    except WorkloadError as exc:
        raise WorkloadError(f"{cls} is a mixture-of-experts model ({moe}); its config cannot be built: {exc}") from None
    if not mc.num_experts:
        raise WorkloadError(f"{cls} has experts ({moe}) but its config ({mc.model_type}) describes a dense model; give "
                            "mksim.models.from_hf_config the model's config.json")
    first = next(iter(_tensors(example_inputs)), None)
    lead = [int(d) for d in first.shape[:2]] if first is not None else []
    b, seq = batch or (lead[0] if lead else 1), lead[1] if len(lead) > 1 else 1
    prefill = phase == "prefill"
    return build_llm_workload(mc, batch=b, phase=phase, prefill_tokens=seq if prefill else 0,
                              kv_len=(0 if prefill else 1024) if kv_len is None else kv_len, weight_dtype=weight_dtype)


def from_torch(module: nn.Module, example_inputs: Any, *, name: str | None = None, batch: int | None = None,
               weight_dtype: str = "bf16", phase: str = "decode",
               leaf_modules: Iterable[type] = (), kv_len: int | None = None) -> Workload:
    """The op graph of one forward of ``module``, traced on the meta device.

    ``example_inputs``: a tensor, a tuple of positional inputs, or a dict of keyword inputs
    (real or meta tensors; only shapes and dtypes are used). The module is copied to meta
    first, so no weight is allocated and the caller's module is left unchanged. Linear,
    Embedding, norm classes (and ``leaf_modules``, for code torch.fx cannot trace) stay
    single ops; ``batch`` defaults to the first input's leading dimension.

    A mixture-of-experts module (a Hugging Face MoE model: its ``config`` counts experts, or a
    submodule is called ``experts``) is not traced: its workload is built from its config, as
    :func:`~mksim.models.config_from_hf` reads it (``batch`` sequences of the inputs' length in
    prefill, one token each in decode with ``kv_len`` tokens cached, 1024 by default); one without
    a config mksim can read is refused in one line.

    Example::

        >>> import torch
        >>> from mksim import models
        >>> with torch.device("meta"):
        ...     net = torch.nn.Sequential(torch.nn.Linear(64, 256, bias=False), torch.nn.SiLU(),
        ...                               torch.nn.Linear(256, 64, bias=False))
        >>> wl = models.from_torch(net, torch.zeros(4, 64, device="meta"))
        >>> [op.kind for op in wl.ops], wl.weight_bytes
        (['matmul', 'elementwise', 'matmul'], 65536.0)
    """
    if not isinstance(module, nn.Module):
        raise WorkloadError(f"from_torch needs a torch.nn.Module, got {type(module).__name__}")
    if weight_dtype not in ("bf16", "fp16", "fp8"):
        raise WorkloadError(f"weight dtype must be bf16, fp16 or fp8, got {weight_dtype!r}")
    if phase not in ("decode", "prefill"):
        raise WorkloadError(f"phase must be 'decode' or 'prefill', got {phase!r}")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise WorkloadError(f"batch must be a positive integer, got {batch!r}")
    cls = type(module).__name__
    moe = _experts(module)
    if moe is not None:
        return _moe_workload(module, moe, example_inputs, name=name, batch=batch, weight_dtype=weight_dtype,
                             phase=phase, kv_len=kv_len)
    try:
        mod = _meta_copy(module).eval()
    except Exception as exc:
        raise WorkloadError(f"could not copy {cls} to the meta device ({_first_line(exc)})") from None
    inputs = _to_meta(example_inputs)
    tracer = _Tracer(tuple(leaf_modules))
    try:
        graph = tracer.trace(mod)
    except Exception as exc:
        raise WorkloadError(f"torch.fx could not trace {cls} ({_first_line(exc)}); mark the submodule that "
                            "fails as a leaf (leaf_modules=[ThatClass]) or, for a Llama-like model, use "
                            "mksim.models.from_hf_config") from None
    gm = fx.GraphModule(tracer.root, graph, cls)
    holders = [str(n.target) for n in graph.nodes if n.op == "placeholder"]
    if isinstance(inputs, dict):
        if set(inputs) - set(holders):
            raise WorkloadError(f"{cls}.forward has no input named {sorted(set(inputs) - set(holders))[0]!r}")
        defaults = {str(n.target): n.args[0] for n in graph.nodes if n.op == "placeholder" and n.args}
        args = [inputs[h] if h in inputs else defaults.get(h) for h in holders]
    else:
        args = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    env: dict[fx.Node, Any] = {}
    try:
        with torch.no_grad(), torch.device("meta"):  # tensors made in forward (arange, masks) too
            fx.Interpreter(gm, garbage_collect_values=False).run(*args, initial_env=env)
    except Exception as exc:
        bad = next((n for n in graph.nodes if n.op != "output" and n not in env), None)
        what = "?" if bad is None else type(gm.get_submodule(str(bad.target))).__name__ \
            if bad.op == "call_module" else _name(bad)
        raise WorkloadError(f"running {cls} on the meta device failed at node {getattr(bad, 'name', '?')} "
                            f"({what}: {_first_line(exc)}); check example_inputs (shapes, dtypes) or, "
                            "for a Llama-like model, use mksim.models.from_hf_config") from None
    builder = _Builder(gm, getattr(tracer, "node_name_to_scope", {}), env, weight_dtype)
    for n in graph.nodes:
        builder.visit(n)
    if not builder.ops:
        raise WorkloadError(f"{cls} traced to no ops: no parameter or tensor input reaches its output")
    first = next(iter(_tensors(inputs)), None)
    lead = [int(d) for d in first.shape[:2]] if first is not None else []
    b, seq = batch or (lead[0] if lead else 1), lead[1] if len(lead) > 1 else 1
    return Workload(name=name or f"{cls} {phase} b{b}", ops=tuple(builder.ops),
                    tokens=b if phase == "decode" else b * seq, batch=b, kv_len=builder.kv_len, phase=phase,
                    prefill_tokens=seq if phase == "prefill" else 0, weight_dtype=weight_dtype)

"""Blocks: the parts a decoder-only model is composed of, one file each in ``mksim/workload/blocks/``.

A model is ``embedding`` + ``num_layers`` × (``attention`` + ``ffn``) + ``head``: these are the
:data:`ROLES`. A block is a subclass of :class:`BaseBlock` with a ``name`` and a ``role``, registered
in :data:`BLOCKS` with the ``@BLOCKS.add`` decorator. Which block plays each role comes from the
model's config: :func:`blocks_of` reads ``cfg.<role>_block`` (``ModelConfig.attention_block`` = ``"gqa"``,
``ffn_block`` = ``"gated_mlp"``, ...), the field the config importer sets from a Hugging Face config.

The hooks, and when :func:`~mksim.workload.build_llm_workload` calls them:

- :meth:`BaseBlock.check` ``(cfg, build)`` — once per workload for each block the model uses, before
  any op is made: refuse, in one line (:class:`~mksim.errors.WorkloadError`), a :class:`Build` choice
  the block cannot take for ``cfg`` (the attention block refuses ``fuse_rope`` with q/k norms). Build
  choices that conflict whatever the model are refused by :class:`Build` itself.
- :meth:`BaseBlock.ops` ``(b, layer, x)`` — once per layer for ``attention`` and ``ffn`` (``layer`` 0 to
  ``num_layers - 1``, attention first), once per step for ``embedding`` (``layer`` None, ``x`` "") and
  ``head`` (``layer`` None): add the block's ops to the :class:`~mksim.workload.Builder` ``b``, reading
  the residual stream from the op called ``x``, and return the name of the op that holds the residual
  stream after the block (the head returns its last op). Everything a block needs is on ``b``: the
  config ``b.cfg``, the :class:`~mksim.workload.Step` ``b.step`` (batch, KV length, phase),
  ``b.build``, the derived ``b.rows`` and ``b.kv_splits``; ``b.norm``/``b.matmul`` make the ops every
  block shares (and honour ``fuse_norm``), ``b.add`` any other. An op's kind must be in
  :data:`~mksim.workload.KINDS`; a block that needs a new kind registers it in its own file.

- :meth:`BaseBlock.params` ``(cfg, layer)`` — called as :meth:`~mksim.models.ModelConfig.param_count`
  is, with the same ``layer`` as :meth:`~BaseBlock.ops`: the parameters the block holds (its share of
  the model's state dict; tied embeddings are the embedding's).

Ops are named ``L<layer>.<what>`` inside a layer; a block that varies per layer (a mixture of experts
with dense layers among the sparse ones) reads the layer from ``layer`` and the per-layer facts from
``cfg``, and may call another block's :meth:`~BaseBlock.ops` for the layers it leaves alone.

>>> from mksim.workload import BLOCKS
>>> [(n, BLOCKS[n].role) for n in BLOCKS]
[('embed', 'embedding'), ('gqa', 'attention'), ('gated_mlp', 'ffn'), ('lm_head', 'head'), ('moe', 'ffn')]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from mksim.errors import WorkloadError
from mksim.registry import Registry

if TYPE_CHECKING:
    from ._builder import Build, Builder

#: what a block can be, in the order a model's ops come
ROLES = ("embedding", "attention", "ffn", "head")


class BaseBlock:
    """A part of a model: a ``name``, a ``role`` of :data:`ROLES`, and the hooks above."""

    name: ClassVar[str] = ""
    role: ClassVar[str] = ""

    def check(self, cfg: Any, build: Build) -> None:
        """Refuse a build choice this block cannot take for ``cfg`` (one line); default: take every one."""

    def ops(self, b: Builder, layer: int | None, x: str) -> str:
        """Add this block's ops to ``b`` after the op ``x``; return the op holding the residual stream."""
        raise NotImplementedError

    def params(self, cfg: Any, layer: int | None) -> int:
        """Parameters this block holds in ``layer`` (None: embedding, head); default none."""
        return 0


def _check_block(block: BaseBlock) -> None:
    if block.role not in ROLES:
        raise ValueError(f"block {block.name!r} needs a role in {ROLES}, got {block.role!r}")
    if type(block).ops is BaseBlock.ops:
        raise ValueError(f"block {block.name!r} must define ops(b, layer, x)")


BLOCKS: Registry[BaseBlock] = Registry("block", check=_check_block)


def blocks_of(cfg: Any) -> dict[str, BaseBlock]:
    """The block playing each role of :data:`ROLES` in ``cfg``: the one ``cfg.<role>_block`` names (an
    unknown name is refused in one line, listing the registered blocks), else the first registered for
    the role (a stand-in config without the field)."""
    out = {}
    for role in ROLES:
        of_role = [n for n in BLOCKS if BLOCKS[n].role == role]
        name = getattr(cfg, f"{role}_block", None) or of_role[0]
        block = BLOCKS.get(name)
        if block.role != role:
            raise WorkloadError(f"{getattr(cfg, 'name', 'model')}: {role}_block = {name!r} is a {block.role} block; "
                                f"give one of {', '.join(of_role)}")
        out[role] = block
    return out


__all__ = ["BLOCKS", "ROLES", "BaseBlock", "blocks_of"]

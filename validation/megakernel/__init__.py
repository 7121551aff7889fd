"""A schedule as real CUDA kernels: mksim's generated megakernel and its kernel chains.

- :mod:`.encode`: a schedule's per-SM queues as instruction tables (pure numpy);
- :mod:`.program`: the buffers, op table, tables and launch shape of a schedule (pure numpy);
- ``mk_kernel.cu`` (+ ``validation/kernels/mk_ops.cuh``): the persistent interpreter, the same
  with a grid barrier per op, and one kernel per op for the chain modes;
- :mod:`.reference`: the same decode step in torch;
- :mod:`.gpu`: allocate, launch (stream, CUDA graph, graph + PDL, persistent), check, time;
- :mod:`.syncs`: the megakernel's syncs (counter, flag, sentinel) measured against each other.
"""

from .encode import OPCODES, Program, decode, encode, opcode_defines

__all__ = ["OPCODES", "Program", "decode", "encode", "opcode_defines"]

"""A schedule as a real persistent megakernel (issue 6, in progress).

:mod:`.encode` turns a :class:`~mksim.schedule.Schedule` into the instruction tables the
generated kernel interprets; code generation and the runner build on it.
"""

from .encode import OPCODES, Program, decode, encode

__all__ = ["OPCODES", "Program", "decode", "encode"]

"""``python -m validation VERB ...``: the GPU lab's runners, one command with a verb each.

The runners that measure on a GPU run on machines that hold the project's core packages and the
GPU's (torch, CuPy) but not typer or rich, so they are plain ``argparse`` mains; this module puts
them behind one entry point. Each verb is a module with a ``main(argv)`` that keeps its own options
and its own one-line errors (``error: ...``, exit 2); the module is imported only when its verb
runs, so a verb loads no more than its runner did as a module of its own (``host-rate`` and
``node-grid`` load nothing of mksim). ``mksim validate`` (the suite, one case, the report) and
``mksim calibrate`` are the typer front of the same code on a machine with every package.

>>> verb("suite").module
'validation.suite.parts'
>>> verb("suites")
Traceback (most recent call last):
...
validation.verbs.UnknownVerbError: unknown verb 'suites'; known: suite, megakernel, megakernel-ab, ...
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

PROG = "python -m validation"


@dataclass(frozen=True)
class Verb:
    """A runner: its verb, the module whose function ``func(argv)`` runs it, and one line on what it does."""

    name: str
    module: str
    summary: str
    func: str = "main"

    @property
    def prog(self) -> str:
        """The command line its help and usage show (``python -m validation suite``)."""
        return f"{PROG} {self.name}"


#: Every verb, in the order ``python -m validation --help`` lists them.
VERBS: tuple[Verb, ...] = (
    Verb("suite", "validation.suite.parts",
         "the standard suite on this GPU in parts that fit a device call: parts, run, merge"),
    Verb("megakernel", "validation.megakernel.quick",
         "check and time one model's decode step in several modes (a quick look; GPU)"),
    Verb("megakernel-ab", "validation.megakernel.ab",
         "A/B cases of the generated kernels in one process, within a time budget (GPU)"),
    Verb("megakernel-predict", "validation.megakernel.predict",
         "predict the steps a `megakernel --json` run measured (CPU)"),
    Verb("megakernel-syncs", "validation.megakernel.syncs",
         "the megakernel's counter, flag and sentinel syncs: checked, timed, predicted (GPU)"),
    Verb("megakernel-l2", "validation.megakernel.l2_sweep",
         "sweep the megakernel's L2 prefetcher: lead x instruction (GPU)"),
    Verb("megakernel-attn", "validation.megakernel.attn_suite",
         "the attention models' cases: predict (CPU, before the run), run (GPU), compare (CPU)"),
    Verb("megakernel-attn2", "validation.megakernel.attn2_suite",
         "the attention shapes first run here (head sizes 80, 96, 256; MHA; windows): predict, run, compare"),
    Verb("megakernel-kchunk", "validation.megakernel.kchunk_suite",
         "the k-chunked input rows' cases (7-12 B models at batch 8): predict (CPU), run (GPU), compare (CPU)"),
    Verb("kernel-costs", "validation.kernel_costs",
         "fit the generated kernels' per-task costs to single ops (CPU)"),
    Verb("calibrate", "validation.cli",
         "measure this GPU with microbenchmarks and write a calibrated hardware model (mksim calibrate)",
         func="calibrate_main"),
    Verb("calibrate-report", "validation.calibrate.report",
         "the markdown table of a calibration's fits against the base model (CPU)"),
    Verb("mechanisms", "validation.mechanisms.cli",
         "the mechanism sweeps: run (GPU), summarize and fit (CPU)"),
    Verb("host-rate", "validation.mechanisms.host_rate",
         "how fast torch's host path issues kernels back to back (GPU)"),
    Verb("node-grid", "validation.mechanisms.node_grid",
         "a CUDA graph's node interval against the kernel's grid (GPU)"),
    Verb("microchain", "validation.microchain",
         "chains of memory-bound kernels: predicted against measured (CPU)"),
    Verb("chains", "validation.chains.cli",
         "chains of LLM projections, mksim's kernels and cuBLAS: run (GPU), predict and fit (CPU)"),
    Verb("whatif", "validation.whatif.cli",
         "the persistent modes on fewer of the H200's SMs: run (GPU), summarize (CPU)"),
    Verb("stacks", "validation.stacks.cli",
         "the stacks users run (torch_graph, inductor_graph): run (GPU), profile, predict, answer, records"),
)


class UnknownVerbError(ValueError):
    """A verb that is not one of :data:`VERBS` (one line that lists them)."""


def verb(name: str) -> Verb:
    """The verb called ``name``; :class:`UnknownVerbError` otherwise."""
    for v in VERBS:
        if v.name == name:
            return v
    known = ", ".join(v.name for v in VERBS[:3])
    raise UnknownVerbError(f"unknown verb {name!r}; known: {known}, ... (all of them: {PROG} --help)")


def usage() -> str:
    """What ``python -m validation --help`` prints: the verbs with one line each."""
    width = max(len(v.name) for v in VERBS)
    lines = [f"usage: {PROG} VERB [options]   ({PROG} VERB --help: a verb's options)", "",
             "The GPU lab's runners. Verbs:"]
    lines += [f"  {v.name:<{width}}  {v.summary}" for v in VERBS]
    lines += ["", "mksim validate and mksim calibrate run the suite, one case and the calibration on a machine "
                  "with every package."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``argv[0]``'s runner with the rest of ``argv``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        return 0 if args else 2
    try:
        v = verb(args[0])
    except UnknownVerbError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rc = getattr(importlib.import_module(v.module), v.func)(args[1:])
    return rc if isinstance(rc, int) else 0


__all__ = ["PROG", "VERBS", "UnknownVerbError", "Verb", "main", "usage", "verb"]

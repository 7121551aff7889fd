"""``mksim trace``: import a ``torch.profiler`` trace of a decode step (:mod:`mksim.trace`).

Mounted by :mod:`mksim.cli` by dotted name and imported only when invoked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
import typer.core
from rich.markup import escape
from rich.table import Table

from hwmodels.files import check_outputs
from mksim.console import emit_json, make_table, out, to_json, write_output
from mksim.errors import OutputError, check_writable
from mksim.trace import TraceImport, cut_trace, import_trace, median_gap_us, short_name

try:  # typer >= 0.20 vendors click as typer._click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exc  # type: ignore[no-redef]

__all__ = ["kind_table", "prediction_lines", "trace_app", "trace_lines", "unmapped_table"]

trace_app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                        rich_markup_mode=None,
                        help="Import a torch.profiler trace of a decode step: replay it, map its kernels to ops, "
                             "predict the megakernel of the same ops.")
STEP = typer.Option(None, "--step", help="Which step of the trace, 1 = the first (default: the median by span).")
DEVICE = typer.Option(None, "--device", help="Which GPU's kernels, when the trace holds several.")
UNMAPPED_ROWS = 10  # kernel names listed as unmapped; the rest summed in one line
SPANS_LISTED = 8    # steps whose spans are listed one by one; of more, the shortest and the longest


class _ImportCommand(typer.core.TyperCommand):
    """``trace import``, whose ``--json`` takes a path where other commands' ``--json`` is a flag: a bare
    ``--json`` says what to give."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click_exc.BadOptionUsage as exc:
            if exc.option_name != "--json":
                raise
            raise click_exc.BadOptionUsage("--json", "--json of trace import takes a file to write the JSON to, or '-' "
                                       "for standard output (--json -)", ctx) from None


@trace_app.command("import", cls=_ImportCommand)
def import_cmd(
    path: str = typer.Argument(..., help="Chrome trace (.json or .json.gz) from prof.export_chrome_trace()."),
    model: str | None = typer.Option(None, "--model", "-m", help="Built-in model name or a HF config.json: "
                                                                   "map kernels to its ops and predict."),
    batch: int = typer.Option(1, "--batch", "-b", help="Sequences per step, as traced."),
    kv_len: int = typer.Option(1024, "--kv-len", help="Tokens already in each sequence's KV cache, as traced."),
    gpu: str | None = typer.Option(None, "--gpu", "-g", help="GPU to predict on (default: the trace's, calibrated "
                                                              "where mksim has a calibration)."),
    step: int | None = STEP,
    device: int | None = DEVICE,
    json_out: str | None = typer.Option(None, "--json", help="Write the result as JSON here ('-': stdout)."),
) -> None:
    """Replay a traced step, map its kernels to the model's ops, predict the megakernel on the same GPU."""
    if json_out and json_out != "-":
        check_outputs({"--json": json_out}, [("trace", path)], error=OutputError)
        check_writable(json_out, "--json")
    t = import_trace(path, model=model, batch=batch, kv_len=kv_len, gpu=gpu, device=device, step=step)
    if json_out == "-":
        return emit_json(t.to_dict())
    for line in trace_lines(t)[:3]:
        out.print(line, markup=False)
    out.print(kind_table(t))
    for line in trace_lines(t)[3:]:
        out.print(line, markup=False)
    if t.unmapped():
        out.print(unmapped_table(t))
    for line in prediction_lines(t):
        out.print(line, markup=False)
    if json_out:
        write_output(lambda: Path(json_out).write_text(to_json(t.to_dict()) + "\n"), json_out, "--json")
        out.print(f"written to {json_out}", markup=False)


@trace_app.command("cut")
def cut_cmd(
    path: str = typer.Argument(..., help="Chrome trace (.json or .json.gz)."),
    dest: str = typer.Argument(..., help="Where to write the one step (.json, or .json.gz to gzip)."),
    step: int | None = STEP,
    device: int | None = DEVICE,
) -> None:
    """Write one step of a trace (its kernels, their launches, the metadata) to a small file."""
    check_outputs({"DEST": dest}, [("trace", path)], error=OutputError)
    check_writable(dest, "DEST")
    written: list[int] = []
    write_output(lambda: written.append(cut_trace(path, dest, step=step, device=device)), dest, "DEST")
    n = written[0]
    out.print(f"{n} events written to {dest}", markup=False)


def _rel(path: str) -> str:
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd()) else path
    except (OSError, ValueError):
        return path


def trace_lines(t: TraceImport) -> list[str]:
    """The summary lines: the trace, the step, its time and replay (3), then the mapping and its doubts."""
    if len(t.step_spans_us) <= SPANS_LISTED:
        spans = ", ".join(f"{s:.1f}" for s in t.step_spans_us)
    else:
        ordered = sorted(t.step_spans_us)
        spans = f"from {ordered[0]:.1f} to {ordered[-1]:.1f}"
    if t.step_period_us is not None:
        spans += f" µs, one every {t.step_period_us:.1f}"
    which = "the median" if len(t.step_spans_us) > 1 else "the only one"
    streams = f"{len(t.streams)} stream{'s' if len(t.streams) > 1 else ''}"
    left = f"; {t.left_out} GPU activities outside every step left out" if t.left_out else ""
    lines = [
        f"trace    {t.path}: {t.gpu_name or 'GPU not named'}" + (f" ({t.n_sms} SMs)" if t.n_sms else ""),
        f"step     {t.step_number} of {len(t.step_spans_us)} by {t.steps_by} ({which}; spans {spans} µs): "
        f"{len(t.kernels)} GPU activities on {streams}{left}",
        f"time     step {t.step_us:.1f} µs = kernels {t.busy_us:.1f} µs + gaps {t.gaps_us:.1f} µs "
        f"(median gap {median_gap_us(t):.2f} µs); replay {t.replay_us:.1f} µs ({100 * t.replay_error:+.2f} %)",
    ]
    n_mapped = sum(1 for k in t.kernels if k.kind)
    if t.model:
        missing = len(t.ops_without_kernels)
        miss = (f"; {missing} of the model's ops got no kernel: {', '.join(t.ops_without_kernels[:4])}"
                + (" ..." if missing > 4 else "")) if missing else "; every op got a kernel"
        lines.append(f"mapped   {100 * t.mapped_fraction:.1f} % of the kernel time to {t.model}'s ops "
                     f"({n_mapped} of {len(t.kernels)} activities){miss}")
    else:
        lines.append(f"mapped   {100 * t.mapped_fraction:.1f} % of the kernel time to an op kind by kernel name "
                     f"({n_mapped} of {len(t.kernels)}); give --model to map to ops and predict")
    lines += [f"warning  {w}" for w in t.warnings]
    return lines


def kind_table(t: TraceImport) -> Table:
    """Time by op kind: kernels, their µs, the gaps before them, share of the step; with a prediction,
    the time mksim's one-kernel-per-op graph spends in the same kind's ops."""
    p = t.prediction
    cols = ["kind", "kernels", "kernel µs", "gap µs", "% of step"] + ([f"mksim graph µs ({p.gpu})"] if p else [])
    tab = make_table("the traced step by op kind", cols, left=("kind",))
    for r in t.by_kind():
        mine = [f"{p.graph_by_kind_us[r['kind']]:.1f}" if r["kind"] in p.graph_by_kind_us else ""] if p else []
        tab.add_row(r["kind"], str(r["kernels"]), f"{r['busy_us']:.1f}", f"{r['gaps_us']:.1f}",
                    f"{100 * r['share']:.1f}", *mine)
    return tab


def unmapped_table(t: TraceImport) -> Table:
    """The kernels mapped to no op, by name, largest total first."""
    rows = t.unmapped()
    tab = make_table("unmapped kernels", ["kernel", "count", "µs"], left=("kernel",))
    for r in rows[:UNMAPPED_ROWS]:
        tab.add_row(escape(short_name(r["name"])), str(r["kernels"]), f"{r['busy_us']:.1f}")
    if len(rows) > UNMAPPED_ROWS:
        rest = rows[UNMAPPED_ROWS:]
        tab.add_row(f"{len(rest)} more names", str(sum(r["kernels"] for r in rest)),
                    f"{sum(r['busy_us'] for r in rest):.1f}")
    return tab


def prediction_lines(t: TraceImport) -> list[str]:
    """mksim's megakernel for the same model, batch and KV on the trace's GPU, against the traced step."""
    p = t.prediction
    if p is None:
        return []
    lines = [f"predict  {t.model}, batch {t.batch}, KV {t.kv_len} on {p.gpu} ({_rel(p.hardware_file)}):",
             f"         megakernel {p.megakernel_us:.1f} µs, "
             + (f"{p.speedup:.2f}x faster" if p.speedup >= 1 else f"{1 / p.speedup:.2f}x slower")
             + f" than the traced step {t.step_us:.1f} µs; mksim's own one-kernel-per-op CUDA graph "
               f"{p.graph_us:.1f} µs"]
    if p.graph_node_us is not None:
        lines.append(f"launch   the traced kernels are {median_gap_us(t):.2f} µs apart (median gap); {p.gpu} assumes "
                     f"{p.graph_node_us:.2f} µs between the nodes of a CUDA graph")
    if p.note:
        lines.append(f"note     {p.note}")
    return lines

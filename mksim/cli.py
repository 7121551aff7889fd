"""The ``mksim`` command line: argument handling only; the work is done by the library.

Errors in input (unknown names, bad files, impossible parameters, wrong arguments) print one line, ``error: ...``,
and exit with status 2. ``validate``, ``calibrate`` and ``explore`` belong to other packages (:mod:`validation.cli`,
:mod:`explorer.cli`), ``trace`` to :mod:`mksim.trace_cli`: they are mounted by dotted name and imported only when
invoked, so mksim does not import the packages built on it. The library loads in the command that uses it
(``mksim.tables`` on first use, mksim.__getattr__): ``mksim --help`` loads typer and rich.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

import mksim
from mksim.console import (
    LazyGroup,
    check_output_paths,
    emit_json,
    out,
    parse_ints,
    parse_options,
    run_app,
    say,
    schedule_conflict,
    write_output,
)
from mksim.errors import MksimError, OutputError

if TYPE_CHECKING:  # the library loads on first use (mksim.__getattr__), in the command that needs it
    import mksim.catalog
    import mksim.compare
    import mksim.report
    import mksim.schedule
    import mksim.search
    import mksim.sim
    import mksim.tables
    import mksim.target

app = typer.Typer(cls=LazyGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Simulate GPU megakernels and kernel chains.")


def _print_version(value: bool) -> None:
    if value:  # eager: before click asks for a command
        out.print(f"mksim {mksim.__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print mksim's version and exit.")) -> None:
    """Simulate GPU megakernels and kernel chains."""
hw_app = typer.Typer(no_args_is_help=True, help="Hardware models of GPU generations.")
app.add_typer(hw_app, name="hw")
JSON = typer.Option(False, "--json", help="Print JSON.")
MODEL = typer.Option("llama-3.2-1b", "--model", "-m", help="Built-in model name or a HF config.json.")
GPU = typer.Option("h200", "--gpu", "-g", help="GPU name (mksim hw list) or a .toml path; GPU+PROFILE applies a "
                                                "kernel library's profile (e.g. h200-calibrated+mksim).")
TP = typer.Option(1, "--tp", help="Tensor-parallel GPUs of a node the step is split over (docs/parallel.md).")
EP = typer.Option(1, "--ep", help="Expert-parallel GPUs of a node the experts are split over (docs/parallel.md).")
ROUTING = typer.Option("uniform", "--routing", help="MoE models: which experts tokens pick: uniform, zipf:S (S > 0: "
                                                   "skew) or a .json file of expert counts (docs/moe.md).")
IMPL = typer.Option(None, "--impl", help="Implementation profile to apply to --gpu ({profiles}).")
POLICY = typer.Option(None, "--policy", help="Megakernel placement policy ({policies}).")
DESIGNS = "comma-separated: {designs} (or all)."  # the registered designs (LazyGroup.help_names)
# Options with a list default, made once (a list in a signature's default would be shared anyway)
OPTS = typer.Option([], "--opt", help="Schedule option key=value (repeatable).")
MK_OPTS = typer.Option([], "--opt", help="Schedule option key=value of the megakernel rows (repeatable).")
FIX = typer.Option([], "--fix", help="Fix a schedule option for every candidate, key=value (repeatable), e.g. "
                                     "smem_reserve_KiB=80; recorded in the study.")


# -- hw ------------------------------------------------------------------------------
@hw_app.command("list")
def hw_list(as_json: bool = JSON) -> None:
    """List the GPU models mksim knows (built-in and calibrated)."""
    rows = mksim.catalog.gpu_rows()
    if as_json:
        return emit_json(rows)
    out.print(mksim.catalog.gpu_table(rows))


@hw_app.command("show")
def hw_show(name: str = typer.Argument(..., help="GPU name (mksim hw list) or a .toml path."),
            as_json: bool = JSON) -> None:
    """Show every number of a GPU model with its unit and source."""
    g = mksim.target.Target.parse(name).spec
    if as_json:
        return emit_json(mksim.catalog.gpu_numbers(g))
    out.print(mksim.catalog.gpu_numbers_table(g))
    for line in mksim.catalog.source_lines(g):
        out.print(line)


# -- models and workloads ------------------------------------------------------------
@app.command("models")
def models_cmd(as_json: bool = JSON) -> None:
    """List the built-in models."""
    rows = [dict(mksim.models.get(n).to_dict(), params=mksim.models.get(n).param_count()) for n in mksim.models.names()]
    if as_json:
        return emit_json(rows)
    out.print(mksim.catalog.models_table(rows))


@app.command("workload")
def workload_cmd(
    model: str = typer.Option(..., "--model", "-m", help="Built-in model name or a HF config.json."),
    gpu: str = typer.Option("h200", "--gpu", "-g", help="GPU for the bandwidth floor and tiling."),
    batch: int = typer.Option(1, "--batch", "-b", help="Sequences per step."),
    kv_len: int = typer.Option(1024, "--kv-len", help="Tokens already in each sequence's KV cache."),
    phase: str = typer.Option("decode", "--phase", help="decode or prefill."),
    prefill_tokens: int = typer.Option(0, "--prefill-tokens", help="New tokens per sequence (prefill)."),
    dtype: str = typer.Option("bf16", "--dtype", help="Weight dtype: bf16, fp16 or fp8."),
    tasks_per_sm: float = typer.Option(1.0, "--tasks-per-sm", help="Task granularity: tasks per SM per op."),
    routing: str = ROUTING,
    as_json: bool = JSON,
) -> None:
    """Summarise a workload: bytes, FLOPs, ops, tasks and the bandwidth floor on a GPU."""
    g = mksim.target.Target.parse(gpu).spec
    step = mksim.Step(model, batch, kv_len, phase, prefill_tokens, dtype, routing=routing)
    wl = mksim.compare.make_workload(step, n_sms=g.sm.count)
    mksim.schedule.check_fits(wl, g)
    summary, graph = mksim.tables.workload_summary(wl, g, tasks_per_sm)
    if as_json:
        return emit_json(summary)
    out.print(mksim.tables.workload_table(wl, g, graph))
    out.print(mksim.tables.floor_line(wl, g, summary))


# -- simulation -----------------------------------------------------------------------
@app.command("compare")
def compare_cmd(
    model: str = MODEL,
    gpu: str = GPU,
    batch: int = typer.Option(1, "--batch", "-b"),
    kv_len: int = typer.Option(1024, "--kv-len"),
    phase: str = typer.Option("decode", "--phase"),
    prefill_tokens: int = typer.Option(0, "--prefill-tokens"),
    dtype: str = typer.Option("bf16", "--dtype"),
    policy: str | None = POLICY,
    opt: list[str] = MK_OPTS,
    designs: str | None = typer.Option(None, "--designs", help=f"Add a megakernel row per design, {DESIGNS}"),
    impl: str | None = IMPL,
    stack: str | None = typer.Option(None, "--stack", help="A kernel library's profile ({profiles}): "
                                     "predict its kernels in a CUDA graph, your stack, next to the megakernel."),
    routing: str = ROUTING, tp: int = TP, ep: int = EP,
    as_json: bool = JSON,
) -> None:
    """Every execution mode side by side: latency, tokens/s, HBM utilisation, breakdown."""
    step = mksim.Step(model, batch, kv_len, phase, prefill_tokens, dtype, tp=tp, routing=routing, ep=ep)
    d = mksim.compare.compare(step, mksim.target.Target.parse(gpu, impl), policy=policy, designs=designs,
                              opts=parse_options(opt), stack=stack).to_dict()
    if as_json:
        return emit_json(d)
    out.print(mksim.tables.compare_table(d))
    out.print(mksim.tables.compare_footer(d))


@app.command("simulate")
def simulate_cmd(
    ctx: typer.Context,
    model: str = typer.Option("llama-3.2-1b", "--model", "-m"),
    gpu: str = GPU,
    impl: str | None = IMPL,
    mode: str = typer.Option("megakernel", "--mode"),
    policy: str | None = POLICY,
    batch: int = typer.Option(1, "--batch", "-b"),
    kv_len: int = typer.Option(1024, "--kv-len"),
    phase: str = typer.Option("decode", "--phase"),
    prefill_tokens: int = typer.Option(0, "--prefill-tokens"),
    dtype: str = typer.Option("bf16", "--dtype"),
    opt: list[str] = OPTS,
    schedule: str | None = typer.Option(None, "--schedule", help="Simulate this schedule JSON file."),
    save: str | None = typer.Option(None, "--save", help="Write the schedule as JSON here."),
    trace: str | None = typer.Option(None, "--trace", help="Write a Perfetto (Chrome) trace here."),
    routing: str = ROUTING, tp: int = TP, ep: int = EP,
    as_json: bool = JSON,
) -> None:
    """Simulate one mode (or a schedule file) and show where the time went."""
    check_output_paths({"--save": save, "--trace": trace}, [("schedule", schedule)])
    if schedule:
        schedule_conflict(ctx, schedule, ("save", "trace", "as_json"))
        sched = mksim.schedule.Schedule.from_json(schedule)
    else:
        g = mksim.target.Target.parse(gpu, impl).spec
        step = mksim.Step(model, batch, kv_len, phase, prefill_tokens, dtype, tp=tp, routing=routing, ep=ep)
        wl = mksim.compare.make_workload(step, n_sms=g.sm.count)
        opts = parse_options(opt)
        if "policy" in opts:  # --opt policy=die is --policy die
            if policy and opts["policy"] != policy:
                raise MksimError(f"two policies: --policy {policy} and --opt policy={opts['policy']}; give one")
            policy = opts.pop("policy")
        sched = mksim.schedule.build_schedule(wl, g, mode, policy=policy, **opts)
    if save:
        write_output(lambda: sched.to_json(save), save, "--save")
    res = mksim.sim.simulate(sched)
    if as_json:
        emit_json(res.to_dict())
    else:
        out.print(mksim.tables.simulate_line(res))
        out.print(mksim.tables.breakdown_table(res))
    if trace:  # after the result is out: a failed write loses nothing
        write_output(lambda: res.to_perfetto(trace), trace, "--trace")
        if not as_json:
            say(f"trace written to {trace} (open in https://ui.perfetto.dev)")


@app.command("sweep")
def sweep_cmd(
    model: str = typer.Option("llama-3.2-1b", "--model", "-m"),
    gpu: str = GPU,
    impl: str | None = IMPL,
    batch: str = typer.Option("1,2,4,8,16,32,64", "--batch", "-b", help="Comma-separated batch sizes."),
    kv_len: str = typer.Option("1024", "--kv-len", help="Comma-separated KV lengths."),
    as_json: bool = JSON,
    html: str | None = typer.Option(None, "--html", help="Write a plotly chart here."),
    routing: str = ROUTING, tp: int = TP, ep: int = EP,
) -> None:
    """Each mode's latency and the megakernel's speed-up over graph_pdl as batch (or context) grows."""
    target = mksim.target.Target.parse(gpu, impl)
    gpu = mksim.target.with_impl(gpu, impl)  # as the user named it, for the table's title
    if html:
        check_output_paths({"--html": html}, [("model config", model), ("hardware file", target.hardware)])
    b, kv = parse_ints(batch, "--batch"), parse_ints(kv_len, "--kv-len")
    rows = mksim.report.sweep_rows(model, target, b, kv, routing, tp=tp, ep=ep)
    if as_json:
        emit_json({"model": model, "gpu": gpu, "rows": rows})
    else:
        out.print(mksim.tables.sweep_table(rows, model, gpu))
    if html:  # after the table is out: a failed write (a full disk) loses nothing
        write_output(lambda: mksim.report.sweep_figure_html(rows, model, gpu, html), html, "--html")


# -- search --------------------------------------------------------------------------------
@app.command("search")
def search_cmd(
    model: str = typer.Option("llama-3.2-1b", "--model", "-m"),
    gpu: str = GPU,
    impl: str | None = IMPL,
    batch: int = typer.Option(1, "--batch", "-b"),
    kv_len: int = typer.Option(1024, "--kv-len"),
    trials: int = typer.Option(100, "--trials", help="Finished trials the study should hold (baselines included)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Stop this run after so many seconds."),
    seed: int = typer.Option(0, "--seed", help="Sampler seed, 0 to 2**32 - 1 (worker i of --workers uses seed + i)."),
    storage: str | None = typer.Option(None, "--storage",
                                          help="Optuna RDB URL (default: sqlite:///<study>.db here); a "
                                               "postgresql:// URL lets several machines fill one study; 'memory' "
                                               "keeps nothing."),
    study: str | None = typer.Option(None, "--study", help="Study name (default: from model, GPU, shape)."),
    objective: str = typer.Option("latency", "--objective", help="'latency' or 'latency,smem' (Pareto front)."),
    workers: int = typer.Option(1, "--workers", "-j", help="Worker processes on this machine."),
    out_file: str | None = typer.Option(None, "--out", "-o", help="Write the best schedule (JSON) here."),
    report: str | None = typer.Option(None, "--report", help="Write an HTML report with Optuna's figures."),
    fix: list[str] = FIX,
    designs: str | None = typer.Option(None, "--designs", help=f"Add megakernel designs to the space, {DESIGNS}"),
    routing: str = ROUTING, tp: int = TP, ep: int = EP,
    as_json: bool = JSON,
) -> None:
    """Search megakernel schedules with Optuna; report the best against every baseline."""
    gpu = mksim.target.with_impl(gpu, impl)
    try:
        res = mksim.search.search(model, gpu, batch=batch, kv_len=kv_len, trials=trials, timeout=timeout, seed=seed,
                                  storage=storage, study_name=study, objectives=objective, workers=workers, tp=tp,
                                  out=out_file, report=report, progress=not as_json and sys.stderr.isatty(), ep=ep,
                                  fixed=parse_options(fix, "--fix"), designs=designs, say=_note, routing=routing)
    except OutputError as exc:  # the search finished but a file could not be written: show its result
        if exc.result is not None:
            _show_search(exc.result, as_json, gpu)
        raise
    _show_search(res, as_json, gpu)
    if out_file and not as_json:
        out.print(f"best schedule written to {out_file} (mksim simulate --schedule {out_file})")
    if report and not as_json:
        out.print(f"report written to {report}")


def _note(msg: str) -> None:
    """A line of information on stderr, not an error (stdout stays data for --json)."""
    sys.stderr.write(msg + "\n")


def _show_search(res: mksim.search.SearchResult, as_json: bool, gpu: str) -> None:
    if as_json:
        return emit_json(res.to_dict())
    out.print(mksim.tables.search_table(res))
    for line in [*mksim.tables.search_lines(res), mksim.tables.assumes_line(gpu), *mksim.tables.gpu_absent_lines(gpu)]:
        out.print(line)


# -- entry point ---------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    """Run the CLI; input errors become one line on stderr and exit status 2."""
    run_app(app, argv, "mksim")


if __name__ == "__main__":
    main()

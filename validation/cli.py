"""``mksim validate`` and ``mksim calibrate``: the GPU lab's command lines.

``mksim`` mounts :data:`validate_app` and :data:`calibrate_app` by name and imports this module only
when one of them is invoked (``mksim --help`` lists them by their help's first sentence);
``python -m validation calibrate`` runs :data:`calibrate_app` on its own (:func:`calibrate_main`). Errors
in input print one line and exit with status 2, as every ``mksim`` command.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NoReturn

import typer

import validation.calibrate as cal
import validation.suite as vs
import validation.suite.parts as vr
from hwmodels.files import check_outputs, parse_json, read_bytes
from mksim import models
from mksim.console import emit_json, make_table, out, run_app, say, schedule_conflict
from mksim.errors import MksimError, UnknownNameError
from mksim.schedule import MODES, Schedule
from validation.megakernel.program import check_supported
from validation.suite.schedules import SCHEDULES, search_schedules
from validation.suite.targets import read_stacks

try:  # typer >= 0.20 vendors click as typer._click
    from typer._click.core import ParameterSource
except ImportError:  # pragma: no cover - older typer uses click itself
    from click.core import ParameterSource  # type: ignore[assignment]

__all__ = ["calibrate_app", "calibrate_main", "validate_app"]

calibrate_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
validate_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                           help="Run schedules on this machine's GPU and hold them against their predictions (one "
                                "case, the suite, its report). The lab's other runners: python -m validation --help.")
MEASURED_LIMIT_B = 256 << 20  # a suite's measured.json is a few MB
PRED_GPU = "h200-mk-kernels"  # the hardware model the suite's predictions come from
JSON = typer.Option(False, "--json", help="Print JSON.")
WATCHDOG = typer.Option(60.0, "--watchdog-s", help="A kernel still running after this is an error.")


# -- calibration -------------------------------------------------------------------------
@calibrate_app.command("calibrate")
def calibrate_cmd(
    out_file: str | None = typer.Option(None, "--out", "-o",
                                        help="Overlay to write (default ./<gpu>-calibrated.toml); raw results "
                                             "and plots go beside it."),
    quick: bool = typer.Option(False, "--quick", help="Fewer sizes and repeats (about a minute)."),
    base: str | None = typer.Option(None, "--base", help="Built-in model to extend (default: from the GPU's name)."),
    from_raw: list[str] | None = typer.Option(None, "--from-raw",
                                              help="Fit saved .raw.json results instead of measuring (repeat the "
                                                   "option to merge runs); needs no GPU."),
    results: str | None = typer.Option(None, "--results",
                                       help="Folder for the fits summary and plots (default: beside --out)."),
    mechanisms: str | None = typer.Option(None, "--mechanisms",
                                          help="With --from-raw: a folder of `python -m validation mechanisms run` "
                                               "sweeps; fits the DRAM and boundary mechanisms from it."),
    as_json: bool = typer.Option(False, "--json", help="Print the fitted parameters as JSON."),
) -> None:
    """Measure this GPU with microbenchmarks and write a calibrated hardware model."""
    tell = (lambda _msg: None) if as_json else (lambda msg: out.print(msg))
    if from_raw:
        if not out_file:
            raise MksimError("--from-raw needs --out FILE.toml for the overlay it writes")
        check_outputs({"--out": out_file}, [("raw results file", p) for p in from_raw])  # the folder is made
        ps, spread = cal.finish([Path(p) for p in from_raw], Path(out_file), base=base,
                                results_dir=Path(results) if results else None,
                                mechanisms=Path(mechanisms) if mechanisms else None, say=tell)
    else:
        if mechanisms:
            raise MksimError("--mechanisms needs --from-raw (the sweeps are fitted, not measured, here)")
        ps, spread = cal.calibrate(Path(out_file) if out_file else None, quick=quick, base=base, say=tell)
    if as_json:
        return emit_json({"params": {p.key: {"value": p.value, "spread": p.spread, "note": p.note} for p in ps},
                          "run_to_run": spread})
    t = make_table("calibrated parameters", ("key", "value", "spread", "run-to-run"), left=("key",))
    for p in ps:
        t.add_row(p.key, f"{p.value:g}", f"{p.spread:.1%}", f"{spread[p.key]:.1%}" if p.key in spread else "-")
    out.print(t)


def calibrate_main(argv: list[str]) -> NoReturn:
    """``python -m validation calibrate ...``: :data:`calibrate_app` run on its own; exits."""
    run_app(calibrate_app, argv, "python -m validation calibrate")


# -- validation on the GPU --------------------------------------------------------------------
def _check_out(out_dir: str, resume: bool, force: bool) -> None:
    if (Path(out_dir) / vs.MEASURED).is_file() and not (resume or force):
        raise MksimError(f"{Path(out_dir) / vs.MEASURED} exists; --resume to go on with it or --force to start over")


def case_line(r: dict[str, Any]) -> str:
    """One summary row of a case in words: predicted, measured, error, correctness."""
    def f(v: Any, fmt: str, unit: str = "") -> str:
        return "-" if v is None else f"{format(v, fmt)}{unit}"

    return (f"{r['name']}: predicted {f(r['predicted_us'], '.1f', ' µs')}, measured {f(r['measured_us'], '.1f', ' µs')}"
            f" (p10-p90 {f(r['measured_spread_us'], '.1f', ' µs')}), error {f(r['error_pct'], '+.1f', ' %')}, "
            f"max rel err {f(r['max_rel_err'], '.1e')}"
            + (f", {r['achieved_GBps'] / 1e3:.2f} TB/s ({r['bandwidth_fraction']:.0%} of HBM read)"
               if r.get("achieved_GBps") else "") + (" [WRONG OUTPUT]" if r.get("correct") is False else ""))


def _dry_row(case: vs.Case, gpu: str) -> dict[str, Any]:
    """One case of a dry run: its prediction, or why it is refused (a plain dict: it crosses processes)."""
    row: dict[str, Any] = {"name": case.name, "predicted_us": None, "error": None}
    try:
        sched = vs.build(case, gpu)
        o = sched.options
        row.update(predicted_us=vs.predicted_us(sched), smem_reserve_KiB=o.smem_reserve_KiB,
                   prefetch=f"{o.prefetch_depth}x{o.page_KiB:g} KiB", policy=sched.policy)
    except vs.Refused as exc:
        row["refused"] = str(exc)
    except MksimError as exc:
        row["error"] = str(exc)
    return row


def _quiet_worker() -> None:
    """A dry run's worker leaves Ctrl-C to its parent, which stops them all and says so in one line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _dry_rows(cases: list[vs.Case], gpu: str) -> list[dict[str, Any]]:
    """Every case's dry-run row, in the cases' order: on every core (forked workers, each building and
    simulating whole cases), or in this process where there is one core, one case or no ``fork``."""
    workers = min(len(cases), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else
                  (os.cpu_count() or 1))
    if workers < 2 or "fork" not in mp.get_all_start_methods():
        return [_dry_row(c, gpu) for c in cases]
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"), initializer=_quiet_worker) as pool:
        try:
            return list(pool.map(_dry_row, cases, [gpu] * len(cases)))
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _dry_run(cases: list[vs.Case], gpu: str, as_json: bool) -> None:
    """Build and predict every case, on the CPU: what a GPU run would run."""
    rows = _dry_rows(cases, gpu)
    if as_json:
        return emit_json(rows)
    t = make_table(f"validation cases (dry run: predictions by {gpu}, nothing measured)",
                   ("case", "predicted µs", "reserve KiB", "pages", "policy"), left=("case", "policy"))
    for r in rows:
        if r.get("refused"):
            t.add_row(r["name"], "-", "-", "-", f"refused: {r['refused']}")
        elif r["error"]:
            t.add_row(r["name"], "-", "-", "-", f"error: {r['error']}")
        else:
            t.add_row(r["name"], f"{r['predicted_us']:.1f}", f"{r['smem_reserve_KiB']:g}", r["prefetch"],
                      r["policy"] or "-")
    out.print(t)


@validate_app.callback(invoke_without_command=True)
def validate_cmd(
    ctx: typer.Context,
    schedule: str | None = typer.Option(None, "--schedule", help="Run this schedule JSON file."),
    model: str | None = typer.Option(None, "--model", "-m", help="Built-in model (with --mode)."),
    mode: str | None = typer.Option(None, "--mode", help="stream, graph, graph_pdl, persistent_barrier, megakernel."),
    batch: int = typer.Option(1, "--batch", "-b"),
    kv_len: int = typer.Option(1024, "--kv-len"),
    policy: str | None = typer.Option(None, "--policy", help="Megakernel placement policy."),
    out_dir: str | None = typer.Option(None, "--out", help="Write measured.json, summary.json, sources here."),
    reps: int = typer.Option(20, "--reps", help="Timed runs (median and p10-p90 reported)."),
    watchdog_s: float = WATCHDOG,
    gpu: str = typer.Option(PRED_GPU, "--gpu", help="Hardware model the prediction comes from."),
    force: bool = typer.Option(False, "--force", help="Overwrite the measured.json in --out."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Build and predict only (no GPU)."),
    as_json: bool = JSON,
) -> None:
    """Run one schedule on this machine's GPU: its output checked against torch, its time against
    the prediction. Subcommands: suite, parts, merge, report, schedules."""
    if ctx.invoked_subcommand is not None:
        given = [p.opts[0] for p in ctx.command.params
                 if ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]
        if given:
            raise MksimError(f"{given[0]} goes after the subcommand: mksim validate {ctx.invoked_subcommand} "
                             f"{given[0]} ...")
        return
    if schedule and (model or mode or policy):
        raise MksimError("give --schedule FILE, or --model NAME --mode MODE, not both")
    if schedule:  # the schedule fixes its workload; --gpu stays: the model the prediction comes from
        schedule_conflict(ctx, schedule, ("gpu", "out_dir", "reps", "watchdog_s", "force", "dry_run", "as_json"))
    if dry_run and out_dir:  # the command as it will run, previewed: say what --out does not get
        typer.echo(f"warning: --dry-run measures nothing and writes nothing: {out_dir} stays as it is", err=True)
    if schedule:
        s = Schedule.from_json(schedule)
        name = s.workload_spec["model"] if isinstance(s.workload_spec["model"], str) else "custom"
        case = vs.Case(name, s.workload.batch, s.mode, Path(schedule).stem, s.workload.kv_len, schedule_file=schedule)
    elif model and mode:
        if mode not in MODES:
            raise UnknownNameError("mode", mode, MODES)
        models.get(model)
        case = vs.Case(model, batch, mode, policy or "default", kv_len, policy=policy)
    else:
        raise MksimError("give --schedule FILE, or --model NAME and --mode MODE (or a subcommand: suite, parts, "
                         "merge, report, schedules)")
    sched = vs.build(case, gpu)  # a schedule that cannot be built: one line, before any GPU work
    if not dry_run:  # ... nor one the generated kernels would run as another design
        check_supported(sched)
    if dry_run:
        return _dry_run([case], gpu, as_json)
    if out_dir:
        _check_out(out_dir, False, force)
        vs.run_suite([case], out_dir, reps=reps, watchdog_s=watchdog_s, gpu=gpu)
        row = vs.write_summary(out_dir, gpu)["summary"]["cases"][0]
    else:
        rec = vs.run_case(case, vs.real_measure(), reps=reps, watchdog_s=watchdog_s, gpu=gpu)
        row = vs.summarize({"cases": [rec]}, gpu)["cases"][0]
    if row["error"]:
        raise MksimError(f"{case.name}: {row['error']}")
    if as_json:
        return emit_json(row)
    say(case_line(row))


@validate_app.command("suite")
def validate_suite_cmd(
    out_dir: str | None = typer.Option(None, "--out", help="Results folder (default validation/results/h200)."),
    only: list[str] = typer.Option([], "--only", help="Run the cases whose name contains this (repeatable)."),
    part: str | None = typer.Option(None, "--part", help="K/N: run part K of N (see: mksim validate parts); merge "
                                                         "the parts with: mksim validate merge."),
    reps: int = typer.Option(20, "--reps", help="Timed runs per case."),
    watchdog_s: float = WATCHDOG,
    timeout_s: float | None = typer.Option(None, "--timeout-s", help="Begin no case after this many seconds (those "
                                                                     "left: --resume)."),
    traces: bool = typer.Option(False, "--traces", help="Keep each persistent case's raw per-task stamps in "
                                                        "OUT/traces/."),
    gpu: str = typer.Option(PRED_GPU, "--gpu", help="Hardware model the predictions come from."),
    resume: bool = typer.Option(False, "--resume", help="Keep the cases an earlier run in --out measured."),
    force: bool = typer.Option(False, "--force", help="Start over, replacing measured.json in --out."),
    no_report: bool = typer.Option(False, "--no-report", help="Only measure (the report: mksim validate report)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the cases with their predictions (no GPU)."),
    as_json: bool = JSON,
) -> None:
    """Run the standard suite (or a part of it) in one process, then write summary.json, plots and a
    markdown table."""
    cases = vr.select_part(vs.select(vs.CASES, only), part)
    if dry_run:
        return _dry_run(cases, gpu, as_json)
    out_dir = out_dir or str(vs.RESULTS)
    _check_out(out_dir, resume, force)
    vs.run_suite(cases, out_dir, reps=reps, watchdog_s=watchdog_s, gpu=gpu, resume=resume, timeout_s=timeout_s,
                 traces=traces, say=(lambda _m: None) if as_json else say)
    if not no_report:
        _report(out_dir, gpu, None, None, as_json)


@validate_app.command("parts")
def validate_parts_cmd(
    parts: int | None = typer.Option(None, "--parts", help="This many parts (default: the fewest whose estimates "
                                                            "fit --budget-s)."),
    budget_s: float = typer.Option(vr.BUDGET_S, "--budget-s", help="Seconds a part may take, by the estimates."),
    only: list[str] = typer.Option([], "--only", help="Cases whose name contains this (repeatable)."),
) -> None:
    """The suite's parts for device calls of limited time: cases and seconds, estimated from the last run."""
    cases = vs.select(vs.CASES, only)
    for line in vr.plan_lines(cases, parts or vr.parts_needed(cases, budget_s)):
        say(line)


@validate_app.command("merge")
def validate_merge_cmd(
    sources: list[str] = typer.Argument(..., help="measured.json files, or folders holding one (parts of a run)."),
    out_dir: str = typer.Option(..., "--out", help="Folder for the merged measured.json."),
) -> None:
    """Merge the measured.json of several runs (the suite's parts) into one, case by case."""
    doc = vr.merge([Path(s) for s in sources], out_dir)
    say(f"{len(doc['cases'])} cases from {len(sources)} runs -> {Path(out_dir) / vs.MEASURED}"
        + (f"; not begun: {', '.join(doc['not_begun'])}" if doc["not_begun"] else ""))


def _report(measured_dir: str, gpu: str, out_dir: str | None, docs: str | None, as_json: bool,
            stacks: str | None = None) -> None:
    res = vs.write_summary(measured_dir, gpu, out_dir, read_stacks(stacks) if stacks else None)
    changed = vs.splice_docs(docs, vs.markdown_table(res["summary"])) if docs else False
    if as_json:
        return emit_json(res["summary"])
    sys.stdout.write(vs.markdown_table(res["summary"]))
    say("wrote " + ", ".join(str(p) for p in res["files"])
        + (f"; table put in {docs}" if changed else (f"; {docs} already current" if docs else "")))


@validate_app.command("report")
def validate_report_cmd(
    measured_dir: str = typer.Argument(..., help="Folder with the measured.json of a run."),
    gpu: str = typer.Option(PRED_GPU, "--gpu", help="Hardware model the predictions come from."),
    out_dir: str | None = typer.Option(None, "--out", help="Where summary.json, plots, table.md go (default: "
                                                           "the folder)."),
    docs: str | None = typer.Option(None, "--docs", help="Also put the table in this page, between its markers."),
    stacks: str | None = typer.Option(None, "--stacks", help="A validation.stacks run folder of the same machine "
                                                             "(step-*.json): the target against torch.compile."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Predict again (CPU only) and rebuild summary.json, plots and the markdown table of a run."""
    measured = Path(measured_dir) / vs.MEASURED if Path(measured_dir).is_dir() else Path(measured_dir)
    if measured.exists():  # read the careful way first: a FIFO, a huge or deeply nested file is one line
        parse_json(read_bytes(measured, limit=MEASURED_LIMIT_B), f"{measured}: cannot read measured results")
    _report(measured_dir, gpu, out_dir, docs, as_json, stacks)


@validate_app.command("schedules")
def validate_schedules_cmd(
    only: list[str] = typer.Option([], "--only", help="Models and batches whose name (llama-3.2-1b/b1) contains "
                                                      "this (repeatable)."),
    trials: int = typer.Option(200, "--trials"),
    seed: int = typer.Option(0, "--seed"),
    storage: str = typer.Option("memory", "--storage", help="Optuna storage URL; 'memory' keeps nothing."),
    workers: int = typer.Option(1, "--workers", "-j"),
    out_dir: str | None = typer.Option(None, "--out", help="Folder (default validation/schedules)."),
    gpu: str = typer.Option(PRED_GPU, "--gpu"),
) -> None:
    """Search the suite's megakernel schedules with the kernel's options fixed, and store them."""
    search_schedules(only, trials=trials, seed=seed, storage=storage, workers=workers, out_dir=out_dir or SCHEDULES,
                     gpu=gpu, say=say)

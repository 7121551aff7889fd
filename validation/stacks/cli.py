"""Command line: measure the stacks users run (torch_graph, inductor_graph) on a GPU.

    python3 -m validation stacks run --out DIR --timeout S [--quick] [--models M,...]
        [--stacks torch_graph,inductor_graph,hf,hf_compiled] [--batches 1,8] [--kv 1024,4096] [--ops-models M,...]
    python3 -m validation stacks table DIR
    python -m validation stacks profile DIR --stack torch_graph|inductor_graph --out PROFILE.toml
    python -m validation stacks predict DIR --json SUMMARY.json [--docs docs/stacks.md]
    python -m validation stacks answer [--json ANSWER.json] [--docs docs/stacks.md]   (answer.py)
    python -m validation stacks records [--check]   (the profiles' [validation] tables: records.py)

``profile`` fits a stack's implementation profile to DIR's single-op files (``fit.py``); ``predict``
holds mksim's predictions with the profiles against DIR's whole steps (``predict.py``). Both run
here, with mksim; ``run`` runs on the device.

Without --models/--batches/--kv the full plan runs (``runner.FULL_PLAN``: five models at batch 1, 8
and kv 1024 in priority order, kv 4096 and single-op profiles for llama-3.2-1b and llama-3.1-8b, the
8b's kv 4096 last); --quick is llama-3.2-1b,
batch 1, kv 1024, both stacks with their single-op profiles. `run` needs torch and numpy on the device
(mksim and hwmodels load too, light: numpy and the standard library).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hwmodels.errors import InputError
from validation.stacks import answer, fit, predict, records, runner

CONFIGS = Path(__file__).resolve().parents[2] / "mksim" / "models" / "configs"


class ArgError(Exception):
    pass


def models_known() -> list[str]:
    return sorted(p.stem for p in CONFIGS.glob("*.json"))


def int_list(text: str, what: str) -> list[int]:
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ArgError(f"--{what} takes comma-separated positive integers, got {text!r}") from None
    if not xs or any(x < 1 for x in xs):
        raise ArgError(f"--{what} takes comma-separated positive integers, got {text!r}")
    return xs


def name_list(text: str, known: list[str] | tuple[str, ...], what: str) -> list[str]:
    xs = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in xs if x not in known]
    if bad or not xs:
        raise ArgError(f"unknown {what} {bad[0] if bad else text!r}; expected some of {', '.join(known)}")
    return xs


def build_plan(args: argparse.Namespace) -> list[runner.ModelPlan]:
    """The models and cases to run, from the options (the quick or full plan when none is given)."""
    known = models_known()
    base = runner.QUICK_PLAN if args.quick else runner.FULL_PLAN
    models = name_list(args.models, known, "model") if args.models else [p.model for p in base]
    ops_models = None
    if args.ops_models is not None:
        ops_models = name_list(args.ops_models, known, "model") if args.ops_models.strip() else []
    if args.batches is None and args.kv is None and not args.models:
        return [runner.ModelPlan(p.model, p.cases, p.ops if ops_models is None else p.model in ops_models)
                for p in base]
    by_model = {p.model: p for p in reversed(runner.FULL_PLAN)}
    batches = int_list(args.batches, "batches") if args.batches else [1, 8]
    kvs = int_list(args.kv, "kv") if args.kv else [1024]
    plan = []
    for m in models:
        ops = (m in ops_models) if ops_models is not None else (by_model[m].ops if m in by_model else False)
        plan.append(runner.ModelPlan(m, tuple((b, k) for k in kvs for b in batches), ops))
    return plan


def parse_cases(text: str) -> list[tuple[int, int]]:
    cases = []
    for part in text.split(";"):
        b, k = int_list(part, "cases")
        cases.append((b, k))
    return cases


def offline(args: argparse.Namespace) -> int:
    """``profile`` and ``predict``: mksim on this machine (light: numpy; the simulator loads when used)."""
    try:
        if args.cmd == "profile":
            f = fit.fit_profile(args.dir, args.stack, args.gpu)
            args.out.write_text(fit.to_toml(f, args.dir, args.gpu))
            print(f"wrote {args.out}: {', '.join(f.tables)} from {len(f.files)} files")
            return 0
        summary = predict.summarise(args.dir, args.gpu, args.hf)
    except (fit.FitError, InputError) as e:
        raise ArgError(str(e)) from None
    print(predict.table(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.docs:
        predict.update_docs(args.docs, summary)
        print(f"updated {args.docs}")
    return 0


def offline_answer(args: argparse.Namespace) -> int:
    """``answer`` and ``records``: mksim on this machine, from committed files."""
    if args.cmd == "records":
        changed = records.write(check=args.check)
        verb = "out of date" if args.check else "rewrote"
        print(f"{verb}: {', '.join(changed)}" if changed else "every profile's validation record is current")
        return 1 if args.check and changed else 0
    for path in (args.json, args.docs):
        if path is not None and not path.parent.is_dir():
            raise ArgError(f"{path}: no such folder")
    if args.docs is not None and not args.docs.is_file():
        raise ArgError(f"{args.docs}: no such file")
    try:
        if args.docs is not None:
            answer.check_markers(args.docs)   # before minutes of simulation
        a = answer.answer()
    except InputError as e:
        raise ArgError(str(e)) from None
    print(answer.tables(a))
    if args.json:
        args.json.write_text(answer.to_json(a))
        print(f"wrote {args.json}")
    if args.docs:
        answer.update_docs(args.docs, a)
        print(f"updated {args.docs}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation stacks", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure the stacks on a GPU (needs torch with CUDA)")
    r.add_argument("--out", required=True, type=Path)
    r.add_argument("--timeout", type=float, help="seconds for the whole run, compiles included (default 480; 60 "
                   "with --quick)")
    r.add_argument("--quick", action="store_true", help="llama-3.2-1b, batch 1, kv 1024 only")
    r.add_argument("--models", help="comma-separated model config names")
    r.add_argument("--stacks", default=",".join(runner.STACKS),
                   help=f"some of {', '.join(runner.ALL_STACKS)} (hf, hf_compiled: transformers' models)")
    r.add_argument("--batches", help="comma-separated batch sizes (default 1,8)")
    r.add_argument("--kv", help="comma-separated cached lengths (default 1024)")
    r.add_argument("--ops-models", help="models that get single-op profiles ('' for none)")
    r.add_argument("--replays", type=int, default=50, help="timed graph replays per case (>= 20)")
    r.add_argument("--reps", type=int, default=5, help="profiled cold runs per single op")
    r.add_argument("--trace", action="store_true", help="Chrome traces of the first model's first case")
    t = sub.add_parser("table", help="print the step results saved in a folder")
    t.add_argument("dir", type=Path)
    pf = sub.add_parser("profile", help="fit a stack's implementation profile to a run's single-op files")
    pf.add_argument("dir", type=Path)
    pf.add_argument("--stack", required=True, choices=runner.STACKS)
    pf.add_argument("--out", required=True, type=Path)
    pf.add_argument("--gpu", default="h200-calibrated", help="the hardware file the ops ran on")
    pr = sub.add_parser("predict", help="predict a run's whole steps with the stacks' profiles")
    pr.add_argument("dir", type=Path)
    pr.add_argument("--json", type=Path, help="write the summary here")
    pr.add_argument("--docs", type=Path, help="rewrite the generated tables of this page (docs/stacks.md)")
    pr.add_argument("--gpu", default="h200-calibrated")
    pr.add_argument("--hf", type=Path, help="a folder of the transformers stacks' steps (hf, hf_compiled) too")
    an = sub.add_parser("answer", help="predict the megakernel's speed-up over the stacks (five models, three GPUs)")
    an.add_argument("--json", type=Path, help="write the predictions here")
    an.add_argument("--docs", type=Path, help="rewrite the answer table of this page (docs/stacks.md)")
    rc = sub.add_parser("records", help="write each profile's [validation] table from the committed summaries")
    rc.add_argument("--check", action="store_true", help="only say whether they are current (exit 1 if not)")
    w = sub.add_parser("worker", help=argparse.SUPPRESS)
    w.add_argument("--model", required=True)
    w.add_argument("--out", required=True, type=Path)
    w.add_argument("--stacks", required=True)
    w.add_argument("--cases", required=True)
    w.add_argument("--ops", action="store_true")
    w.add_argument("--replays", type=int, default=50)
    w.add_argument("--reps", type=int, default=5)
    w.add_argument("--deadline", type=float, default=float("inf"))
    w.add_argument("--trace", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "table":
            if not args.dir.is_dir():
                raise ArgError(f"{args.dir} is not a folder")
            print(runner.table(args.dir))
            return 0
        if args.cmd in ("answer", "records"):
            return offline_answer(args)
        if args.cmd in ("profile", "predict"):
            if not args.dir.is_dir():
                raise ArgError(f"{args.dir} is not a folder")
            return offline(args)
        stacks = name_list(args.stacks, runner.ALL_STACKS, "stack")
        if args.replays < 20:
            raise ArgError(f"--replays must be >= 20, got {args.replays}")
        if args.reps < 1:
            raise ArgError(f"--reps must be >= 1, got {args.reps}")
        if args.cmd == "worker" and set(stacks) <= set(runner.HF_STACKS):
            from validation.stacks import hf
            return hf.worker(args.model, parse_cases(args.cases), stacks, args.out, args.replays, args.deadline)
        if args.cmd == "worker":
            return runner.worker(args.model, parse_cases(args.cases), stacks, args.ops, args.out, args.replays,
                                 args.reps, args.deadline, args.trace)
        if args.timeout is None:
            args.timeout = 60.0 if args.quick else 480.0
        if args.timeout <= 0:
            raise ArgError(f"--timeout must be positive, got {args.timeout}")
        plan = build_plan(args)
        if args.out.exists() and not args.out.is_dir():
            raise ArgError(f"--out {args.out} exists and is not a folder")
    except ArgError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import torch
    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible to torch; run this on the device machine", file=sys.stderr)
        return 2
    t0 = time.time()
    print(f"plan: {[(p.model, list(p.cases), p.ops) for p in plan]}, stacks {stacks}", flush=True)
    runner.run(plan, stacks, args.out, args.timeout, args.replays, args.reps, args.trace)
    print(runner.table(args.out))
    print(f"total {time.time() - t0:.0f} s", flush=True)
    return 0


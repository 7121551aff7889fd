"""What the command lines print and how they read options: shared by ``mksim``, ``mksim validate`` and
``mksim explore`` (library code stays silent; these helpers do the talking).

>>> si(2.47e9, "B")
'2.47 GB'
>>> parse_options(["page_KiB=32", "policy=rr", "dies=true"])
{'page_KiB': 32, 'policy': 'rr', 'dies': True}
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

import mksim
from hwmodels.files import check_outputs
from mksim.errors import MksimError, OutputError, check_writable

try:  # typer >= 0.20 vendors click as typer._click
    from typer._click.core import Command, Context, ParameterSource
except ImportError:  # pragma: no cover - older typer uses click itself
    from click.core import Command, Context, ParameterSource  # type: ignore[assignment]


class LazyGroup(TyperGroup):
    """A command group whose commands in :attr:`lazy` are imported from ``"module:attr"`` (a Typer app
    or a click command) only when invoked (click's lazy group); the group's help lists them by the
    first sentence of their help, without importing them.

    The options' help may name what mksim's registries hold (``{policies}``, :attr:`help_names`): the
    names are filled in when a command is invoked (``mksim compare --help`` included), so that listing
    the commands (``mksim --help``) loads no registry, and with them numpy and the models."""

    #: ``mksim``'s commands that belong to other packages (mksim.cli mounts them by dotted name), with the
    #: first sentence of their help (``mksim --help`` lists it; tests/mksim/test_startup.py holds it to the
    #: command's own)
    lazy: dict[str, tuple[str, str]] = {
        "calibrate": ("validation.cli:calibrate_app",
                      "Measure this GPU with microbenchmarks and write a calibrated hardware model."),
        "validate": ("validation.cli:validate_app", "Run schedules on this machine's GPU and hold them against "
                     "their predictions (one case, the suite, its report)."),
        "explore": ("explorer.cli:app", "Start the web explorer (Compare, Timeline, Search, Validation, Hardware) "
                    "at http://HOST:PORT/."),
        "trace": ("mksim.trace_cli:trace_app", "Import a torch.profiler trace of a decode step: replay it, map its "
                  "kernels to ops, predict the megakernel of the same ops."),
    }

    #: The order ``mksim --help`` lists the commands in (names not here come last).
    order: tuple[str, ...] = ("models", "workload", "compare", "simulate", "sweep", "search", "calibrate", "explore",
                              "trace", "hw", "validate")

    #: ``{name}`` in an option's help: the registered names it stands for, comma-separated
    help_names: dict[str, Callable[[], Iterable[str]]] = {
        "profiles": lambda: mksim.target.PROFILES,
        "policies": lambda: mksim.schedule.POLICIES,
        "designs": lambda: mksim.schedule.design_names(),
    }

    def list_commands(self, ctx: Context) -> list[str]:
        names = [*super().list_commands(ctx), *(n for n in self.lazy if n not in self.commands)]
        return sorted(names, key=lambda n: self.order.index(n) if n in self.order else len(self.order))

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:  # listed, not invoked (resolve_command)
            return TyperCommand(cmd_name, help=self.lazy[cmd_name][1])
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: Context, args: list[str]) -> tuple[str | None, Command | None, list[str]]:
        if args and args[0] in self.lazy and args[0] not in self.commands:
            module, attr = self.lazy[args[0]][0].split(":")
            obj = getattr(importlib.import_module(module), attr)
            cmd = typer.main.get_command(obj) if isinstance(obj, typer.Typer) else obj
            cmd.name = args[0]
            self.add_command(cmd, args[0])
        name, cmd, rest = super().resolve_command(ctx, args)
        for param in cmd.params if cmd is not None else ():
            text = getattr(param, "help", None)
            for key, names in self.help_names.items():
                if text and f"{{{key}}}" in text:
                    text = param.help = text.replace(f"{{{key}}}", ", ".join(names()))  # type: ignore[attr-defined]
        return name, cmd, rest


def check_output_paths(outputs: dict[str, str | None], inputs: Iterable[tuple[str, str | None]] = ()) -> None:
    """Before any work: no output is an input or another output (:func:`hwmodels.files.check_outputs`), and
    each can be written (:func:`mksim.errors.check_writable`). An input that names no file (a built-in
    model or GPU) is none of the outputs."""
    check_outputs(outputs, [(what, p) for what, p in inputs if p and _is_file(p)])
    for flag, path in outputs.items():
        if path and path != "-":
            check_writable(path, flag)


def _is_file(path: str) -> bool:
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):
        return False


def given_flags(ctx: Context, skip: tuple[str, ...] = ()) -> list[str]:
    """The options of ``ctx``'s command that were given on the command line (not left at their
    default), each as its long flag, except the parameters named in ``skip``."""
    return [p.opts[0] for p in ctx.command.params
            if p.name not in skip and p.opts and ctx.get_parameter_source(p.name or "") == ParameterSource.COMMANDLINE]


def schedule_conflict(ctx: Context, schedule: str, skip: tuple[str, ...]) -> None:
    """Refuse a flag that a schedule file fixes (the model, batch, GPU, mode and options): it would be
    ignored without a word."""
    given = given_flags(ctx, ("schedule", *skip))
    if given:
        raise MksimError(f"--schedule {schedule} fixes the model, batch, GPU, mode and options; {', '.join(given)} "
                         "would be ignored. Drop them, or build a new schedule from the flags without --schedule")


try:  # typer >= 0.20 vendors click as typer._click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exc  # type: ignore[no-redef]

__all__ = ["emit_json", "make_table", "out", "parse_ints", "parse_options", "run_app", "say", "si", "to_json"]

class _Console(Console):
    """Rich's console, except that a closed pipe (``mksim hw show h200 | head -2``) ends the command
    quietly with status 0 (:func:`run_app`) instead of rich's exit status 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


#: The terminal. Wide enough that tables do not wrap when printed to a pipe or a log file.
out = _Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit does not hit the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout replaced (tests) or already closed
        pass


def _json_default(o: Any) -> Any:
    np = sys.modules.get("numpy")  # a numpy scalar exists only where numpy is loaded: it is not loaded for one
    if np is not None and isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def to_json(obj: Any) -> str:
    """``obj`` as the indented JSON the ``--json`` options print (numpy scalars as numbers)."""
    return json.dumps(obj, indent=2, default=_json_default)


def emit_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (``--json``)."""
    sys.stdout.write(to_json(obj) + "\n")


def say(msg: str) -> None:
    """Print a progress line at once (no rich markup: paths and names may hold brackets)."""
    out.print(msg, markup=False)
    sys.stdout.flush()


def make_table(title: str, columns: list[str] | tuple[str, ...], left: tuple[str, ...] = ()) -> Table:
    """A table with ``columns``, numbers right-aligned except the columns of ``left``."""
    t = Table(title=title)
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right")
    return t


def si(x: float, unit: str = "", digits: int = 3) -> str:
    """``si(2.47e9, "B") == "2.47 GB"``: a number with an SI prefix."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.{digits}g} {prefix}{unit}"
    return f"{x:.{digits}g} {unit}".rstrip()


def parse_options(items: list[str], flag: str = "--opt") -> dict[str, Any]:
    """``key=value`` pairs (``--opt``, ``--fix``) as schedule options: numbers and true/false parsed."""
    opts: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise MksimError(f"{flag} takes key=value, got {item!r}")
        k, v = item.split("=", 1)
        for cast in (int, float):
            try:
                opts[k] = cast(v)
                break
            except ValueError:
                continue
        else:
            opts[k] = {"true": True, "false": False}.get(v.lower(), v)
    return opts


def parse_ints(text: str, flag: str) -> list[int]:
    """Comma-separated integers (``--batch 1,2,4``); at least one."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MksimError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not vals:
        raise MksimError(f"{flag} needs at least one value")
    return vals


#: each app's click command, built once per process (typer reads every command's signature to build it,
#: ~8 ms: a process that runs commands in turn, a test or the explorer, builds it once)
_COMMANDS: dict[typer.Typer, Any] = {}


def run_app(app: typer.Typer, argv: list[str] | None, prog_name: str) -> NoReturn:
    """Run a command-line app and exit; input errors become one line on stderr (``error: ...``) and exit
    status 2, without a traceback."""
    cmd = _COMMANDS.get(app)
    if cmd is None:
        cmd = _COMMANDS[app] = typer.main.get_command(app)
    try:
        rv = cmd.main(args=argv, prog_name=prog_name, standalone_mode=False)
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
    except MksimError as exc:
        _fail(str(exc), getattr(exc, "exit_code", 2))
    except click_exc.NoArgsIsHelpError as exc:  # help printed by click
        sys.stdout.write((exc.ctx.get_help() if exc.ctx else "") + "\n")
        sys.exit(0)
    except click_exc.UsageError as exc:
        hint = f"; see '{exc.ctx.command_path} --help'" if exc.ctx else ""
        _fail(exc.format_message().replace("\n", " ") + hint)
    except click_exc.ClickException as exc:
        _fail(exc.format_message().replace("\n", " "))
    except BrokenPipeError:  # output piped into `head`: not an error
        _stdout_to_devnull()
        sys.exit(0)
    except KeyboardInterrupt:  # Ctrl-C outside a command (typer handles one inside)
        _fail("interrupted", 130)
    if rv == 130:  # typer turns Ctrl-C in a command into exit status 130, silently
        _fail("interrupted", 130)
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(msg: str, code: int = 2) -> NoReturn:
    sys.stderr.write(f"error: {msg}\n")
    sys.exit(code)


def write_output(write: Callable[[], object], path: str, flag: str) -> None:
    """Run ``write`` (which writes ``path``); an OS error becomes one line naming ``flag`` — a write that
    :func:`mksim.errors.check_writable` let through can still fail (a full disk, a pseudo file system)."""
    try:
        write()
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot write ({exc.strerror or exc}); choose another path") from None

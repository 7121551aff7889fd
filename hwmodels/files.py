"""Files a user names, read the careful way: regular files only, bounded, parsed without a crash.

Every reader of a user's file (a hardware file, a Hugging Face config, a schedule, a trace, raw
calibration results, measured validation results) goes through here, so that each odd path gets
the same one-line answer: a folder, a FIFO or a device is refused before it is opened (a FIFO
without a writer would block for ever), a name too long for the file system is said to be, a link
loop is called a link loop, and JSON nested deeper than a config ever is says so instead of
raising ``RecursionError``. Outputs are checked against the inputs of the same command
(:func:`check_outputs`): no command writes over a file it reads, or writes two results to one file.

It sits in the lowest layer (hwmodels) because the hardware loader needs it and hwmodels imports
nothing of mksim; the errors are the caller's class (any :class:`InputError`).

>>> input_file("/dev/null", "x")
Traceback (most recent call last):
...
hwmodels.errors.InputError: x /dev/null: a character device, not a regular file; save it to a file and give that file
>>> parse_json("[" * 100_000, "x")
Traceback (most recent call last):
...
hwmodels.errors.InputError: x: JSON nested more than 1000 levels deep; this is not a file mksim wrote or reads
"""

from __future__ import annotations

import errno
import json
import os
import select
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hwmodels.errors import InputError

__all__ = ["MAX_DEPTH", "PIPE_TIMEOUT_S", "check_outputs", "input_file", "is_pipe_name", "names_a_file", "parse_json",
           "read_bytes", "same_file", "size_text"]

#: JSON deeper than this is refused (Python's decoder raises RecursionError near 1000 levels).
MAX_DEPTH = 1000

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _label(what: str, path: str | Path) -> str:
    shown = str(path)
    if len(shown) > 120:
        shown = shown[:60] + "…"
    return f"{what} {shown}".strip()


def input_file(path: str | Path, what: str = "", *, error: type[InputError] = InputError,
               missing: str = "no such file") -> Path:
    """``path`` as a :class:`Path` if it names a regular file (links followed), else ``error`` in one
    line saying what the path is instead. ``what`` prefixes the message (``"trace"``, ``"--model"``);
    ``missing`` is the message for a path that does not exist (the caller's hint may follow it).

    Nothing is opened: a FIFO is refused here, before a read could block on it."""
    label = _label(what, path)
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise error(f"{label}: the name is too long for a file name ({len(str(path))} characters)") from None
        if exc.errno == errno.ELOOP:
            raise error(f"{label}: a loop of symbolic links; point it at a real file") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise error(f"{label}: cannot read it (permission denied)") from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise error(f"{label}: {missing}") from None
        raise error(f"{label}: cannot read it ({exc.strerror})") from None
    except ValueError:  # an embedded NUL byte
        raise error(f"{label}: not a file name (it holds a NUL character)") from None
    for test, kind in _KINDS:
        if test(st.st_mode):
            fix = "give a file in it" if kind == "a folder" else "save it to a file and give that file"
            raise error(f"{label}: {kind}, not a regular file; {fix}")
    return Path(path)


def is_pipe_name(path: str | Path) -> bool:
    """Whether ``path`` names a shell's process substitution (``<(cat config.json)`` is ``/dev/fd/63``):
    a pipe that has a writer, read with a size and time limit, where any other FIFO is refused.

    >>> is_pipe_name("/dev/fd/63"), is_pipe_name("/proc/self/fd/3"), is_pipe_name("fifo.json")
    (True, True, False)
    """
    text = str(path)
    return text.startswith(("/dev/fd/", "/proc/self/fd/")) and text.rsplit("/", 1)[1].isdigit()


def names_a_file(text: str, suffix: str) -> bool:
    """Whether a name given where a built-in name or a path may stand (``--gpu``, ``--model``) is a path:
    it ends in ``suffix``, holds a path separator, or names something that exists (a folder, a FIFO), a
    link loop or a name too long for a file (:func:`input_file` then says which, in one line).

    >>> names_a_file("h200", ".toml"), names_a_file("my/h200", ".toml"), names_a_file("x.toml", ".toml")
    (False, True, True)
    """
    if text.endswith(suffix) or "/" in text or os.sep in text:
        return True
    try:
        os.stat(text)
    except OSError as exc:
        return exc.errno in (errno.ENAMETOOLONG, errno.ELOOP, errno.EACCES)
    except ValueError:  # a NUL character
        return True
    return True


def read_bytes(path: str | Path, what: str = "", *, limit: int, error: type[InputError] = InputError,
               missing: str = "no such file") -> bytes:
    """The bytes of the regular file ``path`` (:func:`input_file`), or of a process substitution's pipe
    (:func:`is_pipe_name`, read without blocking for more than :data:`PIPE_TIMEOUT_S`), refused in one
    line when it holds more than ``limit`` bytes; never reads more than ``limit + 1``."""
    label = _label(what, path)
    if is_pipe_name(path):
        try:
            fifo = stat.S_ISFIFO(os.stat(path).st_mode)
        except OSError:
            fifo = False
        if fifo:
            return _read_pipe(path, label, limit, error)
    p = input_file(path, what, error=error, missing=missing)
    try:
        with open(p, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise error(f"{label}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise error(f"{label}: larger than {size_text(limit)}; this is not a file mksim reads")
    return data


#: A process substitution's pipe that gives no end of data within this many seconds is refused.
PIPE_TIMEOUT_S = 30.0


def _read_pipe(path: str | Path, label: str, limit: int, error: type[InputError]) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a FIFO for reading never blocks so
    except OSError as exc:
        raise error(f"{label}: cannot read it ({exc.strerror})") from None
    chunks: list[bytes] = []
    size, deadline = 0, time.monotonic() + PIPE_TIMEOUT_S
    try:
        while size <= limit:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise error(f"{label}: the pipe gave no end of data within {PIPE_TIMEOUT_S:g} s; save it to a "
                            "file and give that file")
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise error(f"{label}: larger than {size_text(limit)}; this is not a file mksim reads")
    return b"".join(chunks)


def size_text(n: int) -> str:
    """``n`` bytes for a message.

    >>> size_text(2 << 30), size_text(16 << 20), size_text(12_500), size_text(100)
    ('2 GiB', '16 MiB', '12.2 KiB', '100 bytes')
    """
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def parse_json(text: str | bytes, what: str, *, error: type[InputError] = InputError) -> Any:
    """``json.loads(text)``, with every way it can fail as ``error`` in one line prefixed by ``what``:
    not UTF-8, not JSON (with the line), nested too deeply, a number too long to convert."""
    if isinstance(text, bytes) and text.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
        text = text[3:]
    elif isinstance(text, str) and text.startswith("\ufeff"):
        text = text[1:]
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{what}: JSON nested more than {MAX_DEPTH} levels deep; this is not a file mksim wrote or "
                    "reads") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what}: not valid JSON (not UTF-8 text: {exc.reason} at byte {exc.start}); save it as "
                    "UTF-8") from None
    except ValueError as exc:  # a number too long to convert
        raise error(f"{what}: not valid JSON ({exc})") from None


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same inode when both exist, else the same resolved
    path (links and ``..`` followed). A path that cannot be resolved is no file."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        pass
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def check_outputs(outputs: Mapping[str, str | Path | None], inputs: Iterable[tuple[str, str | Path | None]] = (),
                  *, error: type[InputError] = InputError) -> None:
    """Refuse, before any work, an output that is one of the command's inputs or another of its outputs
    (the same file after resolving links). ``outputs`` maps each flag (``"--out"``) to its path, None when
    not given; ``inputs`` are (what, path) pairs. A path ``-`` (standard output) is never a file.

    >>> check_outputs({"--out": "a.json", "--report": "./a.json"})
    Traceback (most recent call last):
    ...
    hwmodels.errors.InputError: --out and --report both name a.json; give each its own file
    """
    outs = [(flag, p) for flag, p in outputs.items() if p is not None and str(p) != "-"]
    for i, (flag, p) in enumerate(outs):
        for what, q in inputs:
            if q is not None and str(q) != "-" and same_file(p, q):
                raise error(f"{flag} {p} is the {what} this command reads; writing it would destroy it. Give "
                            f"{flag} another file")
        for flag2, q in outs[i + 1:]:
            if same_file(p, q):
                raise error(f"{flag} and {flag2} both name {p}; give each its own file")

"""The explorer's own folder, and the schedules handed from one page to another (Search's best schedule
to Timeline).

**The folder** (:func:`home`) is per user: ``$MKSIM_EXPLORER_CACHE`` if set, else
``$XDG_CACHE_HOME/mksim/explorer``, else ``~/.cache/mksim/explorer``. It is made with mode 0700 and, every
time it is used, checked to be a folder of this user that no other user can write to
(:func:`private_dir`): a folder made first by someone else, or one that is group- or world-writable, is
refused in one line, because whoever can write there could plant what the server reads back (the search
registry's ``job.json``, whose pid Cancel signals; the default study storage). It holds ``schedules/``
(below), ``jobs/`` (:mod:`explorer.jobs`) and ``studies.db`` (the Search page's storage).

**Schedules.** A schedule file is tens of kilobytes: too much for a link, so the link carries a token and
the schedule waits in ``schedules/<token>.json``, a plain JSON text file written whole (a temporary file
renamed), kept across restarts and shared by the server's processes. Nothing is unpickled: a file there is
only ever read as text, and only a token of :data:`TOKEN_LENGTH` hexadecimal digits is looked up. The
token is a digest of the schedule, so the same schedule always gets the same link. The folder keeps at
most :data:`SIZE_LIMIT_BYTES`; past it the least recently used schedules are removed (a read marks a
schedule used).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import threading
from pathlib import Path

from mksim.errors import MksimError

#: The schedules kept take at most this many bytes; the least recently used go first.
SIZE_LIMIT_BYTES = 64 * 2**20
#: A schedule larger than this is not kept (a llama-3.1-8b megakernel schedule is about 200 KiB).
MAX_SCHEDULE_BYTES = 16 * 2**20
#: A token is this many lowercase hexadecimal digits of the schedule's SHA-256.
TOKEN_LENGTH = 32
_TOKEN = re.compile(rf"[0-9a-f]{{{TOKEN_LENGTH}}}")


def home() -> Path:
    """The explorer's folder for this user, made (mode 0700) and checked: :func:`private_dir`."""
    env = os.environ.get("MKSIM_EXPLORER_CACHE")
    if env:
        return private_dir(Path(env).expanduser(), "MKSIM_EXPLORER_CACHE")
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return private_dir(base / "mksim" / "explorer", "the explorer's folder")


def private_dir(path: Path, what: str) -> Path:
    """``path``, a folder of this user that no other user can write to, made with mode 0700 (its missing
    parents too) if it does not exist. Raises MksimError in one line if it is not a folder, belongs to
    another user, or is group- or world-writable (then another user could plant files in it)."""
    try:
        if not os.path.lexists(path):
            with contextlib.suppress(FileExistsError):  # another process of ours made it first
                os.makedirs(path, mode=0o700)
        st = os.stat(path)
        link = os.lstat(path)
    except OSError as exc:
        raise MksimError(f"{what} {path}: cannot make or read it ({exc.strerror or exc}); set "
                         "MKSIM_EXPLORER_CACHE to a folder of your own") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MksimError(f"{what} {path}: not a folder; set MKSIM_EXPLORER_CACHE to a folder of your own")
    uid = os.getuid()
    other = next((o for o in (st.st_uid, link.st_uid) if o != uid), None)
    if other is not None:
        raise MksimError(f"{what} {path} belongs to another user (uid {other}), who could plant files the explorer "
                         "reads; set MKSIM_EXPLORER_CACHE to a folder of your own")
    if st.st_mode & 0o022:
        raise MksimError(f"{what} {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}); "
                         f"chmod 700 {path}, or set MKSIM_EXPLORER_CACHE to a folder of your own")
    return path


def _schedules() -> Path:
    return private_dir(home() / "schedules", "the explorer's schedule folder")


def is_token(token: object) -> bool:
    """Whether ``token`` has the form of a schedule token (:data:`TOKEN_LENGTH` lowercase hex digits)."""
    return isinstance(token, str) and _TOKEN.fullmatch(token) is not None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole (a temporary file, mode 0600, renamed): a reader sees the old file or
    the new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def read_private(path: Path, limit: int) -> str | None:
    """The text of the regular file ``path`` (links not followed), ``None`` if there is none, it is not a
    regular file, holds more than ``limit`` bytes or is not UTF-8 text."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _evict(folder: Path, limit: int) -> None:
    """Remove the least recently used schedules (oldest modification time: a read touches it) until the
    folder holds at most ``limit`` bytes of them."""
    files = []
    for p in folder.glob("*.json"):
        with contextlib.suppress(OSError):
            st = p.stat()
            files.append((st.st_mtime_ns, st.st_size, p))
    total = sum(size for _, size, _ in files)
    for _, size, p in sorted(files, key=lambda f: f[0]):
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            p.unlink()
        total -= size


def put_schedule(schedule_json: str) -> str:
    """Keep a schedule file's JSON; returns its token (for ``/timeline?schedule=<token>``)."""
    if not isinstance(schedule_json, str) or len(schedule_json.encode()) > MAX_SCHEDULE_BYTES:
        raise MksimError(f"the schedule is over {MAX_SCHEDULE_BYTES >> 20} MiB: save it with mksim search --out")
    token = hashlib.sha256(schedule_json.encode()).hexdigest()[:TOKEN_LENGTH]
    folder = _schedules()
    try:
        write_private(folder / f"{token}.json", schedule_json)
    except OSError as exc:
        raise MksimError(f"cannot keep the schedule in {folder}: {exc.strerror or exc}") from None
    _evict(folder, SIZE_LIMIT_BYTES)
    return token


def get_schedule(token: object) -> str | None:
    """The schedule JSON kept under ``token``, or ``None`` if there is none (unknown, evicted, or not a
    token at all: nothing is looked up for it)."""
    if not is_token(token):
        return None
    path = _schedules() / f"{token}.json"
    text = read_private(path, MAX_SCHEDULE_BYTES)
    if text is not None:
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: evicted last
    return text

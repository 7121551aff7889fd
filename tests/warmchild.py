"""A real child process without a new interpreter: :class:`WarmChild` is a :class:`subprocess.Popen` whose
child is forked from the test process (which has already imported optuna, SQLAlchemy and mksim) instead of
executing ``python``, as a fork server would start it.

Why: a child ``python -m mksim search`` spends about a second of CPU importing before it searches, and the
tests that must interrupt a real process (SIGKILL, Ctrl-C, two searches racing on one study: the C table
of tests/mksim/test_bad_inputs_2_search.py) start about forty of them. The forked child is a process of its
own — its own pid, session, signals, file descriptors and SQLite connections; it is killed, interrupted
and waited for as any child — and it runs the same entry point as ``python -m mksim`` (:func:`mksim.cli.main`)
or the same ``-c`` code, with ``sys.argv``, the environment, the working directory, the standard streams
and Ctrl-C at its default set as a new interpreter would have them. What it does not redo is the imports
(a Ctrl-C during them is tests/mksim/test_cli.py's, with a real child), and at its end it flushes its
streams and leaves with ``os._exit``: no interpreter shutdown (mksim registers no ``atexit`` work). Of
mksim's module state only the search's record of what this process simulated changes what a process does;
the child starts with it empty (the other caches are memos of pure functions).

``MKSIM_TEST_SUBPROCESS=1`` makes every WarmChild a real ``python`` child again (the same arguments), to
check that the two agree.
"""

from __future__ import annotations

import gc
import io
import os
import signal
import subprocess
import sys
import traceback
from typing import Any


def _child_main(args: list[str], env: dict[str, str] | None, cwd: Any) -> int:
    """In the forked child: become ``python ARGS`` (``-m mksim ...`` or ``-c CODE ...``); its exit status."""
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what a new interpreter installs
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=False, line_buffering=False)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, line_buffering=True)
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
    import logging
    import warnings

    logging.root.handlers.clear()  # pytest's capture handlers
    for lg in logging.root.manager.loggerDict.values():  # optuna's handler holds the stderr of its import
        for h in getattr(lg, "handlers", []):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                h.setStream(sys.stderr)
    warnings.resetwarnings()
    warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
    study = sys.modules.get("mksim.search._study")
    if study is not None:  # what this process simulated: a new one starts without (the rest are pure memos)
        study._SIMULATED.update(problem=None, results={})  # type: ignore[attr-defined]
    from mksim.console import out

    out._width = None if sys.stdout.isatty() else 160  # as mksim.console sets it at import
    if args[:2] == ["-m", "mksim"]:
        sys.argv = ["mksim", *args[2:]]
        from mksim.__main__ import run

        run()
    elif args[:1] == ["-c"]:
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        raise ValueError(f"WarmChild runs '-m mksim ...' or '-c CODE ...', not {args[:2]}")
    return 0


class WarmChild(subprocess.Popen):  # type: ignore[type-arg]
    """``subprocess.Popen([sys.executable, *ARGS], ...)`` with the child forked from this process (see the
    module's docstring). ARGS is ``-m mksim ...`` or ``-c CODE ...``; ``stdin``, ``stdout``, ``stderr``,
    ``env``, ``cwd``, ``text``, ``start_new_session`` and ``preexec_fn`` mean what they mean for Popen."""

    def __init__(self, cmd: list[str], **kw: Any) -> None:
        if os.environ.get("MKSIM_TEST_SUBPROCESS") == "1":
            self._warm = False
        else:
            self._warm = True
            if cmd[0] != sys.executable:
                raise ValueError("WarmChild runs this Python: give [sys.executable, ...]")
        self._env, self._cwd = kw.get("env"), kw.get("cwd")
        super().__init__(cmd, **kw)

    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: Any, pass_fds: Any,
                       cwd: Any, env: Any, startupinfo: Any, creationflags: Any, shell: Any,
                       p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int, errread: int, errwrite: int,
                       restore_signals: Any, gid: Any, gids: Any, uid: Any, umask: Any,
                       start_new_session: bool, *rest: Any) -> None:
        if not self._warm:
            return super()._execute_child(  # type: ignore[misc]
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags, shell,
                p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask,
                start_new_session, *rest)
        sys.stdout.flush()
        sys.stderr.flush()
        # SQLite connections this process leaked (reachable only through reference cycles) are closed here,
        # where their descriptors are theirs: collected in the child, after closerange, they would close
        # whatever descriptor now has their number (the child's own database, say) and drop its locks
        gc.collect()
        pid = os.fork()
        if pid == 0:  # the child: nothing here may return into the test process's frames
            code = 1
            try:
                if start_new_session:
                    os.setsid()
                for fd, target in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2)):
                    if fd != -1:  # -1: the test process's own stream, inherited
                        os.dup2(fd, target)
                os.closerange(3, 65536)  # no other child's pipe stays open here
                if preexec_fn is not None:
                    preexec_fn()
                try:
                    code = _child_main(list(args[1:]), env, cwd)
                except SystemExit as exc:
                    c = exc.code
                    if isinstance(c, str):
                        sys.stderr.write(c + "\n")
                    code = 0 if c is None else (1 if isinstance(c, str) else int(c))
                except KeyboardInterrupt:  # as Python does: die of SIGINT
                    traceback.print_exc()
                    for stream in (sys.stdout, sys.stderr):
                        stream.flush()
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    os.kill(os.getpid(), signal.SIGINT)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except BaseException:
                        pass
            finally:
                os._exit(code)
        self.pid = pid
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]

"""Read a Chrome trace the bounded way: one event at a time, the GPU activities' fields kept in columns.

A ``torch.profiler`` trace can hold gigabytes of JSON, of which the import (:mod:`mksim.trace`) needs a few
numbers per GPU activity; ``json.loads`` of the whole file costs about ten bytes of memory per byte of
trace. :class:`JsonEvents` decodes the file as a stream instead (plain or gzipped, any JSON encoding,
a byte-order mark or not) and hands each element of ``traceEvents`` to a callback: it never holds more
than one element (at most ``max_value_bytes``) and one chunk of text. :func:`read_activities` keeps, of
each GPU activity, its name (interned), category, times, stream, device, correlation and grid in arrays
(about 60 bytes an activity), and refuses in one line, before memory grows, a file of more than
``max_bytes`` (uncompressed) or more than ``max_events`` kept events. The caps are parameters, so that
a server (the explorer) can pass smaller ones.

Fields of the wrong type are refused in one line naming the event (a stream given as a list); ids
written as digits are numbers (device ``"0"`` is device ``0``); times are finite and within
:data:`MAX_TIME_US`, where a double still resolves a microsecond.

>>> import gzip, io
>>> raw = gzip.compress(b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": 5, "dur": 2,'
...                     b' "args": {"device": "0", "stream": 7}}], "deviceProperties": []}')
>>> acts = read_activities(gzip.GzipFile(fileobj=io.BytesIO(raw)), "trace t.json.gz")
>>> len(acts), acts.name(0), acts.device_of(0), acts.meta
(1, 'gemm', 0, {'deviceProperties': []})
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

from hwmodels.files import MAX_DEPTH, input_file, size_text
from mksim.errors import MksimError

__all__ = ["ALL_EVENTS_PER_KEPT", "CATEGORIES", "GPU_CATEGORIES", "GRAPH_LAUNCHES", "KERNEL", "MAX_BYTES",
           "MAX_EVENTS", "MAX_TIME_US", "MAX_VALUE_BYTES", "NO_CORRELATION", "STEP_MARK", "Activities", "JsonEvents",
           "TraceError", "open_trace", "parse_id", "parse_time", "read_activities", "size_text"]

#: Chrome-trace categories of GPU activities (lower-cased; older torch wrote ``Kernel``, ``Memset``).
GPU_CATEGORIES = {"kernel": "kernel", "gpu_memset": "memset", "gpu_memcpy": "memcpy", "memset": "memset",
                  "memcpy": "memcpy"}
CATEGORIES = ("kernel", "memset", "memcpy")   #: the codes of :attr:`Activities.cat`
KERNEL = 0
_CAT_CODE = {c: i for i, c in enumerate(CATEGORIES)}
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")
STEP_MARK = "ProfilerStep#"
MAX_BYTES = 2 << 30          #: a trace larger than this (uncompressed) is refused, after reading at most this much
MAX_EVENTS = 2_000_000       #: GPU activities, graph launches and step ranges kept, at most (~60 bytes each)
ALL_EVENTS_PER_KEPT = 10     #: events of any kind read, at most, per event that may be kept (a time bound)
MAX_VALUE_BYTES = 16 << 20   #: one event (or one top-level field) larger than this is refused
MAX_TIME_US = float(2**53)   #: ts and dur beyond this (285 years of µs) lose the microsecond in a double
CHUNK = 1 << 20              #: bytes read at a time
NO_CORRELATION = -(1 << 62)           #: the code of "no correlation"
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_GOES_ON = re.compile(r"[0-9.eE+\-]*")
_DECODER = json.JSONDecoder()
_HINT = "give a Chrome trace from prof.export_chrome_trace()"


class TraceError(MksimError, ValueError):
    """A trace file that cannot be imported (not JSON, no kernels, several GPUs, too large, ...)."""


def _shown(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


class JsonEvents:
    """A JSON document read from ``fh`` a value at a time: :meth:`read` streams the elements of its
    ``traceEvents`` list (or of a bare top-level list) to a callback and returns the other top-level
    fields. ``label`` names the file in messages ("trace t.json")."""

    def __init__(self, fh: BinaryIO, label: str, *, max_bytes: int = MAX_BYTES,
                 max_value_bytes: int = MAX_VALUE_BYTES):
        self.fh, self.label, self.max_bytes, self.max_value = fh, label, max_bytes, max_value_bytes
        self.buf, self.pos, self.eof = "", 0, False
        self.nbytes = 0       # bytes read from the (decompressed) file
        self.lines = 0        # newlines in the text already dropped from buf
        self.base = 0         # characters already dropped from buf
        self.dec: codecs.IncrementalDecoder | None = None

    # -- the text ----------------------------------------------------------------------------------------
    def _more(self) -> bool:
        """Append the next chunk to ``buf`` (dropping what is consumed); False at the end."""
        if self.eof:
            return False
        try:
            raw = self.fh.read(CHUNK)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{self.label}: cannot read ({exc}); {_HINT}, plain or gzipped") from None
        self.nbytes += len(raw)
        if self.nbytes > self.max_bytes:
            raise TraceError(f"{self.label}: over {size_text(self.max_bytes)} uncompressed; profile fewer steps")
        if self.dec is None:
            self.dec = codecs.getincrementaldecoder(json.detect_encoding(raw[:4]))()
        try:
            text = self.dec.decode(raw, final=not raw)
        except UnicodeDecodeError as exc:
            raise TraceError(f"{self.label}: not JSON (not UTF-8 text: {exc.reason}); {_HINT}") from None
        self.eof = not raw
        if self.pos:
            self.lines += self.buf.count("\n", 0, self.pos)
            self.base += self.pos
            self.buf = self.buf[self.pos:] + text
            self.pos = 0
        else:
            self.buf += text
        return True

    def _line(self, pos: int) -> int:
        return self.lines + self.buf.count("\n", 0, pos) + 1

    def _not_json(self, line: int) -> TraceError:
        return TraceError(f"{self.label}: not JSON (line {line}); {_HINT}")

    def peek(self) -> str:
        """The next character that is not blank (``""`` at the end); a long run of blanks is refused."""
        run = 0
        while True:
            end = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            run += end - self.pos
            self.pos = end
            if end < len(self.buf):
                return self.buf[end]
            if run > self.max_value:
                raise TraceError(f"{self.label}: over {size_text(self.max_value)} of blank space; {_HINT}")
            if not self._more():
                return ""

    def expect(self, chars: str) -> str:
        """Consume the next character, one of ``chars``."""
        c = self.peek()
        if not c or c not in chars:
            raise self._not_json(self._line(self.pos))
        self.pos += 1
        return c

    def value(self) -> Any:
        """The next JSON value, decoded whole (at most ``max_value_bytes`` of text)."""
        self.peek()
        while True:
            try:
                v, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(self.buf) - 16
                if not cut or self.eof:
                    raise self._not_json(self.lines + exc.lineno) from None
                self._grow()
                continue
            except RecursionError:
                raise TraceError(f"{self.label}: JSON nested more than {MAX_DEPTH} levels deep; {_HINT}") from None
            except ValueError as exc:  # an integer of too many digits
                raise TraceError(f"{self.label}: not JSON ({exc}); {_HINT}") from None
            if not self.eof and (end == len(self.buf) or type(v) in (int, float)
                                 and _NUMBER_GOES_ON.match(self.buf, end).end() == len(self.buf)):  # type: ignore[union-attr]
                self._grow()   # a number may go on in the next chunk ("2." then "5e3")
                continue
            self.pos = end
            return v

    def _grow(self) -> None:
        held = len(self.buf) - self.pos
        if held > self.max_value:
            raise TraceError(f"{self.label}: one JSON value over {size_text(self.max_value)} (from line "
                             f"{self._line(self.pos)}); {_HINT}")
        want = max(2 * held, CHUNK)
        while len(self.buf) - self.pos < want and self._more():
            pass

    # -- the document -----------------------------------------------------------------------------------
    def read(self, on_event: Callable[[Any], None]) -> dict[str, Any]:
        """Stream every element of ``traceEvents`` to ``on_event``; return the other top-level fields
        (bounded together by ``max_value_bytes``). A document without a ``traceEvents`` list is refused
        after it is read whole (so that broken JSON is said to be broken first)."""
        meta: dict[str, Any] = {}
        listed = False
        first = self.peek()
        if first == "[":
            self.pos += 1
            self._array(on_event)
            listed = True
        elif first == "{":
            self.pos += 1
            if self.peek() == "}":
                self.pos += 1
            else:
                meta_chars = 0
                while True:
                    if self.peek() != '"':
                        raise self._not_json(self._line(self.pos))
                    key = self.value()
                    self.expect(":")
                    if key == "traceEvents" and listed:
                        raise TraceError(f"{self.label}: two 'traceEvents' lists; {_HINT}")
                    if key == "traceEvents" and self.peek() == "[":
                        self.pos += 1
                        self._array(on_event)
                        listed = True
                    else:
                        at = self.base + self.pos
                        v = self.value()
                        meta_chars += self.base + self.pos - at
                        if meta_chars > self.max_value:
                            raise TraceError(f"{self.label}: over {size_text(self.max_value)} of fields besides "
                                             f"'traceEvents'; {_HINT}")
                        if key != "traceEvents":
                            meta[key] = v
                    if self.expect(",}") == "}":
                        break
        else:
            self.value()
        if self.peek():
            raise self._not_json(self._line(self.pos))
        if not listed:
            raise TraceError(f"{self.label}: JSON without a 'traceEvents' list; {_HINT}")
        return meta

    def _array(self, on_event: Callable[[Any], None]) -> None:
        if self.peek() == "]":
            self.pos += 1
            return
        while True:
            on_event(self.value())
            if self.expect(",]") == "]":
                return


def parse_id(v: Any) -> int | str | None:
    """A device, stream or correlation id: a number, digits as a number (device ``"0"`` is device 0), or a
    name; raises TypeError for anything else (a list, an object, a boolean)."""
    if v is None or type(v) is int:
        return v
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**62:
        return int(v)
    if isinstance(v, str):
        s = v.strip()
        return int(s) if s.isascii() and s.isdigit() and len(s) < 19 else v
    raise TypeError


def parse_time(v: Any) -> float | None:
    """A finite time in µs within :data:`MAX_TIME_US`, or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not -MAX_TIME_US <= v <= MAX_TIME_US:
        return None   # (NaN fails the comparison too)
    return float(v)


class Activities:
    """The GPU activities of a trace in columns (index ``i`` is the i-th activity in file order), with
    the graph launches' correlations, the ``ProfilerStep`` ranges and the top-level fields (``meta``)."""

    def __init__(self, label: str, max_events: int):
        self.label, self.max_events = label, max_events
        self.meta: dict[str, Any] = {}
        self.names: list[str] = []
        self._name_code: dict[str, int] = {}
        self.ids: list[int | str | None] = []           # devices and streams
        self._id_code: dict[int | str | None, int] = {}
        self.dims: list[tuple[int, ...] | None] = [None]
        self._dims_code: dict[tuple[int, ...], int] = {}
        self._corr_code: dict[int | str, int] = {}
        self.ts, self.dur = array("d"), array("d")
        self.cat = array("b")
        self.name_i, self.stream_i, self.device_i, self.grid_i, self.block_i = (array("i") for _ in range(5))
        self.corr = array("q")
        self.ordinal = array("q")                        # the event's index in traceEvents
        self.launches: set[int] = set()                  # correlation codes of graph launches
        self.marks: list[tuple[float, float]] = []       # ProfilerStep ranges on the GPU timeline: (ts, dur)
        self.n_events = 0                                # elements of traceEvents seen

    def __len__(self) -> int:
        return len(self.ts)

    def name(self, i: int) -> str:
        return self.names[self.name_i[i]]

    def device_of(self, i: int) -> int | str | None:
        return self.ids[self.device_i[i]]

    def stream_of(self, i: int) -> int | str | None:
        return self.ids[self.stream_i[i]]

    def code(self, v: int | str | None) -> int:
        """The code of a device or stream id (added when new)."""
        c = self._id_code.get(v)
        if c is None:
            c = self._id_code[v] = len(self.ids)
            self.ids.append(v)
        return c

    def corr_code(self, v: int | str | None) -> int:
        if v is None:
            return NO_CORRELATION
        if isinstance(v, int) and 0 <= v < 1 << 62:
            return v
        c = self._corr_code.get(v)
        if c is None:
            c = self._corr_code[v] = -2 - len(self._corr_code)
        return c

    def _dims(self, v: Any) -> int:
        if type(v) is not list:
            return 0
        t = tuple(v)
        try:
            c = self._dims_code.get(t)
        except TypeError:   # a list inside
            return 0
        if c is None:
            if not all(isinstance(x, int) for x in t):
                return 0
            c = self._dims_code[t] = len(self.dims)
            self.dims.append(t)
        return c

    def _kept(self) -> None:
        if len(self.ts) + len(self.launches) + len(self.marks) >= self.max_events:
            raise TraceError(f"{self.label}: more than {self.max_events:,} GPU activities; profile fewer steps")

    def _bad(self, e: dict[str, Any], field: str, v: Any, expected: str, what: str = "GPU event") -> TraceError:
        return TraceError(f"{self.label}: {what} {_shown(e.get('name'))} has {field} = {_shown(v)}; expected "
                          f"{expected}")

    def add(self, e: Any) -> None:
        """Keep what the import needs of one element of ``traceEvents`` (a callback of :meth:`JsonEvents.read`)."""
        self.n_events += 1
        if self.n_events > ALL_EVENTS_PER_KEPT * self.max_events:
            raise TraceError(f"{self.label}: more than {ALL_EVENTS_PER_KEPT * self.max_events:,} events; profile "
                             "fewer steps")
        if type(e) is not dict or e.get("ph") != "X":
            return
        cat = str(e.get("cat", "")).lower()
        args = e.get("args")
        if not isinstance(args, dict):
            args = {}
        kind = GPU_CATEGORIES.get(cat)
        if kind is None:
            if e.get("name") in GRAPH_LAUNCHES and "correlation" in args:
                try:
                    c = parse_id(args["correlation"])
                except TypeError:
                    raise self._bad(e, "args.correlation", args["correlation"], "an integer", "graph launch") from None
                if c is not None:
                    self._kept()
                    self.launches.add(self.corr_code(c))
            elif cat == "gpu_user_annotation" and str(e.get("name", "")).startswith(STEP_MARK):
                ts, dur = parse_time(e.get("ts")), parse_time(e.get("dur"))
                if ts is not None and dur is not None:   # a broken range is no range
                    self._kept()
                    self.marks.append((ts, dur))
            return
        ts, dur = parse_time(e.get("ts")), parse_time(e.get("dur"))
        if ts is None:
            raise self._bad(e, "ts", e.get("ts"), f"a number of µs within ±{MAX_TIME_US:.1e}")
        if dur is None or dur < 0:
            raise self._bad(e, "dur", e.get("dur"), f"a number >= 0 (µs), at most {MAX_TIME_US:.1e}")
        ids = []
        for key, v in (("args.stream", args.get("stream", e.get("tid", 0))),
                       ("args.device", args.get("device", e.get("pid"))),
                       ("args.correlation", args.get("correlation"))):
            try:
                ids.append(parse_id(v))
            except TypeError:
                raise self._bad(e, key, v, "an integer (or a name)") from None
        self._kept()
        name = str(e.get("name", ""))
        code = self._name_code.get(name)
        if code is None:
            code = self._name_code[name] = len(self.names)
            self.names.append(name)
        self.ts.append(ts)
        self.dur.append(dur)
        self.cat.append(_CAT_CODE[kind])
        self.name_i.append(code)
        self.stream_i.append(self.code(ids[0]))
        self.device_i.append(self.code(ids[1]))
        self.corr.append(self.corr_code(ids[2]))
        self.grid_i.append(self._dims(args.get("grid")))
        self.block_i.append(self._dims(args.get("block")))
        self.ordinal.append(self.n_events - 1)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``ts``, ``dur``, ``cat``, ``device`` and ``corr`` codes as numpy arrays (no copy)."""
        return (np.frombuffer(self.ts, dtype=np.float64) if len(self) else np.zeros(0),
                np.frombuffer(self.dur, dtype=np.float64) if len(self) else np.zeros(0),
                np.frombuffer(self.cat, dtype=np.int8) if len(self) else np.zeros(0, np.int8),
                np.frombuffer(self.device_i, dtype=np.int32) if len(self) else np.zeros(0, np.int32),
                np.frombuffer(self.corr, dtype=np.int64) if len(self) else np.zeros(0, np.int64))

    def dims_of(self, code: int) -> tuple[int, ...] | None:
        return self.dims[code]


def open_trace(path: str | Path, label: str) -> BinaryIO:
    """The regular file ``path`` (:func:`hwmodels.files.input_file`) opened for reading, decompressed
    if it is gzipped. ``label`` names it in messages (``"trace t.json"``)."""
    p = input_file(path, "trace", error=TraceError)
    try:
        with p.open("rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        return cast(BinaryIO, gzip.open(p, "rb") if gz else p.open("rb"))
    except OSError as exc:
        raise TraceError(f"{label}: cannot read ({exc.strerror or exc}); {_HINT}, plain or gzipped") from None


def read_activities(fh: BinaryIO, label: str, *, max_bytes: int = MAX_BYTES, max_events: int = MAX_EVENTS,
                    max_value_bytes: int = MAX_VALUE_BYTES) -> Activities:
    """The GPU activities, graph launches, step ranges and top-level fields of the trace read from ``fh``
    (decompressed already), within the caps (see the module's docstring)."""
    acts = Activities(label, max_events)
    acts.meta = JsonEvents(fh, label, max_bytes=max_bytes, max_value_bytes=max_value_bytes).read(acts.add)
    return acts

"""Plain data for "your stack" on the Compare page: a kernel library's stack predicted next to the
megakernel (:func:`mksim.compare.stack_row`), and an uploaded ``torch.profiler`` trace of one step
(:func:`mksim.trace.import_trace`). No Dash, no plotly: pages and tests share these functions.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import re
import tempfile
import threading
import zlib
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import hwmodels
import mksim.models
from explorer.data import check_gpu, check_model, upload_name
from hwmodels.files import size_text
from mksim.compare import (
    assumptions,
    latency_interval,
    make_workload,
    speedup_interval,
    stack_row,
    verdict,
)
from mksim.errors import MksimError
from mksim.target import PROFILES, gpu_spec, with_impl
from mksim.trace import import_trace
from mksim.workload import Step

#: The value of the profile and stack choices that names no implementation profile.
NONE = "none"
#: An uploaded trace larger than this (as uploaded, gzipped or not) is refused before it is read.
MAX_UPLOAD_BYTES = 32 << 20
#: ... and one that decompresses to more than this (far below ``mksim trace import``'s cap: a server takes
#: uploads from anyone who reaches it). The gzip stream is inflated only up to it.
MAX_TRACE_BYTES = 64 << 20
#: ... and one of more GPU activities than this (a decode step has a few thousand).
MAX_TRACE_EVENTS = 400_000
#: Imported traces remembered (by the upload's digest and the inputs), so *Run* does not import again.
KEEP_TRACES = 4


def profiles() -> list[str]:
    """Implementation profiles: the stacks people run first, then the megakernels' (each profile's
    ``kind``), by name within each."""
    return sorted(PROFILES, key=lambda p: (hwmodels.profile_info(p)["kind"] != "stack", p))


def profile_options() -> list[dict[str, str]]:
    """The megakernel's profile choice: none (the best kernels the chip allows) or a profile."""
    return [{"label": "none: the best kernels the chip allows", "value": NONE},
            *({"label": f"{p}: {hwmodels.profile_info(p)['full_name']}", "value": p} for p in profiles())]


def stack_options() -> list[dict[str, str]]:
    """The "your stack" choice: none, or a library's kernels in one CUDA graph."""
    return [{"label": "none", "value": NONE}, *({"label": p, "value": p} for p in profiles())]


def chosen(value: str | None) -> str | None:
    """A profile or stack choice as a profile name, ``None`` for :data:`NONE` (or nothing chosen)."""
    return None if not value or value == NONE else value


def megakernel_gpu(gpu: str, profile: str | None) -> str:
    """The GPU name the modes are simulated on: ``gpu``, or ``gpu+profile`` with a profile chosen.

    >>> megakernel_gpu("h200", "mksim"), megakernel_gpu("h200", "none")
    ('h200+mksim', 'h200')
    """
    return with_impl(gpu, chosen(profile))


@lru_cache(maxsize=32)
def _stack(model: str, gpu: str, batch: int, kv_len: int, phase: str, config_json: str | None,
           impl: str, routing: str = "uniform", tp: int = 1, ep: int = 1) -> dict[str, Any]:
    g = gpu_spec(gpu)
    spec = model if config_json is None else mksim.models.config_from_hf(json.loads(config_json), name=model)
    step = Step(spec, batch, kv_len, phase, tp=tp, routing=routing, ep=ep)
    wl = make_workload(step, n_sms=g.sm.count)  # the workload the modes were compared on
    return stack_row(wl, gpu, impl, None)


def stack_data(run: dict[str, Any], impl: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Your stack next to a comparison (:func:`explorer.data.compare_run`'s ``run``, on ``run["gpu"]``):
    :func:`mksim.compare.stack_row` (``impl gpu mode latency_us tokens_per_s assumes``) with
    ``megakernel_speedup`` (the stack's latency over the run's megakernel; ``None`` without one) and
    ``speedup_vs_stream``. ``config`` is the uploaded config the run compared, if any. Remembered per
    inputs, as the comparison is. Raises :class:`mksim.errors.MksimError` on an unknown profile.
    """
    if impl not in PROFILES:
        raise MksimError(f"unknown stack {impl!r}; known: {', '.join(profiles())}")
    key = None if config is None else json.dumps(config, sort_keys=True)
    row = dict(_stack(run["model"], run["gpu"], int(run["batch"]), int(run["kv_len"]), run["phase"], key, impl,
                      run.get("routing", "uniform"), int(run.get("tp", 1)), int(run.get("ep", 1))))
    mk = run["modes"].get("megakernel")
    row["megakernel_speedup"] = row["latency_us"] / mk["latency_us"] if mk else None
    if mk:  # how sure: the speed-up's interval from both latencies' (mksim.compare), and the verdict
        mk_iv = latency_interval(mk["latency_us"], run["interval"]["half_width_pct"])
        row["speedup_interval"] = speedup_interval(row["interval_us"], mk_iv)
        row["verdict"] = verdict(row["megakernel_speedup"], row["speedup_interval"])
    stream = run["modes"].get("stream")
    row["speedup_vs_stream"] = stream["latency_us"] / row["latency_us"] if stream else None
    return row


# -- an uploaded torch.profiler trace ------------------------------------------------------------
def _gunzip(raw: bytes, name: str, max_trace: int) -> bytes:
    """The members of a gzip file inflated one after another, never more than ``max_trace`` bytes of output
    (refused in one line past it, before more is inflated)."""
    parts: list[bytes] = []
    size, data = 0, raw
    while data:
        d = zlib.decompressobj(wbits=31)
        try:
            out = d.decompress(data, max_trace + 1 - size)
        except zlib.error as exc:
            raise MksimError(f"{name}: not a readable gzip file ({exc})") from None
        size += len(out)
        if size > max_trace:
            raise MksimError(f"{name}: over {size_text(max_trace)} uncompressed; keep one step with mksim trace cut "
                             "(the explorer takes traces up to that; mksim trace import reads larger ones)")
        if not d.eof:
            raise MksimError(f"{name}: a truncated gzip file")
        parts.append(out)
        data = d.unused_data
        if not data.strip(b"\0"):  # padding after the last member
            break
    return b"".join(parts)


def read_trace_upload(contents: str, filename: str | None, max_upload: int = MAX_UPLOAD_BYTES,
                      max_trace: int = MAX_TRACE_BYTES) -> bytes:
    """The JSON bytes of an uploaded trace (a ``data:...;base64,`` URL, as ``dcc.Upload`` gives it; plain
    or gzipped). A file over ``max_upload`` bytes, over ``max_trace`` once decompressed, or not a readable
    upload raises :class:`mksim.errors.MksimError` with one line naming the file."""
    name = filename or "trace.json"
    if not isinstance(contents, str):
        raise MksimError(f"{name}: not an uploaded file (expected a data: URL); upload the file again")
    b64 = contents.split(",", 1)[-1]
    if len(b64) * 3 // 4 > max_upload + 3:  # refuse before decoding what is too large anyway
        raise MksimError(f"{name}: {size_text(len(b64) * 3 // 4)}; the explorer takes traces up to "
                         f"{size_text(max_upload)}: gzip it, or keep one step with mksim trace cut")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise MksimError(f"{name}: not a readable upload (bad base64)") from None
    if len(raw) > max_upload:
        raise MksimError(f"{name}: {size_text(len(raw))}; the explorer takes traces up to "
                         f"{size_text(max_upload)}: gzip it, or keep one step with mksim trace cut")
    if raw[:2] == b"\x1f\x8b":
        raw = _gunzip(raw, name, max_trace)
    elif len(raw) > max_trace:
        raise MksimError(f"{name}: over {size_text(max_trace)}; the explorer takes traces up to that: keep one "
                         "step with mksim trace cut")
    if not raw.strip():
        raise MksimError(f"{name}: an empty file; give a Chrome trace from prof.export_chrome_trace()")
    return raw


def _safe_name(filename: str) -> str:
    stem = re.sub(r"(\.json)?(\.gz)?$", "", Path(filename).name)
    return (re.sub(r"[^A-Za-z0-9._-]", "_", stem) or "trace") + ".json"


def trace_data(contents: str, filename: str | None, model: str, gpu: str, batch: int = 1, kv_len: int = 1024,
               config: dict[str, Any] | None = None) -> dict[str, Any]:
    """An uploaded trace imported with the page's model, batch, KV length and GPU: what ``mksim trace import
    --json`` prints without the kernels (``step_us replay_us replay_error n_kernels busy_us gaps_us
    mapped_fraction by_kind unmapped warnings prediction``...), with ``path`` the file's name, and
    ``assumes`` (what the prediction assumes: :func:`mksim.compare.assumptions` of its GPU).
    ``config``: an uploaded Hugging Face config, with ``model`` its name; else ``model`` is a built-in
    model's name and ``gpu`` a GPU name (never a path: :func:`explorer.data.check_model`, ``check_gpu``).
    The last :data:`KEEP_TRACES` imports (and refusals) are remembered by the upload's digest and the
    inputs, so *Run* with the same inputs does not import the trace again. Raises
    :class:`mksim.errors.MksimError` with one line naming the file.
    """
    name = upload_name(filename, "trace.json")
    if config is None:
        check_model(model)
    elif not isinstance(config, dict) or not isinstance(model, str):
        raise MksimError("the uploaded config is gone; upload it again")
    check_gpu(gpu)
    if not isinstance(contents, str):
        raise MksimError(f"{name}: not an uploaded file (expected a data: URL); upload the file again")
    key = (hashlib.sha256(contents.encode()).hexdigest(), name, model, gpu, int(batch), int(kv_len),
           None if config is None else json.dumps(config, sort_keys=True))
    hit: tuple[bool, Any] | None
    with _TRACES_LOCK:
        hit = _TRACES.get(key)
        if hit is not None:
            _TRACES.move_to_end(key)
    if hit is None:
        try:
            hit = (True, _trace_data(contents, name, model, gpu, int(batch), int(kv_len), config))
        except MksimError as exc:  # a refusal is remembered too: Run does not inflate a refused upload again
            hit = (False, str(exc))
        with _TRACES_LOCK:
            _TRACES[key] = hit
            while len(_TRACES) > KEEP_TRACES:
                _TRACES.popitem(last=False)
    ok, value = hit[0], cast(Any, hit[1])
    if not ok:
        raise MksimError(str(value))
    return cast(dict[str, Any], copy.deepcopy(value))


_TRACES: OrderedDict[tuple, tuple[bool, Any]] = OrderedDict()
_TRACES_LOCK = threading.Lock()


def _trace_data(contents: str, name: str, model: str, gpu: str, batch: int, kv_len: int,
                config: dict[str, Any] | None) -> dict[str, Any]:
    raw = read_trace_upload(contents, name)
    with tempfile.TemporaryDirectory(prefix="mksim-trace-") as tmp:
        path = Path(tmp) / _safe_name(name)
        path.write_bytes(raw)
        spec = model
        if config is not None:
            spec = str(Path(tmp) / f"{_safe_name(model).removesuffix('.json')}.json")
            Path(spec).write_text(json.dumps(config))
        try:
            t = import_trace(path, model=spec, batch=int(batch), kv_len=int(kv_len), gpu=gpu,
                             max_bytes=MAX_TRACE_BYTES, max_events=MAX_TRACE_EVENTS)
        except MksimError as exc:  # name the file as the user knows it, not our temporary copy
            msg = str(exc).replace(str(path), name).replace(tmp + "/", "")
            raise MksimError(msg.removeprefix("trace ") if msg.startswith(f"trace {name}:") else msg) from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError) as exc:
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
            raise MksimError(f"{name}: not a trace mksim reads ({type(exc).__name__}: {first}); give a Chrome "
                             "trace from prof.export_chrome_trace()") from None
    d = t.to_dict(kernels=False)
    d["path"] = name
    if config is not None:
        d["model"] = model
    pred = d["prediction"]
    d["assumes"] = assumptions(gpu_spec(gpu))["text"] if pred else None
    if pred and pred["hardware_file"]:  # hwmodels/data/h200-datasheet.toml, as the docs name it, where it is ours
        hw, root = Path(pred["hardware_file"]), Path(hwmodels.__file__).resolve().parents[1]
        pred["hardware_file"] = str(hw.relative_to(root)) if hw.is_relative_to(root) else str(hw)
    return d

"""Read hardware data files (TOML) into frozen :class:`GPUSpec` objects.

A file holds identity keys, a ``[sources.<id>]`` table per source, and numbers as
``key_unit = { value = ..., source = "<id>" }`` nested by physical hierarchy. An
overlay names a base with ``extends = "<name or path>"`` and overrides some numbers
(calibration writes such overlays). Every problem is reported as one line naming the
file, the key and what is expected.
"""

from __future__ import annotations

import copy
import math
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from ._schema import (
    ABSENT_TABLES,
    IDENTITY_KEYS,
    KERNEL_COST_KEYS,
    OPTIONAL_TABLES,
    SECTIONS,
    SOURCE_KINDS,
    UNITS,
    GPUSpec,
    KernelCost,
    KernelSpec,
    Source,
    section_fields,
    text_fields,
    unit_of,
)
from .errors import HardwareFileError, UnknownGPUError
from .files import input_file, names_a_file, read_bytes

_HERE = Path(__file__).resolve().parent
SEARCH_DIRS = (_HERE / "data", _HERE / "calibrated")
PROFILE_DIR = _HERE / "profiles"

_TOP_KEYS = set(IDENTITY_KEYS) | {"extends", "sources", "chip", "memory", "runtime", "schema_version", "profile",
                                   "validation", "interconnect"}
_PROFILE_KEYS = {"schema_version", "profile", "full_name", "measured_on", "kind", "mode", "runtime", "sources",
                 "validation"}
#: how a stack runs its step: its kernels in one CUDA graph (``graph``, the default), or launched one by one
#: by the host (``stream``: an eager stack)
STACK_MODES = ("graph", "stream")
#: what a profile describes: a library people run as their stack (its kernels in a CUDA graph), or the
#: device functions of a megakernel (mksim's generated one); the explorer lists stacks first
PROFILE_KINDS = ("stack", "megakernel")
# a profile's optional [validation] table: how its predictions held against measured whole steps;
# written by `python -m validation.stacks records`, read by mksim.compare for its intervals
_VALIDATION_NUMBERS = {"cases": int, "mape_pct": float, "bias_pct": float, "p90_abs_pct": float,
                       "max_abs_pct": float, "held_out_cases": int, "held_out_inside_pct": float}
_VALIDATION_TEXT = ("gpu", "what", "source", "command", "date", "held_out")
_VALIDATION_REQUIRED = ("cases", "mape_pct", "bias_pct", "p90_abs_pct", "max_abs_pct", "gpu", "source", "command")
#: a record's optional sub-tables, one per family of execution modes (mksim.schedule's mode kinds): the same
#: numbers over that family's cases alone, where the evidence has them (``[validation.chain]``)
VALIDATION_FAMILIES = ("chain", "persistent")
_FAMILY_REQUIRED = ("cases", "mape_pct", "bias_pct", "p90_abs_pct", "max_abs_pct", "source")
# task costs that are work on the SM, so scale with its clock when a profile moves to another GPU
_CLOCKED = ("task_fixed_us", "task_row_us")
_ENTRY_KEYS = {"value", "source", "note", "spread"}
#: a hardware file or profile is a few KiB; past this it is not one
TOML_LIMIT_B = 64 << 20


def available() -> list[str]:
    """Names of every built-in and calibrated hardware model, sorted."""
    names = {p.stem for d in SEARCH_DIRS if d.is_dir() for p in d.glob("*.toml")}
    return sorted(names)


def _is_file(p: Path) -> bool:
    """``p.is_file()``, False where the name cannot be looked up (too long: :func:`resolve` says so)."""
    try:
        return p.is_file()
    except (OSError, ValueError):
        return False


def split_profile(text: str) -> tuple[str, str | None]:
    """``(hardware, profile)`` of a ``--gpu`` value: ``"h200+torch"`` and ``"data/h200.toml+torch"`` name
    a profile, ``"h200"`` and ``"my+gpu.toml"`` do not. The one reading of ``GPU+PROFILE`` for every command.

    >>> split_profile("h200-calibrated+mksim"), split_profile("hwmodels/data/h200.toml+torch")
    (('h200-calibrated', 'mksim'), ('hwmodels/data/h200.toml', 'torch'))
    """
    if "+" not in text:
        return text, None
    if "/" in text or ".toml+" in text or text.endswith(".toml"):  # a path: its profile follows the last '+'
        head, _, tail = text.rpartition("+")
        if "/" in tail or tail.endswith(".toml"):  # the '+' is part of the file's name
            return text, None
        return head, tail
    head, _, tail = text.partition("+")
    return head, tail


def resolve(name_or_path: str | Path) -> Path:
    """The file behind a model name or a path; unknown names list the known ones."""
    text = str(name_or_path)
    if not text.strip():
        raise HardwareFileError(f"the GPU name is empty; give one of: {', '.join(available())} (or a .toml path)")
    if names_a_file(text, ".toml"):
        return input_file(text, error=HardwareFileError,
                          missing=f"no such hardware file; give a path to a .toml file or one of: "
                                  f"{', '.join(available())}")
    for d in SEARCH_DIRS:
        cand = d / f"{text.lower()}.toml"
        if cand.is_file():
            return cand
    raise UnknownGPUError("GPU", text, available())


def profiles() -> list[str]:
    """Names of the built-in implementation profiles (``hwmodels/profiles/*.toml``), sorted."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml")) if PROFILE_DIR.is_dir() else []


def load(name_or_path: str | Path, profile: str | None = None) -> GPUSpec:
    """Load a hardware model by name (``"h200"``, ``"h200-calibrated"``) or path, with the
    implementation profile ``profile`` applied (also written ``"h200-calibrated+mksim"``).

    A hardware file describes the GPU; a profile (``hwmodels/profiles/<name>.toml``) describes a
    kernel library's device functions on it: each op kind's task costs and bytes in flight, as
    measured on single ops on the GPU it names (``measured_on``). On another GPU the costs that
    are work on the SM scale with the clock (``task_fixed_us``, ``task_row_us``); rates and bytes
    in flight are kept. Without a profile the model is the best kernels the chip allows.

    Example::

        >>> import hwmodels
        >>> round(hwmodels.load("h200").dram.bandwidth_spec_GBps)
        4800
        >>> g = hwmodels.load("h200-calibrated+mksim")
        >>> g.name, g.profile, g.kernels.per_kind["matmul"].task_fixed_us
        ('h200-calibrated+mksim', 'mksim', 3.159)
    """
    text = str(name_or_path)
    if profile is None:
        text, profile = split_profile(text)
    path = resolve(text)
    hit = _LOADED.get((path, profile))
    if hit is not None and hit[0] == _stamps(f for f, _, _ in hit[0]):
        return hit[1]
    spec, files = _load(path, profile)
    if len(_LOADED) >= _PARSED_MAX:
        _LOADED.clear()
    _LOADED[path, profile] = (_stamps(files), spec)
    return spec


def _load(path: Path, profile: str | None) -> tuple[GPUSpec, list[str]]:
    """The model of hardware file ``path`` with ``profile`` applied, and the files it was read from."""
    raw = _merged(path, chain=())
    own = raw.pop("profile", None)
    if own is not None and not isinstance(own, str):
        raise HardwareFileError(f"{path}: key 'profile' must be a profile name; known: {', '.join(profiles())}")
    if profile is not None:
        raw = _with_profile(raw, profile, path)
        raw["name"] = f"{raw['name']}+{profile}"
    elif own:
        raw = _with_profile(raw, own, path)
    return _build(raw, path), list(raw.get("_files", [str(path)]))


#: loaded models by (hardware file, profile) with the stamps of the files each was read from: a GPUSpec is
#: frozen, so one object serves every caller (a compare, a search, the explorer load the same GPU hundreds
#: of times) for as long as none of its files changes
_LOADED: dict[tuple[Path, str | None], tuple[tuple[tuple[str, int, int], ...], GPUSpec]] = {}


def _stamps(files: Iterable[str]) -> tuple[tuple[str, int, int], ...]:
    """(path, modification time, size) of each file; a file that cannot be read stamps as (path, -1, -1)."""
    out = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((f, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((f, -1, -1))
    return tuple(out)


def hardware_validation(name_or_path: str | Path) -> dict[str, Any] | None:
    """A hardware file's own ``[validation]`` table: how predictions with that file and no
    implementation profile held against measured steps (the datasheet H200's, ``h200-datasheet``, against
    our H200's), or ``None`` where the file has none. A record describes the file it is in: an overlay
    does not inherit its base's. The same keys as a profile's (:func:`profile_info`).

    >>> hardware_validation("h200-datasheet")["gpu"], hardware_validation("h100")
    ('h200-calibrated', None)
    """
    path = resolve(split_profile(str(name_or_path))[0])
    return _validation(_read(path).get("validation"), path)


def profile_info(name_or_path: str | Path) -> dict[str, Any]:
    """A profile's identity, ``{"profile", "full_name", "measured_on", "kind"}`` (strings; ``kind``: a
    ``stack`` people run or a ``megakernel``'s device functions), and
    ``"validation"``: its ``[validation]`` table — how its predictions held against measured cases
    on ``gpu`` (``cases``, ``mape_pct``, ``bias_pct``, ``p90_abs_pct``, ``max_abs_pct`` of the signed
    errors (predicted - measured) / measured in %, and the ``source`` summary and ``command`` that
    produced them) — or ``None`` where the profile has none.

    >>> profile_info("mksim")["measured_on"]
    'h200-calibrated'
    >>> sorted(profile_info("torch")["validation"])[:3]
    ['bias_pct', 'cases', 'command']
    """
    path = resolve_profile(name_or_path)
    prof = _read(path)
    info: dict[str, Any] = {k: str(prof.get(k, "")) for k in ("profile", "full_name", "measured_on")}
    info["kind"] = _profile_kind(prof, path)
    info["mode"] = _stack_mode(prof, path)
    info["validation"] = _validation(prof.get("validation"), path)
    return info


def _stack_mode(prof: dict[str, Any], path: Path) -> str:
    """The mode a stack's step runs in (:data:`STACK_MODES`; ``graph`` where the profile says none)."""
    mode = prof.get("mode", "graph")
    if mode not in STACK_MODES:
        raise HardwareFileError(f"{path}: mode must be one of {', '.join(STACK_MODES)}, got {mode!r}")
    return str(mode)


def _profile_kind(prof: dict[str, Any], path: Path) -> str:
    """A profile's ``kind`` (:data:`PROFILE_KINDS`; ``stack`` where it says none)."""
    kind = prof.get("kind", "stack")
    if kind not in PROFILE_KINDS:
        raise HardwareFileError(f"{path}: kind must be one of {', '.join(PROFILE_KINDS)}, got {kind!r}")
    return str(kind)


def _validation(table: Any, path: Path) -> dict[str, Any] | None:
    """A profile's ``[validation]`` table, checked (one-line errors), or ``None`` where it has none."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise HardwareFileError(f"{path}: validation must be a table")
    known = set(_VALIDATION_NUMBERS) | set(_VALIDATION_TEXT) | set(VALIDATION_FAMILIES)
    for key in table:
        if key not in known:
            raise HardwareFileError(_unknown_key(str(path), "validation", key, known))
    out = _record(table, path, "validation", _VALIDATION_REQUIRED)
    for fam in VALIDATION_FAMILIES:
        if fam in table:
            sub = table[fam]
            if not isinstance(sub, dict):
                raise HardwareFileError(f"{path}: validation.{fam} must be a table")
            for key in sub:
                if key not in set(_VALIDATION_NUMBERS) | set(_VALIDATION_TEXT):
                    raise HardwareFileError(_unknown_key(str(path), f"validation.{fam}", key,
                                                        set(_VALIDATION_NUMBERS) | set(_VALIDATION_TEXT)))
            out[fam] = _record(sub, path, f"validation.{fam}", _FAMILY_REQUIRED)
    return out


def _record(table: dict[str, Any], path: Path, where: str, required: tuple[str, ...]) -> dict[str, Any]:
    """One validation record's numbers and text, checked (one-line errors)."""
    for key in required:
        if key not in table:
            raise HardwareFileError(f"{path}: {where}.{key} missing")
    out: dict[str, Any] = {}
    for key, kind in _VALIDATION_NUMBERS.items():
        if key not in table:
            continue
        v = table[key]
        ok = isinstance(v, int) if kind is int else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok or not math.isfinite(v) or (key != "bias_pct" and v < 0):
            what = ("a whole number" if kind is int else "a number") + ("" if key == "bias_pct" else " >= 0")
            raise HardwareFileError(f"{path}: {where}.{key} must be {what}, got {v!r}")
        out[key] = kind(v)
    if out["cases"] < 1:
        raise HardwareFileError(f"{path}: {where}.cases must be at least 1, got {out['cases']}")
    for key in _VALIDATION_TEXT:
        if key in table:
            if not isinstance(table[key], str) or not table[key]:
                raise HardwareFileError(f"{path}: {where}.{key} must be a non-empty string")
            out[key] = table[key]
    return out


def resolve_profile(name_or_path: str | Path) -> Path:
    """The file behind a profile name or path; unknown names list the known ones."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text or len(text) > 255:
        return input_file(text, error=HardwareFileError,
                          missing=f"no such profile file; give a .toml path or one of: {', '.join(profiles())}")
    cand = PROFILE_DIR / f"{text.lower()}.toml"
    if cand.is_file():
        return cand
    raise UnknownGPUError("implementation profile", text, profiles())


def _with_profile(raw: dict[str, Any], name: str, gpu_path: Path) -> dict[str, Any]:
    """``raw`` (a merged hardware file) with the profile's ``[runtime.kernels.<kind>]`` tables in
    place of its own, their clocked costs scaled from the GPU the profile was measured on."""
    path = resolve_profile(name)
    prof = _read(path)
    unknown = set(prof) - _PROFILE_KEYS
    if unknown:
        raise HardwareFileError(f"{path}: unknown top-level key {sorted(unknown)[0]!r}; a profile has "
                                f"{', '.join(sorted(_PROFILE_KEYS))}")
    for key in ("profile", "full_name", "measured_on"):
        if not isinstance(prof.get(key), str) or not prof[key]:
            raise HardwareFileError(f"{path}: missing key {key!r} (a non-empty string)")
    _profile_kind(prof, path)
    _stack_mode(prof, path)
    _validation(prof.get("validation"), path)
    kernels = prof.get("runtime", {}).get("kernels")
    if not isinstance(kernels, dict) or set(prof.get("runtime", {})) - {"kernels"}:
        raise HardwareFileError(f"{path}: a profile holds [runtime.kernels.<kind>] tables and nothing else "
                                "under runtime")
    measured = load(prof["measured_on"])
    target_MHz = raw.get("chip", {}).get("sm", {}).get("clock_boost_MHz", {}).get("value")
    ratio = measured.sm.clock_boost_MHz / target_MHz if isinstance(target_MHz, (int, float)) and target_MHz else 1.0
    tables: dict[str, Any] = {}
    for kind, table in kernels.items():
        if isinstance(table, dict) and "value" in table:  # a [runtime.kernels] number, e.g. the ring's copies
            tables[kind] = table
            continue
        if not isinstance(table, dict):
            raise HardwareFileError(f"{path}: runtime.kernels.{kind} must be a table of task costs")
        out = {}
        for key, entry in table.items():
            if key in _CLOCKED and ratio != 1.0 and isinstance(entry, dict) and isinstance(entry.get("value"),
                                                                                         (int, float)):
                note = f"{entry.get('note', '')} (scaled by the clock from {prof['measured_on']}: x {ratio:.4f})"
                entry = {**entry, "value": entry["value"] * ratio, "note": note.strip()}
            out[key] = entry
        tables[kind] = out
    merged = dict(raw)
    runtime = dict(merged.get("runtime", {}))
    runtime["kernels"] = {k: v for k, v in runtime.get("kernels", {}).items()
                          if not (isinstance(v, dict) and "value" not in v)} | tables
    merged["runtime"] = runtime
    merged["sources"] = {**raw.get("sources", {}), **prof.get("sources", {})}
    merged["full_name"] = f"{raw['full_name']} running {prof['full_name']}"
    merged["_files"] = [*raw.get("_files", [str(gpu_path)]), str(path)]
    merged["_profile"] = prof["profile"]
    return merged


#: parsed TOML files by (resolved path, modification time, size): a process that loads the same GPU
#: and profile files again and again (compare's stack row, a search, the explorer) parses each once
_PARSED: dict[tuple[Path, int, int], dict[str, Any]] = {}
_PARSED_MAX = 64


def _read(path: Path) -> dict[str, Any]:
    """The file's TOML table, a fresh copy each call (callers change it)."""
    try:
        st = path.stat()
        key = (path.resolve(), st.st_mtime_ns, st.st_size)
    except (OSError, RuntimeError):  # missing, unreadable, a link loop: _parse says so in one line
        return _parse(path)
    if key not in _PARSED:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = _parse(path)
    return copy.deepcopy(_PARSED[key])


def _parse(path: Path) -> dict[str, Any]:
    data = read_bytes(path, limit=TOML_LIMIT_B, error=HardwareFileError, missing="no such hardware file")
    try:
        return tomllib.loads(data.decode())
    except tomllib.TOMLDecodeError as exc:
        raise HardwareFileError(f"{path}: not valid TOML ({exc}); fix the syntax") from None
    except UnicodeDecodeError as exc:  # binary or UTF-16: TOML is UTF-8 text
        raise HardwareFileError(f"{path}: not valid TOML (not UTF-8 text: {exc.reason} at byte {exc.start}); "
                                "save it as UTF-8") from None
    except RecursionError:
        raise HardwareFileError(f"{path}: not valid TOML (nested too deeply); this is not a hardware file") from None


def _merged(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """The file's table merged over the base it ``extends`` (recursively)."""
    if path.resolve() in chain:
        names = " -> ".join(str(p) for p in (*chain, path.resolve()))
        raise HardwareFileError(f"{path}: 'extends' forms a cycle ({names}); remove one link")
    raw = _read(path)
    _migrate_kernels(raw, path)
    base_name = raw.get("extends")
    if base_name is None:
        raw["_files"] = [str(path)]
        return raw
    if not isinstance(base_name, str):
        raise HardwareFileError(f"{path}: key 'extends' must be a model name or path string")
    base_path = Path(base_name)
    if not base_path.is_absolute() and _is_file(path.parent / base_path):
        base_path = path.parent / base_path
    try:
        base_file = resolve(base_path if _is_file(base_path) else base_name)
    except UnknownGPUError as exc:
        raise HardwareFileError(f"{path}: 'extends' names unknown model {base_name!r}; known: "
                                f"{', '.join(exc.known)}") from None
    base = _merged(base_file, (*chain, path.resolve()))
    base.pop("validation", None)  # a record describes the file it is in, not the overlays of it
    files = base.pop("_files") + [str(path)]
    merged = _deep_merge(base, raw)
    merged["_files"] = files
    merged["extends"] = base.get("name", base_name)
    return merged


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if k in out and isinstance(out[k], dict) and isinstance(v, dict) and "value" not in v:
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _has_table(raw: dict[str, Any], dotted: str) -> bool:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _table(raw: dict[str, Any], dotted: str, file: str) -> dict[str, Any]:
    node: Any = raw
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            raise HardwareFileError(f"{file}: missing table [{dotted}]; see hwmodels/data/h200.toml "
                                    "for the layout")
    if not isinstance(node, dict):
        raise HardwareFileError(f"{file}: [{dotted}] must be a table")
    return node


def _build(raw: dict[str, Any], path: Path) -> GPUSpec:
    file = " + ".join(raw.get("_files", [str(path)]))
    here = str(path)
    unknown = set(raw) - _TOP_KEYS - {"_files", "_profile"}
    if unknown:
        key = sorted(unknown)[0]
        raise HardwareFileError(f"{here}: unknown top-level key {key!r}; expected one of "
                                f"{', '.join(sorted(_TOP_KEYS))}")
    for key in IDENTITY_KEYS:
        if key not in raw:
            raise HardwareFileError(f"{file}: missing key {key!r} (a non-empty string)")
        if not isinstance(raw[key], str) or not raw[key]:
            raise HardwareFileError(f"{file}: {key} = {raw[key]!r}; expected a non-empty string")

    sources = _sources(raw.get("sources", {}), file)
    provenance: dict[str, str] = {}
    sections: dict[str, Any] = {}
    subtables = {p.split(".", 1)[1] for p, _ in SECTIONS.values() if "." in p}
    seen_tables: set[str] = set()
    for attr, (dotted, cls) in SECTIONS.items():
        seen_tables.add(dotted)
        if dotted in ABSENT_TABLES and not _has_table(raw, dotted):
            sections[attr] = None
            continue
        table = {} if dotted in OPTIONAL_TABLES and not _has_table(raw, dotted) else _table(raw, dotted, file)
        expected = {f.name for f in section_fields(cls)} | {f.name for f in text_fields(cls)}
        nested = {k for k in table if isinstance(table[k], dict) and "value" not in table[k]}
        kinds = nested - expected if cls is KernelSpec else set()  # [runtime.kernels.<kind>] tables
        for key in sorted(set(table) - expected - (nested & subtables) - kinds):
            raise HardwareFileError(_unknown_key(file, dotted, key, expected)
                                    + (", or a [runtime.kernels.<kind>] table" if cls is KernelSpec else ""))
        values: dict[str, Any] = {f.name: _text(table.get(f.name), f"{dotted}.{f.name}", f.metadata, sources, file)
                                   for f in text_fields(cls)}
        for f in text_fields(cls):
            provenance[f"{attr}.{f.name}"] = table[f.name]["source"]
        if kinds:
            values["per_kind"] = {kind: _kernel_cost(table[kind], f"{dotted}.{kind}", sources, provenance, file)
                                  for kind in table if kind in kinds}
        for f in section_fields(cls):
            full = f"{dotted}.{f.name}"
            entry = table.get(f.name)
            if entry is None:
                if f.metadata["optional"]:
                    values[f.name] = None
                    continue
                raise HardwareFileError(f"{file}: missing key {full} ({f.metadata['doc'] or 'a number'}, "
                                        f"in {UNITS.get(unit_of(f.name), unit_of(f.name))}, with a source)")
            values[f.name] = _number(entry, full, f.metadata, sources, file)
            provenance[f"{attr}.{f.name}"] = entry["source"]
        sections[attr] = cls(**values)
    for top in ("chip", "memory", "runtime"):
        for key, val in raw.get(top, {}).items():
            if f"{top}.{key}" not in seen_tables and isinstance(val, dict) and "value" not in val:
                raise HardwareFileError(f"{file}: unknown table [{top}.{key}]; expected one of "
                                        f"{', '.join(sorted(p for p, _ in SECTIONS.values()))}")
    spec = GPUSpec(name=raw["name"], full_name=raw["full_name"], vendor=raw["vendor"],
                   architecture=raw["architecture"], sources=sources, provenance=provenance,
                   path=str(path), extends=raw.get("extends", ""), profile=raw.get("_profile", ""), **sections)
    _check_consistency(spec, file)
    return spec


def _kernel_cost(table: dict[str, Any], dotted: str, sources: dict[str, Source], provenance: dict[str, str],
                 file: str) -> KernelCost:
    """One ``[runtime.kernels.<kind>]`` table; any kind name is read (mksim checks them)."""
    kind = dotted.rsplit(".", 1)[1]
    if not kind.isidentifier() or not kind.islower():
        raise HardwareFileError(f"{file}: [{dotted}]: an op kind is a lower-case name (matmul, rope_kv), "
                                f"not {kind!r}")
    for key in sorted(set(table) - set(KERNEL_COST_KEYS)):
        raise HardwareFileError(_unknown_key(file, dotted, key, set(KERNEL_COST_KEYS)))
    values: dict[str, Any] = {}
    for f in fields(KernelCost):
        entry = table.get(f.name)
        if entry is None:
            values[f.name] = None
            continue
        values[f.name] = _number(entry, f"{dotted}.{f.name}", f.metadata, sources, file)
        provenance[f"kernels.{kind}.{f.name}"] = entry["source"]
    return KernelCost(**values)


def _migrate_kernels(raw: dict[str, Any], path: Path) -> None:
    """Files written before ``[runtime.kernels.<kind>]`` tables named a kind's task costs
    ``<kind>_task_fixed_us`` (and so on) in ``[runtime.kernels]``: move them into the kind's
    table, in place, before the file is merged with its base (so an overlay's old key overrides
    its base's new one)."""
    runtime = raw.get("runtime")
    table = runtime.get("kernels") if isinstance(runtime, dict) else None
    if not isinstance(table, dict):
        return
    standalone = {f.name for f in section_fields(KernelSpec)}
    for key in list(table):
        entry = table[key]
        if key in standalone or not isinstance(entry, dict) or "value" not in entry:
            continue
        for cost_key in KERNEL_COST_KEYS:
            kind = key.removesuffix(f"_{cost_key}")
            if kind == key or not kind:
                continue
            kind_table = table.setdefault(kind, {})
            if not isinstance(kind_table, dict) or "value" in kind_table:
                raise HardwareFileError(f"{path}: runtime.kernels.{kind} must be a table of task costs, like "
                                        f"[runtime.kernels.{kind}] {cost_key} = {{ value = ..., source = ... }}")
            if cost_key in kind_table:
                raise HardwareFileError(f"{path}: runtime.kernels.{key} and [runtime.kernels.{kind}] {cost_key} "
                                        "give the same number; keep the table")
            kind_table[cost_key] = table.pop(key)
            break


def _unknown_key(file: str, table: str, key: str, expected: set[str]) -> str:
    stem = key.rsplit("_", 1)[0]
    known_units = set(UNITS) | {"GHz", "kHz", "Hz", "KB", "MB", "TB", "TBps", "MBps", "ms", "s", "PFLOPs",
                                "GFLOPs", "GiB", "bytes", "percent"}
    for name in sorted(expected) if unit_of(key) in known_units else ():
        if name.rsplit("_", 1)[0] == stem:
            return (f"{file}: key {table}.{key} has unit {unit_of(key)!r} but mksim expects "
                    f"{unit_of(name)!r}; convert the value and name it {name}")
    return f"{file}: unknown key {table}.{key}; expected one of {', '.join(sorted(expected))}"


def _sources(table: Any, file: str) -> dict[str, Source]:
    if not isinstance(table, dict) or not table:
        raise HardwareFileError(f"{file}: missing [sources.<id>] tables; every number needs a source")
    out = {}
    for sid, body in table.items():
        if not isinstance(body, dict):
            raise HardwareFileError(f"{file}: [sources.{sid}] must be a table with kind and title")
        kind = body.get("kind")
        if kind not in SOURCE_KINDS:
            raise HardwareFileError(f"{file}: sources.{sid}.kind is {kind!r}; expected one of "
                                    f"{', '.join(SOURCE_KINDS)}")
        if not body.get("title"):
            raise HardwareFileError(f"{file}: sources.{sid} needs a title")
        extra = set(body) - {"kind", "title", "url", "date", "note"}
        if extra:
            raise HardwareFileError(f"{file}: unknown key sources.{sid}.{sorted(extra)[0]}; expected "
                                    "kind, title, url, date, note")
        if kind == "measured" and not body.get("date"):
            raise HardwareFileError(f"{file}: measured source {sid!r} needs a date (when it was measured)")
        out[sid] = Source(id=sid, kind=kind, title=body["title"], url=body.get("url", ""),
                          date=str(body.get("date", "")), note=body.get("note", ""))
    return out


def _number(entry: Any, key: str, md: Mapping[str, Any], sources: dict[str, Source], file: str) -> float | int:
    if not isinstance(entry, dict) or "value" not in entry:
        raise HardwareFileError(f"{file}: {key} must be {{ value = <number>, source = \"<id>\" }}")
    extra = set(entry) - _ENTRY_KEYS
    if extra:
        raise HardwareFileError(f"{file}: {key} has unknown field {sorted(extra)[0]!r}; expected "
                                "value, source, note, spread")
    src = entry.get("source")
    if src not in sources:
        raise HardwareFileError(f"{file}: {key} names source {src!r}, which has no [sources.{src}] table"
                                if src else f"{file}: {key} has no source; add source = \"<id>\"")
    val = entry["value"]
    lo, hi = md["range"]
    unit = UNITS.get(unit_of(key), unit_of(key))
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
        raise HardwareFileError(f"{file}: {key} = {val!r} is not a number; expected {unit} "
                                f"between {lo:g} and {hi:g}")
    if md["integer"] and int(val) != val:
        raise HardwareFileError(f"{file}: {key} = {val} must be a whole number")
    if not lo <= val <= hi:
        what = "negative" if val < 0 else "implausible"
        raise HardwareFileError(f"{file}: {key} = {val:g} is {what}; expected {unit} between "
                                f"{lo:g} and {hi:g}")
    return int(val) if md["integer"] else float(val)


def _text(entry: Any, key: str, md: Mapping[str, Any], sources: dict[str, Source], file: str) -> str:
    """A text field: ``{ value = "<one of its choices>", source = "<id>" }``."""
    choices = ", ".join(md["choices"])
    if not isinstance(entry, dict) or "value" not in entry:
        raise HardwareFileError(f"{file}: {key} must be {{ value = \"<{' | '.join(md['choices'])}>\", "
                                "source = \"<id>\" }")
    extra = set(entry) - {"value", "source", "note"}
    if extra:
        raise HardwareFileError(f"{file}: {key} has unknown field {sorted(extra)[0]!r}; expected value, source, note")
    if entry.get("source") not in sources:
        raise HardwareFileError(f"{file}: {key} has no source; add source = \"<id>\" with a [sources.<id>] table")
    if entry["value"] not in md["choices"]:
        raise HardwareFileError(f"{file}: {key} = {entry['value']!r}; expected one of {choices}")
    return str(entry["value"])


def _check_consistency(spec: GPUSpec, file: str) -> None:
    if spec.sm.shared_memory_per_block_KiB > spec.sm.shared_memory_per_sm_KiB:
        raise HardwareFileError(f"{file}: chip.sm.shared_memory_per_block_KiB exceeds "
                                "shared_memory_per_sm_KiB; a block cannot use more than its SM has")
    node = spec.node
    if node is not None and not math.isclose(node.bandwidth_per_direction_GBps,
                                             node.links_count * node.link_bandwidth_GBps, rel_tol=0.02):
        raise HardwareFileError(f"{file}: interconnect.bandwidth_per_direction_GBps = "
                                f"{node.bandwidth_per_direction_GBps:g} is not links_count x link_bandwidth_GBps "
                                f"({node.links_count} x {node.link_bandwidth_GBps:g}); fix one of them")
    peak_per_sm = spec.dram.bandwidth_spec_GBps
    if spec.concurrency.per_sm_bandwidth_max_GBps > peak_per_sm:
        raise HardwareFileError(f"{file}: memory.concurrency.per_sm_bandwidth_max_GBps exceeds the "
                                "chip's DRAM bandwidth; one SM cannot draw more than the chip")

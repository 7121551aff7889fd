"""From raw calibration results to hardware-model parameters and an overlay file (pure).

``params(raw)`` fits one run; ``combine(runs)`` merges several runs of the same GPU into one
value per parameter with its spread; ``overlay_text`` writes the TOML overlay that extends the
base model. No GPU here: CI tests all of it on synthetic raw results.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from mksim.errors import MksimError

from .fit import fit_boundary, fit_boundary_parts, fit_concurrency, stat, tflops

# Device-name fragments -> built-in hardware model (first match wins).
BASES = (("H200", "h200-datasheet"), ("H100", "h100"), ("A100", "a100"), ("B200", "b200"), ("L40S", "l40s"),
         ("RTX 4090", "rtx4090"), ("MI300X", "mi300x"))


# raw runs record the datasheet file they were fitted against; those from before 2026-12-03 name the
# H200's "h200", which is now the validated target (the calibrated H200 with mksim's kernels)
RENAMED = {"h200": "h200-datasheet"}


def base_model(device_name: str) -> str:
    """The built-in model a device belongs to, from its name."""
    for frag, name in BASES:
        if frag.lower() in device_name.lower():
            return name
    known = ", ".join(n for _, n in BASES)
    raise MksimError(f"cannot tell which hardware model {device_name!r} is; pass --base with one of: {known}")


@dataclass(frozen=True)
class Param:
    """One fitted number: its dotted key in the data file, value, relative spread and a note."""
    key: str          # e.g. "memory.dram.latency_ns"
    value: float
    spread: float
    note: str
    source: str = "calibration"  # "mechanisms": fitted to the mechanism microbenchmarks (validation.mechanisms)


def _med(samples) -> float:
    return stat(samples).median


def _p(key: str, value: float, samples_or_spread, note: str, digits: int = 4) -> Param:
    spread = (samples_or_spread if isinstance(samples_or_spread, float) else stat(samples_or_spread).spread)
    return Param(key, float(f"{value:.{digits}g}"), round(float(spread), 4), note)


def _gbps(nbytes: float, us: float) -> float:
    return nbytes / us / 1e3


def params(raw: dict, spec_GBps: float) -> tuple[list[Param], dict]:
    """Parameters fitted from one run's raw results, and the fits behind them (for reports).

    ``spec_GBps`` is the base model's datasheet DRAM bandwidth (reachable fraction = read / spec).
    """
    out: list[Param] = []
    fits: dict = {}
    mem = raw.get("memory")
    if mem:
        read = [_gbps(mem["read_bytes"], t) for t in mem["read_us"]]
        copy = [_gbps(mem["copy_bytes"], t) for t in mem["copy_us"]]
        l2 = [_gbps(mem["l2_bytes"], t) for t in mem["l2_us"]]
        fits["read_GBps"], fits["copy_GBps"], fits["l2_GBps"] = _med(read), _med(copy), _med(l2)
        out.append(_p("memory.dram.reachable_fraction", min(_med(read) / spec_GBps, 1.0), read,
                      f"read-only stream over {mem['buffer_bytes'] / 2**30:.0f} GiB: {_med(read):.0f} GB/s of "
                      f"{spec_GBps:.0f}; copy {_med(copy):.0f} GB/s counting read + write"))
        out.append(_p("memory.l2.bandwidth_GBps", _med(l2), l2,
                      f"repeated passes over {mem['l2_region_bytes'] / 2**20:.0f} MiB, all SMs"))
    lat = raw.get("latency")
    if lat:
        chase = {r["size_bytes"]: r["ns_per_load"] for r in lat["chase"]}
        fits["chase_ns"] = {str(k): _med(v) for k, v in chase.items()}
        l2_size = 8 << 20 if (8 << 20) in chase else min(chase)
        dram_size = 1 << 30 if (1 << 30) in chase else max(chase)
        out.append(_p("memory.l2.latency_ns", _med(chase[l2_size]), chase[l2_size],
                      f"pointer chase over {l2_size >> 20} MiB (L2-resident), one dependent load per 128 B line"))
        big = max(chase)
        out.append(_p("memory.dram.latency_ns", _med(chase[dram_size]), chase[dram_size],
                      f"pointer chase over {dram_size >> 20} MiB after an L2 flush; over {big >> 20} MiB "
                      f"{_med(chase[big]):.0f} ns (TLB misses)"))
    conc = raw.get("concurrency")
    if conc:
        # The same bytes in flight can come from more warps or more loads per warp; the fit takes the
        # best split at each point (what a well-built kernel reaches), as the simulator assumes.
        best: dict[tuple[int, int], tuple[float, float]] = {}
        for p in conc["points"]:
            st = stat(p["us"])
            bw = _gbps(p["bytes"], st.median)
            point = (p["sms"], p["inflight_bytes"])
            if bw > best.get(point, (0.0, 0.0))[0]:
                best[point] = (bw, st.spread)
        keys = sorted(best)
        fit = fit_concurrency([k[0] for k in keys], [k[1] for k in keys], [best[k][0] for k in keys])
        fits["concurrency"] = {**asdict(fit), "knee_KiB": fit.knee_KiB}
        spread = max(v[1] for v in best.values())
        note = (f"fit of {len(keys)} points (active SMs x bytes in flight per SM, best warps x loads split): "
                f"latency under load {fit.latency_ns:.0f} ns, chip {fit.chip_max_GBps:.0f} GB/s, "
                f"rms log error {fit.rms_log_err:.3f}")
        out.append(_p("memory.concurrency.per_sm_bandwidth_max_GBps", fit.per_sm_max_GBps, spread, note))
        out.append(_p("memory.concurrency.max_inflight_per_sm_KiB", fit.knee_KiB, spread,
                      "in-flight bytes at which one SM reaches its cap (per-SM cap x latency under load)"))
    bnd = raw.get("boundary")
    if bnd:
        rows = bnd["boundary"]
        x = [r["bytes"] for r in rows]
        alone = fit_boundary(x, [_med(r["alone_us"]) for r in rows])
        graph = fit_boundary(x, [_med(r["graph_per_kernel_us"]) for r in rows])
        fits["boundary_alone"], fits["boundary_graph"] = asdict(alone), asdict(graph)
    parts = raw.get("boundary_parts")
    if parts:
        # boundary_parts.cu: the empty-kernel chains and a 64 KiB read chain, graph and PDL
        bp = fit_boundary_parts(parts["rows"], spec_GBps)
        fits["boundary_parts"] = asdict(bp)
        where = f"{raw['meta'].get('host', 'another GPU')}, boundary_parts.cu"
        plain = bp.block_setup_us + bp.first_load_us
        out.append(_p("runtime.launch.block_setup_us", bp.block_setup_us, bp.block_setup_spread,
                      f"{where}: 16-kernel chains reading {bp.read_bytes / 1024:.0f} KiB per kernel, each minus 16 "
                      f"empty kernels: {plain:.2f} us in a plain graph, {bp.first_load_us:.2f} us under PDL with the "
                      "blocks resident and waiting; the difference is a block's set-up before its first load",
                      digits=3))
        out.append(_p("runtime.launch.first_load_us", bp.first_load_us, bp.first_load_spread,
                      f"{where}: the PDL chain (blocks resident, waiting for their predecessor) minus 16 empty PDL "
                      "kernels and the bytes at the datasheet bandwidth: a fresh kernel's first DRAM load",
                      digits=3))
    launch = raw.get("launch")
    if launch:
        out.append(_p("runtime.launch.stream_launch_us", _med(launch["host_launch_us"]), launch["host_launch_us"],
                      "host-side interval of back-to-back cudaLaunchKernel calls from C++"))
        out.append(_p("runtime.launch.stream_gap_us", _med(launch["stream_gap_us"]), launch["stream_gap_us"],
                      f"GPU-side interval of {launch['sms']}-block empty kernels queued behind a spinning kernel "
                      f"(1 block: {_med(launch['stream_gap_1block_us']):.2f} us)"))
        out.append(_p("runtime.launch.graph_node_us", _med(launch["graph_node_us"]), launch["graph_node_us"],
                      "replay of a CUDA graph of 200 dependent empty kernels, per node"))
        out.append(_p("runtime.launch.pdl_node_us", _med(launch["graph_pdl_node_us"]), launch["graph_pdl_node_us"],
                      "the same graph captured with programmatic stream serialisation (trigger first, then wait); "
                      f"from a stream: {_med(launch['stream_pdl_gap_us']):.2f} us"))
        out.append(_p("runtime.launch.launch_latency_us", _med(launch["single_launch_us"]),
                      launch["single_launch_us"], "one empty kernel: launch to cudaStreamSynchronize return, idle"))
        chains: dict[str, list] = {}
        for r in launch.get("memory_chain", []):
            chains.setdefault(r["mode"], []).append(r)
        for mode, rows in chains.items():
            if len(rows) >= 2:
                fits[f"chain_{mode}"] = asdict(fit_boundary([r["bytes"] for r in rows], [_med(r["us"]) for r in rows]))
        grid_sync = {r["blocks_per_sm"]: r["us"] for r in launch.get("grid_sync", [])}
        fits["grid_sync_us"] = {str(k): _med(v) for k, v in grid_sync.items()}
        if 1 in grid_sync:
            more = ", ".join(f"{k}/SM {_med(v):.2f}" for k, v in sorted(grid_sync.items()) if k > 1)
            out.append(_p("runtime.sync.grid_barrier_us", _med(grid_sync[1]), grid_sync[1],
                          f"cooperative grid.sync() with 1 block per SM ({more} us)"))
    sync = raw.get("sync")
    if sync:
        fits["counter_barrier_us"] = _med(sync["counter_barrier_us"])
        out.append(_p("runtime.sync.flag_latency_ns", _med(sync["flag_one_way_ns"]), sync["flag_one_way_ns"],
                      "release store to acquire load between two SMs (ping-pong, one way); counter barrier "
                      f"over all SMs {_med(sync['counter_barrier_us']):.2f} us"))
        out.append(_p("runtime.sync.atomic_roundtrip_ns", _med(sync["atomic_roundtrip_ns"]),
                      sync["atomic_roundtrip_ns"], "chain of dependent global atomicAdd by one thread"))
    comp = raw.get("compute")
    if comp:
        fma = [tflops(comp["fma_flops"], t) for t in comp["fma_us"]]
        out.append(_p("chip.compute.vector_fp32_TFLOPs", _med(fma), fma, "fp32 FMA, 8 independent chains per thread"))
        if comp.get("sm_clock_MHz"):
            out.append(_p("chip.sm.clock_boost_MHz", comp["sm_clock_MHz"], 0.0,
                          "clock64 over %globaltimer during the FMA benchmark"))
        for name, key in (("bf16", "tensor_bf16_dense_TFLOPs"), ("fp16", "tensor_fp16_dense_TFLOPs"),
                          ("tf32", "tensor_tf32_dense_TFLOPs")):
            g = (comp.get("gemm") or {}).get(name)
            if g:
                r = [tflops(g["flops"], t) for t in g["us"]]
                out.append(_p(f"chip.compute.{key}", _med(r), r,
                              f"torch.matmul {g['n']}^3 on random data (relative error {g['rel_err']:.1e})"))
    dev = raw.get("device_functions")
    if dev and fits.get("read_GBps"):
        sms = raw.get("meta", {}).get("sms", 1)
        for fn in ("matvec", "rmsnorm", "attention"):
            # steady state: sizes whose grid fills the chip; smaller ones show the fixed cost alone
            rows = [r for r in dev["device_functions"] if r["fn"] == fn and r.get("grid", sms) >= sms]
            if len(rows) < 2:
                continue
            f = fit_boundary([r["bytes"] for r in rows], [_med(r["us"]) for r in rows])
            fits[f"{fn}_fit"] = asdict(f)
            spread = max(stat(r["us"]).spread for r in rows)
            frac = min(f.bandwidth_GBps / fits["read_GBps"], 1.0)
            out.append(_p(f"runtime.kernels.{fn}_bw_fraction", frac, spread,
                          f"standalone kernel at {len(rows)} chip-filling sizes: {f.bandwidth_GBps:.0f} GB/s "
                          f"steady; the line fixed + bytes/bandwidth is off by up to {f.max_rel_err:.0%}"))
            out.append(_p(f"runtime.kernels.{fn}_fixed_us", max(f.fixed_us, 0.0), spread,
                          "fixed cost of the standalone kernel (launch, first-byte latency, tail)"))
    return out, fits


def combine(runs: list[list[Param]]) -> list[Param]:
    """One parameter list from several runs: the mean value; the spread is the larger of the
    run-to-run range (max - min over the mean) and the largest within-run spread."""
    by_key: dict[str, list[Param]] = {}
    for run in runs:
        for p in run:
            by_key.setdefault(p.key, []).append(p)
    out = []
    for key, ps in by_key.items():
        vals = np.array([p.value for p in ps])
        mean = float(vals.mean())
        between = float(np.ptp(vals) / mean) if mean else 0.0
        spread = max(between, max(p.spread for p in ps))
        note = ps[0].note if len(ps) == 1 else f"{ps[0].note}; {len(ps)} runs, run-to-run {between:.1%}"
        out.append(Param(key, float(f"{mean:.4g}"), round(spread, 4), note))
    return out


def run_to_run(runs: list[list[Param]]) -> dict[str, float]:
    """Relative range of each parameter over the runs."""
    by_key: dict[str, list[float]] = {}
    for run in runs:
        for p in run:
            by_key.setdefault(p.key, []).append(p.value)
    return {k: float(np.ptp(v) / np.mean(v)) if np.mean(v) else 0.0 for k, v in by_key.items() if len(v) > 1}


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def overlay_text(ps: list[Param], *, base: str, name: str, full_name: str, device: str, driver: str,
                 date: str, raw_files: list[str], mechanisms: tuple[str, str] | None = None) -> str:
    """The calibrated overlay: ``extends = base``, every value sourced to this calibration (or, with
    ``mechanisms = (date, folder)``, to the mechanism microbenchmarks in that folder)."""
    lines = [f"# Calibrated overlay written by `mksim calibrate` on {device} ({date}).",
             "# Every value is measured; spread = the larger of the run-to-run range and the within-run",
             "# (p90 - p10) / median.",
             "schema_version = 1", f"name = {_toml_str(name)}", f"full_name = {_toml_str(full_name)}",
             f"extends = {_toml_str(base)}", ""]
    tables: dict[str, list[Param]] = {}
    for p in ps:
        table, key = p.key.rsplit(".", 1)
        tables.setdefault(table, []).append(p)
    for table in sorted(tables):
        lines.append(f"[{table}]")
        for p in tables[table]:
            key = p.key.rsplit(".", 1)[1]
            lines.append(f"{key} = {{ value = {p.value!r}, source = {_toml_str(p.source)}, spread = {p.spread!r}, "
                         f"note = {_toml_str(p.note)} }}")
        lines.append("")
    lines += ["[sources.calibration]", 'kind = "measured"',
              f"title = {_toml_str(f'mksim calibrate on {device} (driver {driver})')}",
              f"date = {_toml_str(date)}",
              f"note = {_toml_str('raw results: ' + ', '.join(raw_files))}", ""]
    if mechanisms is not None:
        lines += ["[sources.mechanisms]", 'kind = "measured"',
                  f"title = {_toml_str(f'mechanism microbenchmarks on {device} (validation.mechanisms)')}",
                  f"date = {_toml_str(mechanisms[0])}",
                  f"note = {_toml_str('raw results and findings: ' + mechanisms[1] + ' (README.md)')}", ""]
    return "\n".join(lines)

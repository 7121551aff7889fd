"""Dynamic dispatch (MPK): scheduler warps hand each task to a worker SM when its event fires."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hwmodels import GPUSpec
from mksim.errors import ScheduleError

from .._designs import BaseDesign, register_design
from .._policies import RoundRobin
from .sync import Counter

if TYPE_CHECKING:
    from .._schedule import Options, Schedule

DISPATCHES = ("static", "dynamic")
# MPK's split of an NVIDIA GPU's SMs (python/mirage/utils.py, get_configurations_from_gpu): worker
# SMs by SM count, and 4 scheduler warps on each SM left (workers + schedulers / 4 = SMs)
MPK_WORKERS = ((160, 144), (132, 128), (108, 96), (68, 64), (40, 30), (0, 20))
SCHEDULERS = (0, 4, 8, 16, 32)  # scheduler warps a search samples (0: MPK's rule)
PRELAUNCH = (0, 1, 2)           # events of look-ahead a search samples


def dispatch_layout(gpu: GPUSpec, schedulers: int = 0) -> tuple[int, int, int]:
    """Dynamic dispatch on ``gpu``: ``(worker SMs, scheduler warps, scheduler SMs)``.

    A scheduler is one warp; four share an SM on NVIDIA GPUs (MPK's rule: workers + schedulers / 4
    = SMs), one per compute unit on AMD's (MPK runs one scheduler block per XCD there).
    ``schedulers=0`` takes MPK's choice for the GPU: on NVIDIA 128 workers on 132 to 159 SMs, 96 on
    108 to 131 and so on (a GPU with too few SMs keeps one for 4 schedulers), on AMD one scheduler
    per die.

    >>> import hwmodels
    >>> dispatch_layout(hwmodels.load("h100")), dispatch_layout(hwmodels.load("b200"))
    ((128, 16, 4), (128, 80, 20))
    >>> dispatch_layout(hwmodels.load("mi300x")), dispatch_layout(hwmodels.load("h100"), 6)
    ((296, 8, 8), (130, 6, 2))
    """
    n = gpu.sm.count
    per_sm = 1 if gpu.vendor == "amd" else 4
    if isinstance(schedulers, bool) or not isinstance(schedulers, int) or schedulers < 0:
        raise ScheduleError(f"schedulers must be a whole number >= 0 (0: MPK's rule), got {schedulers!r}")
    if schedulers == 0:
        if gpu.vendor == "amd":
            schedulers = gpu.interconnect.dies_count
        else:
            workers = min(next(w for lo, w in MPK_WORKERS if n >= lo), n - 1)
            schedulers = per_sm * (n - workers)
    sms = -(-schedulers // per_sm)
    if sms >= n:
        raise ScheduleError(f"{schedulers} scheduler warps take {sms} of the {n} SMs on {gpu.name}; leave one for "
                            "workers")
    return n - sms, schedulers, sms


@register_design
class DynamicDispatch(BaseDesign):
    """``dispatch="dynamic"``: ops are cut for the worker SMs and placed round robin unless told
    otherwise; ``schedulers`` and ``prelaunch`` apply to it alone."""

    name = "dynamic"
    option = "dispatch"
    value = "dynamic"
    compare_rows = (("megakernel:dynamic", {"dispatch": "dynamic"}),)
    choices = DISPATCHES

    def search_options(self) -> dict[str, Any]:
        return {}  # a study samples static or dynamic (suggest)

    def suggest(self, trial: Any, fixed: dict[str, Any], gpu: GPUSpec, included: bool) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        if included and self.option not in fixed:
            opts[self.option] = trial.suggest_categorical(self.option, DISPATCHES)
        if opts.get(self.option, fixed.get(self.option)) == self.value:  # MPK's knobs
            if "schedulers" not in fixed:
                opts["schedulers"] = trial.suggest_categorical("schedulers", SCHEDULERS)
            if "prelaunch" not in fixed:
                opts["prelaunch"] = trial.suggest_categorical("prelaunch", PRELAUNCH)
        return opts

    def settles(self, options: dict[str, Any]) -> dict[str, Any]:
        # tasks wait on event counters, and an L2 prefetcher walks static queues only
        return {"sync": Counter.name, "l2_prefetch_KiB": 0.0} if options.get(self.option) == self.value else {}

    def baseline_options(self, fixed: dict[str, Any]) -> dict[str, Any]:
        return {} if self.option in fixed else {self.option: DISPATCHES[0]}  # the other baselines: static

    def baselines(self, fixed: dict[str, Any], megakernel: dict[str, Any]) -> dict[str, dict[str, Any]]:
        if self.option in fixed:
            return {}
        # MPK at its defaults: round robin, MPK's schedulers, one event of prelaunch
        on = self.settles({self.option: self.value})
        params = {k: v for k, v in megakernel.items() if k not in on} | {self.option: self.value, "schedulers": 0,
                                                                        "prelaunch": 1}
        return {f"megakernel:{self.name}": {"policy": RoundRobin.name, **RoundRobin.baseline, **params}}

    def validate(self, schedule: Schedule) -> None:
        o = schedule.options
        if o.dispatch not in DISPATCHES:
            raise ScheduleError(f"dispatch must be one of {', '.join(DISPATCHES)}, got {o.dispatch!r}")
        if o.dispatch == "dynamic":
            if not self.applies_to(schedule.mode):
                raise ScheduleError(f"dispatch='dynamic' is a megakernel design; mode {schedule.mode} has no "
                                    "scheduler warps")
            if o.sync != Counter.name:
                raise ScheduleError(f"with dispatch='dynamic' tasks wait on event counters: sync must be "
                                    f"{Counter.name!r}, not {o.sync!r}")
            dispatch_layout(schedule.gpu, o.schedulers)
        elif o.schedulers != 0 or o.prelaunch != 1:
            raise ScheduleError(f"{'schedulers' if o.schedulers != 0 else 'prelaunch'} applies to "
                                "dispatch='dynamic' only")
        if isinstance(o.prelaunch, bool) or not isinstance(o.prelaunch, int) or o.prelaunch < 0:
            raise ScheduleError(f"prelaunch must be a whole number of events >= 0, got {o.prelaunch!r}")

    def tile_sms(self, gpu: GPUSpec, options: Options, n_sms: int) -> int:
        return dispatch_layout(gpu, options.schedulers)[0]

    def placement(self, schedule: Schedule, n_sms: int, default_policy: str) -> tuple[int, str]:
        schedule.validate_options()  # its errors before the layout's
        # the worker SMs, in MPK's round robin unless told otherwise
        return dispatch_layout(schedule.gpu, schedule.options.schedulers)[0], RoundRobin.name

    def check_queues(self, schedule: Schedule) -> None:
        workers, scheds, sms = dispatch_layout(schedule.gpu, schedule.options.schedulers)
        queues = schedule.queues or []
        if len(queues) > workers:
            raise ScheduleError(f"{len(queues)} queues, but dynamic dispatch leaves {workers} worker SMs "
                                f"({scheds} scheduler warps take {sms} of the {schedule.gpu.sm.count} SMs)")
        for sm, q in enumerate(queues):
            if any(a >= b for a, b in zip(q, q[1:], strict=False)):
                raise ScheduleError(f"SM {sm}: with dynamic dispatch a worker gets its tasks in the order their "
                                    "events fire, so its queue must list task ids in increasing order")

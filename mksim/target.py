"""What a prediction runs on: a :class:`Target`, a GPU's hardware file and the implementation profile
its kernels are priced with.

``GPU+PROFILE`` (``h200-calibrated+mksim``, ``path/to/gpu.toml+torch``) is read here and nowhere
else: :meth:`Target.parse` splits it (:func:`hwmodels.split_profile`), applies ``--impl`` where one
is given, and loads the files once; everything downstream takes the :class:`Target` or its
:class:`~hwmodels.GPUSpec`. This module is mksim's one call of :func:`hwmodels.load`
(``tests/test_architecture.py`` holds it to that).

``--impl PROFILE`` means the same on every command: the profile the prediction assumes, applied to
``--gpu`` (``--gpu h200 --impl torch`` is ``--gpu h200+torch``).

>>> t = Target.parse("h200-calibrated", impl="mksim")
>>> t.hardware, t.profile, t.name
('h200-calibrated', 'mksim', 'h200-calibrated+mksim')
>>> t.with_profile("torch").name, t.without_profile().name
('h200-calibrated+torch', 'h200-calibrated')
>>> "torch" in PROFILES, "h200" in GPUS
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import hwmodels
from hwmodels import GPUSpec
from mksim.errors import MksimError
from mksim.registry import Registry


def _profile_files() -> dict[str, Path]:
    return {name: hwmodels.resolve_profile(name) for name in hwmodels.profiles()}


def _gpu_files() -> dict[str, Path]:
    return {name: hwmodels.resolve(name) for name in hwmodels.available()}


GPUS: Registry[Path] = Registry("GPU", source=_gpu_files)
"""The built-in and calibrated hardware files (``hwmodels/data``, ``hwmodels/calibrated``: one file
each), by name."""
PROFILES: Registry[Path] = Registry("implementation profile", source=_profile_files)
"""The built-in implementation profiles (``hwmodels/profiles/<name>.toml``, one file each), by name."""


@dataclass(frozen=True)
class Target:
    """A GPU's hardware (``hardware``: a built-in name or a ``.toml`` path) with an implementation
    profile (``profile``: a name of :data:`PROFILES` or a ``.toml`` path; ``None``: the best kernels
    the chip allows), and ``spec``, the two loaded and merged."""

    hardware: str
    profile: str | None
    spec: GPUSpec = field(compare=False, repr=False)

    @classmethod
    def parse(cls, text: str, impl: str | None = None) -> Target:
        """The target ``--gpu text`` (``GPU`` or ``GPU+PROFILE``) and ``--impl impl`` name; one line
        (:class:`~mksim.errors.MksimError`) for an unknown GPU or profile, a bad file, or two profiles."""
        if not isinstance(text, str):
            raise MksimError(f"a GPU is named by a string (mksim hw list), got {type(text).__name__}")
        hardware, profile = hwmodels.split_profile(with_impl(text, impl))
        return cls(hardware, profile, hwmodels.load(hardware, profile=profile))

    @classmethod
    def of(cls, gpu: str | GPUSpec | Target) -> Target:
        """``gpu`` as a target: parsed from a name, or wrapping a spec already loaded (whose name then
        stands for its hardware)."""
        if isinstance(gpu, Target):
            return gpu
        if isinstance(gpu, GPUSpec):
            hardware = gpu.name.split("+", 1)[0] if gpu.profile and "+" in gpu.name else gpu.name
            return cls(hardware, gpu.profile, gpu)
        return cls.parse(gpu)

    @property
    def name(self) -> str:
        """What the target is called in outputs (``h200-calibrated+mksim``)."""
        return self.spec.name

    def with_profile(self, profile: str) -> Target:
        """The same hardware with another profile (a user's stack beside the megakernel)."""
        return Target(self.hardware, profile, hwmodels.load(self.hardware, profile=profile))

    def without_profile(self) -> Target:
        """The same hardware, no profile."""
        if self.profile is None:
            return self
        return Target(self.hardware, None, hwmodels.load(self.hardware, profile=None))


def with_impl(gpu: str, impl: str | None) -> str:
    """``gpu`` with the implementation profile ``impl`` applied (``"h200-calibrated+torch"``); ``gpu`` itself
    when ``impl`` is None. A GPU named with a profile already takes no second one.

    >>> with_impl("h200-calibrated", "torch"), with_impl("h200", None), with_impl("data/h200.toml", "torch")
    ('h200-calibrated+torch', 'h200', 'data/h200.toml+torch')
    """
    if impl is None:
        return gpu
    if hwmodels.split_profile(gpu)[1] is not None:
        raise MksimError(f"--gpu {gpu} already names a profile; give --impl {impl} with a GPU without one")
    return f"{gpu}+{impl}"


def gpu_spec(gpu: str | GPUSpec | Target) -> GPUSpec:
    """The :class:`~hwmodels.GPUSpec` of a GPU name (``GPU+PROFILE``), a spec or a :class:`Target`."""
    if isinstance(gpu, GPUSpec):
        return gpu
    return Target.of(gpu).spec


__all__ = ["GPUS", "PROFILES", "Target", "gpu_spec", "with_impl"]

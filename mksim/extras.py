"""One gate for mksim's optional heavy dependencies (the extras of ``pip install 'mksim[...]'``).

``import mksim`` loads none of optuna, dash, plotly, torch or cupy; a feature that needs one asks
:func:`require` when it is called, and a missing one is reported in one line naming the extra
that brings it.

>>> require("json", "search").__name__
'json'
>>> require("no_such_module", "search", "mksim search")
Traceback (most recent call last):
    ...
mksim.errors.MissingExtraError: mksim search needs no_such_module: pip install 'mksim[search]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

from mksim.errors import MissingExtraError

__all__ = ["EXTRAS", "require"]

#: The extras of the mksim package and what each is for (as pyproject.toml declares them).
EXTRAS = {
    "search": "schedule search with Optuna, its HTML report",
    "explorer": "the web explorer (Dash)",
    "torch": "workloads traced from PyTorch modules",
    "gpu": "validation and calibration on a CUDA GPU (CuPy)",
}


def require(module: str, extra: str, feature: str | None = None) -> ModuleType:
    """Import ``module`` (dotted name) or raise :class:`MissingExtraError` naming ``extra``.

    ``feature`` names what needs it in the message (default: "this feature of mksim").
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # the module, or one it needs (dash without plotly): name what is missing
        missing = (exc.name or module).split(".")[0]
        raise MissingExtraError(f"{feature or 'this feature of mksim'} needs {missing}: "
                                f"pip install 'mksim[{extra}]'") from None

"""Every one-line error survives a process boundary: a worker's error is raised again in the parent."""

from __future__ import annotations

import pickle

import pytest

import hwmodels.errors
import mksim.errors
import validation.calibrate  # noqa: F401  (its errors are MksimErrors too)
import validation.calibrate._gpu  # noqa: F401
from mksim.errors import MksimError, UnknownNameError


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


ERRORS = sorted({MksimError, *_all_subclasses(MksimError)}, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_every_exported_error_is_listed():
    exported = {getattr(mksim.errors, n) for n in mksim.errors.__all__} | {
        getattr(hwmodels.errors, n) for n in hwmodels.errors.__all__}
    assert exported <= set(ERRORS)


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__qualname__)
def test_error_pickles(cls: type) -> None:
    exc = cls("mode", "foo", ["a", "b"]) if issubclass(cls, UnknownNameError) else cls("something is wrong")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and str(back) == str(exc) and back.args == exc.args
    assert vars(back) == vars(exc)

"""One registry for every extension point: modes, designs, syncs, policies, op kinds, blocks, profiles.

A :class:`Registry` maps names to what they name, in registration order, and is the one place
the rest of mksim (the CLI's choices, the search space, the explorer's menus, the tests) reads
those names from: a list typed out elsewhere would miss the next one registered
(``tests/test_architecture.py`` fails on such a list). It reads like a read-only mapping;
:meth:`Registry.add` is a class decorator that registers an instance of the class under its
``name``; an unknown name is refused in one line that lists the known ones.

>>> shapes = Registry("shape")
>>> @shapes.add
... class Square:
...     name = "square"
>>> shapes.names(), "square" in shapes, type(shapes["square"]).__name__
(('square',), True, 'Square')
>>> shapes.get("circle")
Traceback (most recent call last):
...
hwmodels.errors.UnknownNameError: unknown shape 'circle'; known: square
>>> shapes.remove("square"); len(shapes)
0
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from mksim.errors import UnknownNameError

T = TypeVar("T")
C = TypeVar("C", bound=type)

_ALL: list[Registry[Any]] = []


class Registry(Mapping[str, T], Generic[T]):
    """Named things of one ``kind`` (``"mode"``, ``"design"``, ...), in registration order.

    ``check`` (optional) is called with each thing as it is registered and raises ``ValueError``
    for one that breaks the kind's contract; a later registration of the same name replaces the
    earlier one (a plug-in overriding a built-in) unless ``unique`` is set. ``source`` (optional)
    gives things that live as files (implementation profiles): it is read on every lookup, so a
    file added later is there at once, and what is registered in code comes after it.
    """

    def __init__(self, kind: str, *, check: Callable[[T], None] | None = None, unique: bool = False,
                 source: Callable[[], Mapping[str, T]] | None = None):
        self.kind = kind
        #: the package whose modules declare the things (where the registry was made)
        self.home = sys._getframe(1).f_globals.get("__name__", "").rpartition(".")[0]
        self._items: dict[str, T] = {}
        self._check = check
        self._unique = unique
        self._source = source
        _ALL.append(self)

    def _all(self) -> Mapping[str, T]:
        return self._items if self._source is None else {**self._source(), **self._items}

    # -- registering ---------------------------------------------------------------------
    def register(self, name: str, thing: T) -> T:
        """Register ``thing`` under ``name``; returns ``thing``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a name, got {name!r}")
        if self._unique and name in self._items:
            raise ValueError(f"{self.kind} {name!r} is registered already")
        if self._check is not None:
            self._check(thing)
        self._items[name] = thing
        return thing

    def add(self, cls: C) -> C:
        """Class decorator: register ``cls()`` under ``cls.name``. Returns the class."""
        self.register(getattr(cls, "name", ""), cls())
        return cls

    def remove(self, name: str) -> None:
        """Forget ``name`` (tests that register a thing of their own); no error if it is absent."""
        self._items.pop(name, None)

    # -- reading -------------------------------------------------------------------------
    def get(self, name: str, default: Any = ...) -> T:  # type: ignore[override]
        """The thing called ``name``; :class:`UnknownNameError` (one line listing the known names)
        otherwise, or ``default`` where one is given."""
        items = self._all()
        try:
            return items[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name from a hand-edited file
            if default is not ...:
                return default
            raise UnknownNameError(self.kind, name, tuple(items)) from None

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._all()))

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._all()
        except TypeError:
            return False

    def names(self, where: Callable[[T], bool] | None = None) -> tuple[str, ...]:
        """The registered names (those whose thing passes ``where``), in registration order."""
        return tuple(n for n, t in self._all().items() if where is None or where(t))

    def view(self, where: Callable[[T], bool] | None = None) -> Names:
        """A live :class:`Names` of :meth:`names` (``where``): reads like a tuple, and a thing
        registered later (a plug-in, a test) is in it too."""
        return Names(lambda: self.names(where))

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._all())})"

    @staticmethod
    def every() -> tuple[Registry[Any], ...]:
        """Every registry made so far (the architecture test reads their names)."""
        return tuple(_ALL)


class Names(Sequence[str]):
    """The names a registry holds (``names()`` reads them), in registration order: a live view that
    reads like a tuple, so a thing registered later (a plug-in, a test) is in it too."""

    def __init__(self, names: Callable[[], tuple[str, ...]]):
        self._names = names

    def __getitem__(self, i):  # type: ignore[override]
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __eq__(self, other: object) -> bool:
        return self._names() == (tuple(other) if isinstance(other, (tuple, list, Names)) else other)

    def __hash__(self) -> int:
        return hash(self._names())

    def __add__(self, other: Sequence[str]) -> tuple[str, ...]:
        return self._names() + tuple(other)

    def __repr__(self) -> str:
        return repr(self._names())


__all__ = ["Names", "Registry"]

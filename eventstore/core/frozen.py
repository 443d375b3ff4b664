"""Fast construction of frozen, slotted dataclasses on the append hot path.

A frozen dataclass's generated `__init__` sets each field through
`object.__setattr__` (the class's own `__setattr__` refuses): about 0.5 us a field. The
records an append builds for engines (`Head`, `FilePosition`, `EncodedBatch`) are frozen
msgspec Structs, built faster still; `AppendResult` is a public dataclass (callers may
`dataclasses.replace` it), built here. `maker(cls)` returns a function that builds the
same object by writing the slots directly through their descriptors (what
`object.__setattr__` ends up doing), about 5x faster. It only builds: the object is as
frozen afterwards as one made by `cls(...)`, and equal to it. It does no validation and
applies no defaults: every field is passed, in field order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["maker"]

T = TypeVar("T")


def maker(cls: type[T]) -> Callable[..., T]:
    """A positional constructor of `cls` (a frozen dataclass with slots and no
    `__post_init__`) taking every field in order."""
    if not (dataclasses.is_dataclass(cls) and "__slots__" in cls.__dict__):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__ that fast construction would skip")
    names = [f.name for f in dataclasses.fields(cls)]
    setters = [getattr(cls, name).__set__ for name in names]
    new = object.__new__
    count = len(names)

    def make(*values: Any) -> T:
        if len(values) != count:
            raise TypeError(f"{cls.__name__} takes {count} fields, got {len(values)}")
        obj = new(cls)
        for setter, value in zip(setters, values, strict=True):
            setter(obj, value)
        return obj

    # the common sizes unrolled: the loop above costs as much as it saves
    if count == 3:
        s0, s1, s2 = setters

        def make3(a: Any, b: Any, c: Any) -> T:
            obj = new(cls)
            s0(obj, a)
            s1(obj, b)
            s2(obj, c)
            return obj

        return make3
    if count == 6:
        s0, s1, s2, s3, s4, s5 = setters

        def make6(a: Any, b: Any, c: Any, d: Any, e: Any, f: Any) -> T:
            obj = new(cls)
            s0(obj, a)
            s1(obj, b)
            s2(obj, c)
            s3(obj, d)
            s4(obj, e)
            s5(obj, f)
            return obj

        return make6
    if count == 7:
        s0, s1, s2, s3, s4, s5, s6 = setters

        def make7(a: Any, b: Any, c: Any, d: Any, e: Any, f: Any, g: Any) -> T:
            obj = new(cls)
            s0(obj, a)
            s1(obj, b)
            s2(obj, c)
            s3(obj, d)
            s4(obj, e)
            s5(obj, f)
            s6(obj, g)
            return obj

        return make7
    return make

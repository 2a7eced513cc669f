"""Instances of jobpool's frozen dataclasses made on enqueue's hot path without their generated ``__init__``.

A frozen dataclass's ``__init__`` writes each field through ``object.__setattr__`` (its own ``__setattr__``
refuses), a large share of the client work of each job of `Pool.enqueue_many` (jobpool/spec.py and
jobpool/submit.py make one of each per job; BENCHMARKS.md has the figures). For a class without
``__post_init__`` or slots, all that ``__init__`` does is fill the instance's ``__dict__``, so `Assembler`
fills it at once.

What is given is not checked here (the hot path is the point): a caller passes every field without a plain
default, as keyword arguments to ``__init__`` would be passed, and tests/unit/test_assemble.py checks that
what each caller makes equals what ``__init__`` makes from the same values.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Assembler(Generic[T]):
    """``Assembler(cls)(values)``: an instance of the frozen dataclass `cls` whose fields are `values`, plus
    the plain defaults of the fields `values` leaves out."""

    def __init__(self, cls: type[T]) -> None:
        params = getattr(cls, "__dataclass_params__", None)
        if params is None or not params.frozen or hasattr(cls, "__post_init__") or "__slots__" in vars(cls):
            raise TypeError(f"{cls.__name__}: only a frozen dataclass without __post_init__ or slots")
        self.cls = cls
        #: A default factory is left out: a caller gives that field (its factory would make a new value).
        self.defaults = {f.name: f.default for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                         if f.default is not dataclasses.MISSING}

    def __call__(self, values: dict[str, Any]) -> T:
        obj = object.__new__(self.cls)
        fields = obj.__dict__
        if self.defaults:
            fields.update(self.defaults)
        fields.update(values)
        return obj

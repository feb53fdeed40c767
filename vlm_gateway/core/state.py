"""Typed per-request state: a ``Slot[T]`` is a key declared once by the module that
writes it, and ``State`` holds at most one value per slot.

    slot: Slot[T] = Slot("name")     # in the owning module
    req.state[slot] = value          # value: T
    req.state.get(slot)              # -> T | None
    req.state[slot]                  # -> T (KeyError when unset)

Readers import the slot from its owner, so every read names the writer and the value's
type (llm-d's ``CycleState`` is the model). Strings are refused as keys: a typo can no
longer create a key that nobody reads.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
D = TypeVar("D")


class Slot(Generic[T]):
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Slot({self.name!r})"


class State:
    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[Slot[Any], Any] = {}

    @overload
    def get(self, slot: Slot[T]) -> T | None: ...
    @overload
    def get(self, slot: Slot[T], default: D) -> T | D: ...

    def get(self, slot, default=None):
        return self._values.get(slot, default)

    def __getitem__(self, slot: Slot[T]) -> T:
        return self._values[slot]

    def __setitem__(self, slot: Slot[T], value: T) -> None:
        if not isinstance(slot, Slot):
            raise TypeError(f"request state is keyed by Slot objects, not {type(slot).__name__}")
        self._values[slot] = value

    def __contains__(self, slot: Slot[Any]) -> bool:
        return slot in self._values

    def pop(self, slot: Slot[T]) -> T | None:
        return self._values.pop(slot, None)

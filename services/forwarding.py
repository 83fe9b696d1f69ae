"""The door's members generated from its declaration: a stand-in for a library (the start-up's, a deployment's) is a
class with one `_forward(call)` method, and `forwarding` writes every member `LibraryDoor` declares onto it, each with
the door's own signature, binding the caller's arguments to that signature and handing them over as one `DoorCall`.

So the members are written once (services/door.py) and a stand-in cannot forget one: a member added to the door is
forwarded by every stand-in the moment it is declared. Nothing else passes: there is no `__getattr__`, so a private
or undeclared name is an AttributeError, and a call the door's signature does not accept is a TypeError before
anything is forwarded. It knows nothing about what a stand-in does with a call.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from .door import LibraryDoor

MARK = "__door_member__"  # set on every generated member: what the tests tell from a member written out by hand


@dataclass(frozen=True)
class DoorCall:
    """One use of a door member: its name, whether it is a method (else a data member or property, read), and the
    arguments by parameter name with the door's defaults applied."""

    member: str
    method: bool
    arguments: Mapping[str, object]

    def on(self, target: object):
        """The same use on `target` (a library with the door's members): the call made, or the member read."""
        value = getattr(target, self.member)
        return value(**self.arguments) if self.method else value


def members(door: type = LibraryDoor) -> tuple[tuple[str, ...], dict[str, object]]:
    """(data members and properties, {method name: its declaration}) of the Protocol `door` and the protocols it
    extends, in declaration order."""
    data: dict[str, None] = {}
    methods: dict[str, object] = {}
    for klass in reversed([k for k in door.__mro__ if Protocol in getattr(k, "__bases__", ()) or k is door]):
        if klass is Protocol:
            continue
        data |= dict.fromkeys(inspect.get_annotations(klass))
        for name, value in vars(klass).items():
            if isinstance(value, property):
                data[name] = None
            elif inspect.isfunction(value) and not name.startswith("_"):
                methods[name] = value
    return tuple(data), methods


def _method(name: str, declared) -> object:
    signature = inspect.signature(declared)

    def member(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)  # a TypeError here for a call the door does not accept
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        del arguments[next(iter(signature.parameters))]
        return self._forward(DoorCall(name, True, MappingProxyType(arguments)))

    member.__name__, member.__qualname__, member.__doc__ = name, name, declared.__doc__
    member.__signature__ = signature
    setattr(member, MARK, True)
    return member


def _data(name: str) -> property:
    def read(self):
        return self._forward(DoorCall(name, False, MappingProxyType({})))

    read.__name__ = name
    setattr(read, MARK, True)
    return property(read, doc=f"The door's `{name}`, forwarded.")


def forwarding(cls: type | None = None, *, door: type = LibraryDoor):
    """Class decorator: every member of `door` on `cls`, forwarded to `cls._forward(call: DoorCall)`. A data member
    or property that `cls` holds itself (a class attribute, or an annotation for one its instances set) is left to
    it (or to a base class that holds or forwards it); a method of the door written on `cls` by hand is refused (TypeError): its work belongs in `_forward`."""

    def build(cls: type) -> type:
        if not callable(getattr(cls, "_forward", None)):
            raise TypeError(f"{cls.__name__} forwards the door's members: define _forward(self, call: DoorCall)")
        data, methods = members(door)
        own = vars(cls)
        written = sorted(n for n in methods if n in own and not getattr(own[n], MARK, False))
        if written:
            raise TypeError(f"{cls.__name__} writes out the door's {', '.join(written)}: handle them in _forward instead")
        for name in data:
            if not any(name in vars(k) or name in inspect.get_annotations(k) for k in cls.__mro__[:-1]):
                setattr(cls, name, _data(name))
        for name, declared in methods.items():
            setattr(cls, name, _method(name, declared))
        return cls

    return build if cls is None else build(cls)

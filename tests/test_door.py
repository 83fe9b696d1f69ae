"""The library door: `services.Library`, `serving.remote.RemoteLibrary` and `web.startup.StartingLibrary` each
declare every member of `services.LibraryDoor` with a signature its callers can use (no `__getattr__`
fallback counts), and the members with nothing to do say so. The two stand-ins write none of them out: each is
generated from the declaration (`services.forwarding`), forwards exactly its arguments, and nothing else passes."""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

import services
from errors import KvgraftError, NotReady
from retrieval import HashEmbedder
from services.door import LibraryDoor
from services.forwarding import MARK, DoorCall, forwarding, members
from serving import remote
from web import startup

EMPTY = inspect.Parameter.empty
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def door_members() -> tuple[list[str], list[str]]:
    """(data members and properties, methods) of the Protocol."""
    data = [n for n in LibraryDoor.__annotations__]
    data += [n for n, v in vars(LibraryDoor).items() if isinstance(v, property)]
    methods = [n for n, v in vars(LibraryDoor).items() if inspect.isfunction(v) and not n.startswith("_")]
    return data, methods


def signature_problems(name: str, declared, implemented) -> list[str]:
    """Why a call written against `declared` could fail on `implemented` (both unbound functions)."""
    want = list(inspect.signature(declared).parameters.values())[1:]
    have = list(inspect.signature(implemented).parameters.values())[1:]
    by_name = {p.name: p for p in have}
    kinds = {p.kind for p in have}
    star_args, star_kw = inspect.Parameter.VAR_POSITIONAL in kinds, inspect.Parameter.VAR_KEYWORD in kinds
    positional = [p.name for p in have if p.kind in POSITIONAL]
    problems = []
    for i, p in enumerate(want):
        q = by_name.get(p.name)
        if q is None:
            # a required parameter may come by position; an optional one comes by keyword
            absorbed = star_kw and (p.default is not EMPTY or star_args)
            if not absorbed:
                problems.append(f"{name}: no parameter {p.name!r}")
            continue
        if p.default is EMPTY and p.kind in POSITIONAL and (i >= len(positional) or positional[i] != p.name):
            problems.append(f"{name}: {p.name!r} is not positional argument {i + 1}")
        if p.default is not EMPTY and q.default is EMPTY:
            problems.append(f"{name}: {p.name!r} is optional on the door but required here")
    declared_names = {p.name for p in want}
    for q in have:
        if q.default is EMPTY and q.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            if q.name not in declared_names:
                problems.append(f"{name}: requires {q.name!r}, which the door does not pass")
    return problems


def door_problems(obj) -> list[str]:
    data, methods = door_members()
    problems = []
    for n in data:
        try:
            inspect.getattr_static(obj, n)
        except AttributeError:
            problems.append(f"{n}: not declared")
    for n in methods:
        impl = inspect.getattr_static(type(obj), n, None)
        if not inspect.isfunction(impl):
            problems.append(f"{n}: not a declared method ({impl!r})")
            continue
        problems += signature_problems(n, vars(LibraryDoor)[n], impl)
    return problems


@pytest.fixture
def implementations(tmp_path):
    lib = services.Library(home=tmp_path / "store", embedder=HashEmbedder())
    tracker = startup.Startup()
    yield {
        "Library": lib,
        "RemoteLibrary": remote.RemoteLibrary("http://127.0.0.1:9"),
        "StartingLibrary": startup.StartingLibrary(lib, tracker),
    }
    lib.close()


def test_each_library_declares_every_member_of_the_door(implementations):
    data, methods = door_members()
    assert {"home", "lm", "model_loaded", "answer", "start_decoding_together", "warm_proofs"} <= set(data + methods)
    for name, obj in implementations.items():
        assert door_problems(obj) == [], name


def test_the_signature_check_catches_a_missing_or_moved_parameter():
    class Narrow:
        def answer(self, question: str, k: int = 3) -> None: ...  # no options, on_token

        def deposit_item(self, solution, question, answer, verifier, reference, **kw) -> None: ...  # swapped

        def show(self, ref: str, extra: int) -> None: ...  # requires what the door never passes

    door = vars(LibraryDoor)
    assert "answer: no parameter 'options'" in signature_problems("answer", door["answer"], Narrow.answer)
    assert signature_problems("deposit_item", door["deposit_item"], Narrow.deposit_item)[0].startswith(
        "deposit_item: 'question' is not positional argument 1"
    )
    assert signature_problems("show", door["show"], Narrow.show) == ["show: requires 'extra', which the door does not pass"]


def test_members_with_nothing_to_do_say_so(implementations):
    far = implementations["RemoteLibrary"]
    assert far.start_decoding_together() == "answers decode in the deployment's replicas"
    for call in (lambda: far.warm_proofs(4), lambda: far.prove_chain("x"), lambda: far.warm_answer("x"), far.index):
        with pytest.raises(KvgraftError, match="is not available when the app fronts a deployment"):
            call()
    gate = implementations["StartingLibrary"]
    assert gate.count() == 0 and gate.home == implementations["Library"].home  # reads pass at once
    for call in (gate.start_decoding_together, lambda: gate.warm_proofs(1), gate.index):
        with pytest.raises(NotReady):
            call()


def one_signature(fn) -> list[tuple[str, str, object]]:
    """(name, kind, default) of every parameter after self: what a caller can rely on, annotations aside."""
    return [(p.name, p.kind.name, p.default) for p in list(inspect.signature(fn).parameters.values())[1:]]


def test_every_member_has_one_signature_on_every_implementation(implementations):
    """Not only callable the door's way: the same names, kinds and defaults on the door and on all three
    libraries (no *args, **kwargs or private pass-through), so a call written against one runs on each."""
    _, methods = door_members()
    differ = []
    for n in methods:
        want = one_signature(vars(LibraryDoor)[n])
        assert all(kind not in ("VAR_POSITIONAL", "VAR_KEYWORD") for _, kind, _ in want), n
        for name, obj in implementations.items():
            have = one_signature(inspect.getattr_static(type(obj), n))
            if have != want:
                differ.append(f"{name}.{n}: {have} != the door's {want}")
    assert differ == []
    gate = implementations["StartingLibrary"]
    assert gate.store is implementations["Library"].store  # the store passes at once (upkeep works on it)
    for private in ("_catalog", "_blobs", "_probed", "rebuild_index"):
        with pytest.raises(AttributeError):
            getattr(gate, private)

    # the check fails where it should: a default that differs, a parameter gone under **kwargs
    class Drifted:
        def ledger(self, last: int | None = 10): ...

        def stats(self, **kwargs): ...

    assert one_signature(Drifted.ledger) != one_signature(vars(LibraryDoor)["ledger"])
    assert one_signature(Drifted.stats) != one_signature(vars(LibraryDoor)["stats"])


def test_answer_options_cross_the_door_as_one_value():
    o = services.AnswerOptions(k=2, check=True, max_prompt_tokens=40)
    assert services.AnswerOptions.from_json(o.to_json()) == o and o.to_json()["graft"] is True
    with pytest.raises(KvgraftError, match="unknown answer option.s. kk: use k, artifact"):
        services.AnswerOptions.from_json({"kk": 2})


def _arguments(declared) -> tuple[list, dict]:
    """A distinct object for each parameter of a declared method: the required ones by position, the rest by name."""
    params = list(inspect.signature(declared).parameters.values())[1:]
    args = [object() for p in params if p.default is EMPTY]
    kwargs = {p.name: object() for p in params if p.default is not EMPTY}
    return args, kwargs


class _Recorder:
    """A library that answers every use with what it was: (member, arguments by name) for a call, the name for a read."""

    def __getattr__(self, name):
        if name in members()[1]:
            return lambda **kw: (name, kw)
        return ("read", name)


def test_the_stand_ins_write_out_no_member_and_forward_each_call_exactly():
    """Every door member of StartingLibrary and RemoteLibrary is generated (none written by hand), and each call on
    the start-up's stand-in reaches the library with exactly the arguments given, by name: a member dropped, an
    argument lost or swapped, or a default changed on the way fails here."""
    data, methods = members()
    assert set(methods) == set(door_members()[1]) and set(data) == set(door_members()[0])
    for cls in (startup.StartingLibrary, remote.RemoteLibrary):
        hand = [n for n in methods if not getattr(vars(cls)[n], MARK, False)]
        assert hand == [], f"{cls.__name__} writes out {hand}"
    ready = startup.Startup.already_done()
    gate = startup.StartingLibrary(_Recorder(), ready)
    for name, declared in methods.items():
        args, kwargs = _arguments(declared)
        params = [p.name for p in list(inspect.signature(declared).parameters.values())[1:]]
        got = getattr(gate, name)(*args, **kwargs)
        assert got == (name, dict(zip(params, args, strict=False)) | kwargs), name
        defaults = {p.name: p.default for p in list(inspect.signature(declared).parameters.values())[1:]}
        assert getattr(gate, name)(*args)[1] == dict(zip(params, args, strict=False)) | {
            k: v for k, v in defaults.items() if v is not EMPTY
        }
    for name in data:
        assert getattr(gate, name) == ("read", name), name
    with pytest.raises(TypeError):  # a call the door's signature refuses never reaches the library
        gate.answer("q", bogus=1)
    with pytest.raises(AttributeError):
        gate.health  # noqa: B018  (a name of the recorder's, not of the door)


def test_a_member_the_door_gains_is_forwarded_and_one_written_by_hand_is_refused():
    """A fifth member declared on the door reaches a stand-in without a line written for it; a stand-in that
    writes a door member out is refused when its class is made; private and undeclared names stay errors."""

    class Wider(LibraryDoor, Protocol):
        limit: int

        def fifth(self, ref: str, depth: int = 2) -> str:
            """A member the door did not have."""
            ...

    @forwarding(door=Wider)
    class Stand:
        def __init__(self):
            self.calls: list[DoorCall] = []

        def _forward(self, call: DoorCall):
            self.calls.append(call)
            return call.member

    s = Stand()
    assert s.fifth("x") == "fifth" and dict(s.calls[-1].arguments) == {"ref": "x", "depth": 2} and s.calls[-1].method
    assert s.limit == "limit" and s.calls[-1] == DoorCall("limit", False, s.calls[-1].arguments)
    assert inspect.signature(Stand.fifth) == inspect.signature(Wider.fifth)
    for name in ("_catalog", "nope", "_library"):
        with pytest.raises(AttributeError):
            getattr(s, name)
    with pytest.raises(TypeError, match="writes out the door's answer: handle them in _forward"):

        @forwarding
        class ByHand:
            def _forward(self, call): ...

            def answer(self, question, options=None, on_token=None): ...

    far = remote.RemoteLibrary("http://127.0.0.1:9")
    with pytest.raises(KvgraftError, match="is not available when the app fronts a deployment"):
        forwarding(door=Wider)(type("Far", (remote.RemoteLibrary,), {}))("http://127.0.0.1:9").fifth("x")
    with pytest.raises(AttributeError):
        far._catalog  # noqa: B018

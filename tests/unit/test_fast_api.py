"""The kernels' typed faces (mqk._fast.api) hold both twins to one API.

mypy checks the pure-Python twins against their Protocols (mqk/_fast/conformance.py); it cannot read a compiled
module. These tests hold every available implementation (the twin always, the compiled module when it is built) to
its face at run time: the same public names, the same parameters in the same order with the same defaults
(inspect.signature reads them from Cython's binding functions), and the same constants. A parameter renamed in a
.pyx, a default changed in a twin, or a function added to one side only fails here.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType
from typing import Any
from uuid import UUID

import pytest

from mqk._fast import NO_EXTENSIONS, api, compiled, conformance, load, twin

KERNELS = sorted(api.FACES)
#: public names a twin defines beyond its face: the Produce decoder's Cursor, which the Fetch decoder's twin shares
#: (the compiled modules share theirs as _cursor.pxd)
TWIN_HELPERS = {"producereq": {"Cursor"}}


def implementations(name: str) -> list[ModuleType]:
    impls = [twin(name)]
    built = compiled(name)
    if built is not None:
        impls.append(built)
    return impls


CASES = [(name, impl) for name in KERNELS for impl in implementations(name)]
CASE_IDS = [f"{name}-{'twin' if impl.__name__.endswith('_py') else 'compiled'}" for name, impl in CASES]


def shape(signature: inspect.Signature, drop_self: bool = False) -> list[tuple[str, Any, Any]]:
    """A call signature as (name, kind, default) per parameter: what both builds can be compared on."""
    params = list(signature.parameters.values())[1 if drop_self else 0 :]
    return [(p.name, p.kind, p.default) for p in params]


def face_methods(face: type) -> dict[str, list[tuple[str, Any, Any]]]:
    return {
        name: shape(inspect.signature(value), drop_self=True)
        for name, value in vars(face).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }


def face_properties(face: type) -> set[str]:
    return {name for name, value in vars(face).items() if isinstance(value, property)}


def face_constants(face: type) -> dict[str, str]:
    """Data members and their annotated type names (`from __future__ import annotations`: strings)."""
    return {name: kind for name, kind in face.__annotations__.items() if not name.startswith("_")}


def public_names(module: ModuleType) -> set[str]:
    """The names a kernel module defines for its callers: functions and classes defined in it, and constants."""
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if (callable(value) and getattr(value, "__module__", None) == module.__name__) or type(value) in (int, UUID):
            names.add(name)
    return names


def test_every_kernel_module_has_a_face() -> None:
    sources = Path(api.__file__).parent  # (the kernels' sources sit beside their faces)
    assert {path.stem for path in sources.glob("*.pyx")} == set(api.FACES)
    assert {path.stem[: -len("_py")] for path in sources.glob("*_py.py")} == set(api.FACES)


@pytest.mark.parametrize(("name", "impl"), CASES, ids=CASE_IDS)
def test_public_names_are_the_face(name: str, impl: ModuleType) -> None:
    face = api.FACES[name]
    expected = set(face_methods(face)) | set(face_constants(face))
    if impl.__name__.endswith("_py"):
        expected |= TWIN_HELPERS.get(name, set())
    assert public_names(impl) == expected


@pytest.mark.parametrize(("name", "impl"), CASES, ids=CASE_IDS)
def test_call_signatures_are_the_face(name: str, impl: ModuleType) -> None:
    for fn, expected in face_methods(api.FACES[name]).items():
        member = getattr(impl, fn)
        if isinstance(member, type):
            continue  # a class: its constructor and methods are held by the AppendRun tests below
        assert shape(inspect.signature(member)) == expected, f"{impl.__name__}.{fn}"


@pytest.mark.parametrize(("name", "impl"), CASES, ids=CASE_IDS)
def test_constants_have_their_type_and_agree_with_the_twin(name: str, impl: ModuleType) -> None:
    reference = twin(name)
    for constant, kind in face_constants(api.FACES[name]).items():
        value = getattr(impl, constant)
        assert type(value).__name__ == kind, f"{impl.__name__}.{constant}"
        assert value == getattr(reference, constant), f"{impl.__name__}.{constant}"


CLENTRY = implementations("clentry")
CLENTRY_IDS = ["twin" if m.__name__.endswith("_py") else "compiled" for m in CLENTRY]


@pytest.mark.parametrize("clentry", CLENTRY, ids=CLENTRY_IDS)
def test_append_run_is_its_face(clentry: ModuleType) -> None:
    face = api.AppendRunApi
    for method, expected in face_methods(face).items():
        assert shape(inspect.signature(getattr(clentry.AppendRun, method)), drop_self=True) == expected, method
    # the constructor (a Cython class's __cinit__ has no signature to read): its one parameter, by position, by
    # name and by default, as ClentryApi.AppendRun says
    ((param, _kind, default),) = face_methods(api.ClentryApi)["AppendRun"]
    assert param == "capacity"
    assert clentry.AppendRun().capacity == default
    assert clentry.AppendRun(7).capacity == 7
    assert clentry.AppendRun(**{param: 9}).capacity == 9
    run = clentry.AppendRun(3)
    for attribute in face_properties(face):
        assert type(getattr(run, attribute)) is int, attribute
    public = {n for n in dir(run) if not n.startswith("_")}
    assert public == set(face_methods(face)) | face_properties(face)


@pytest.mark.parametrize("name", KERNELS)
def test_load_binds_the_twin_that_the_environment_picks(name: str) -> None:
    bound = load(name)
    built = compiled(name)
    assert bound is (twin(name) if NO_EXTENSIONS or built is None else built)
    assert getattr(conformance, name) is twin(name)

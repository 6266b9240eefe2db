#!/usr/bin/env python3
"""Generate the package mqk/protocol/kafka/messages/ from Kafka's JSON message specs, read from ONE pinned release
of kafka-python (the package that ships them).

Usage:  python tools/gen_kafka_messages.py            # (re)write the package
        python tools/gen_kafka_messages.py --check    # exit 1 if the committed package is not what this makes

Source. pyproject.toml's `gen` extra pins the release exactly (`kafka-python==X.Y.Z`); the generator reads the spec
files of that installed distribution (found through the distribution's own file list, never by importing it) and
refuses to run against any other version: `pip install -e '.[gen]'` installs the pinned one. The spec files are
never copied into the repository. The package's `__init__.py` records the release and the sha256 of the spec set
(each file's name, a NUL and its bytes, in name order). `--check` fails when that recorded hash is not the installed
specs' hash, and when any generated file differs from the committed one, is missing, or is left over.

Layout (every file generated, none hand-edited):
- `_runtime.py`: what all API modules share: the struct.Struct constants, varint and tagged-field helpers, the
  null/truncation/error helpers, the type aliases (`Buffer`, `Records`, `Decoder`, `Encoder`) and the version
  lookup with the wrappers that turn low-level exceptions into MalformedMessage / EncodeError.
- one module per API, named after it in snake_case (`produce.py`, `fetch.py`, `list_offsets.py`...): the
  TypedDicts of its request and response bodies and of every nested struct, the per-version decoders and encoders,
  typed entry points (`decode_request(version, buf) -> ProduceRequest`, `encode_response(version, obj, head)`...)
  and the version tables the package's untyped entry points use.
- `__init__.py`: api key -> (name, versions, first flexible version) and api key -> module, the untyped entry points
  by api key (`decode_request(api_key, version, buf)`... as the connection codec calls them), which import an API's
  module the first time one of its messages passes (a broker start compiles none of them), and every TypedDict
  re-exported: for type checkers by imports under `TYPE_CHECKING`, at run time by a module `__getattr__` that
  imports the API's module on first access. Code that only annotates (handlers) can import the types from the
  package without loading any API module; code that needs a module's functions imports the module.

Codecs. For every request/response pair and every valid version, a decoder and an encoder specialised for that
version, as straight-line Python (consecutive fixed-width fields packed/unpacked by one precompiled struct.Struct,
inline varints, no per-field dispatch at run time). Identical function bodies across an API's versions are emitted
once. Messages are plain dicts with snake_case keys; decoders fill every field the schema knows (defaults for those
absent from the version), encoders take any subset (defaults for the rest).

Types. One TypedDict per body and per struct, named after the spec: a body is `<Name>Request` / `<Name>Response`;
a struct whose spec name starts with the API's name keeps it (`MetadataResponseTopic`, `ListOffsetsTopic`), any
other gets its message's name in front (Produce's `TopicProduceData` -> `ProduceRequestTopicProduceData`); a name
must be unique in the package, else generation stops. A field is Required when every version that carries its
struct carries it as a regular (untagged) field, and NotRequired otherwise, i.e. when it exists only in some
versions or is a tagged field. Chosen over `total=False`: decoders fill every key anyway, so Required costs readers
nothing and tells them the value means something in every version; a writer must give the fields every version
carries (the encoder would default them, but a body missing one is almost always a bug), and may leave out the
version-dependent ones, which the encoder defaults or drops. A field that is nullable in some version (or defaults
to null) is `T | None`. Wire types: integers -> int, float64 -> float, string -> str, bytes -> bytes, uuid ->
uuid.UUID, records -> `Records` (decoders give a memoryview into the input; encoders take a bytes-like or a list or
tuple of them), arrays -> list. The generated modules pass `mypy --strict`.

Wire rules implemented (Kafka's "flexible versions", KIP-482): compact strings/bytes/arrays (unsigned varint
length + 1, 0 = null), a tagged-field section after every struct, tagged fields written only when they differ
from their default; non-flexible versions use int16 string lengths, int32 bytes/array lengths, -1 = null.
Nullable structs carry an int8 presence marker. `records` decode as memoryviews into the input and encode from
bytes-likes or lists of them (emitted as separate buffers, never copied).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.metadata
import json
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "mqk" / "protocol" / "kafka" / "messages"
PACKAGE = "mqk.protocol.kafka.messages"
PYPROJECT = ROOT / "pyproject.toml"
DIST = "kafka-python"
SPEC_PREFIX = "kafka/protocol/schemas/resources/"
MARK = "# Generated by tools/gen_kafka_messages.py"
MAXV = 0x7FFF

FIXED = {
    "bool": ("?", 1),
    "int8": ("b", 1),
    "int16": ("h", 2),
    "uint16": ("H", 2),
    "int32": ("i", 4),
    "uint32": ("I", 4),
    "int64": ("q", 8),
    "float64": ("d", 8),
    "uuid": ("16s", 16),
}
VARIABLE = {"string", "bytes", "records"}
PY_TYPES = {
    "bool": "bool",
    "int8": "int",
    "int16": "int",
    "uint16": "int",
    "int32": "int",
    "uint32": "int",
    "int64": "int",
    "float64": "float",
    "uuid": "_UUID",
    "string": "str",
    "bytes": "bytes",
    "records": "Records",
}


# ---------------------------------------------------------------------------------------------------------
# the pinned source


def pinned_release(pyproject: Path = PYPROJECT) -> str:
    """The kafka-python version pyproject.toml's `gen` extra pins (it must be an exact `==` pin)."""
    extras = tomllib.loads(pyproject.read_text()).get("project", {}).get("optional-dependencies", {})
    for req in extras.get("gen", []):
        m = re.fullmatch(r"\s*kafka-python\s*==\s*([0-9][0-9A-Za-z.+!-]*)\s*", req)
        if m:
            return m.group(1)
    raise SystemExit(
        f"{pyproject}: the `gen` extra must pin {DIST} exactly (`{DIST}==X.Y.Z`): the Kafka codecs "
        "are generated from one release's spec files"
    )


def require_release(installed: str | None, wanted: str) -> None:
    """Refuse any kafka-python but the pinned release (SystemExit with what to do)."""
    if installed == wanted:
        return
    have = f"{DIST} {installed} is installed" if installed else f"{DIST} is not installed"
    raise SystemExit(
        f"{have}, but the Kafka message codecs are generated from the spec files of {DIST} {wanted} "
        f"only (the release pyproject.toml's `gen` extra pins): install it with "
        f"`pip install -e '.[gen]'` (or `make setup`)"
    )


@dataclass(frozen=True)
class SpecSet:
    release: str  # the kafka-python version the files come from
    files: tuple[Path, ...]  # the JSON spec files, in name order
    sha256: str  # over each file's name, a NUL and its bytes, in name order


def spec_digest(files: tuple[Path, ...]) -> str:
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    return digest.hexdigest()


@functools.cache
def spec_set() -> SpecSet:
    """The spec files of the installed, pinned kafka-python (located without importing it: importing runs client
    code and emits deprecation warnings)."""
    wanted = pinned_release()
    try:
        dist: importlib.metadata.Distribution | None = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    require_release(dist.version if dist is not None else None, wanted)
    assert dist is not None
    files = tuple(
        sorted(
            (
                Path(str(dist.locate_file(f)))
                for f in dist.files or ()
                if f.as_posix().startswith(SPEC_PREFIX) and f.suffix == ".json"
            ),
            key=lambda p: p.name,
        )
    )
    if not files or not all(p.is_file() for p in files):
        raise SystemExit(
            f"{DIST} {wanted} is installed but its spec files ({SPEC_PREFIX}*.json) are not all there: "
            f"reinstall it (`pip install --force-reinstall -e '.[gen]'`)"
        )
    return SpecSet(wanted, files, spec_digest(files))


# ---------------------------------------------------------------------------------------------------------
# the specs


def strip_comments(text: str) -> str:
    """Drop // comments outside string literals (the spec files are JSON with comments)."""
    out, i, n, in_str = [], 0, len(text), False
    while i < n:
        c = text[i]
        if in_str:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            out.append(c)
        elif c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def parse_versions(s: str | None) -> tuple[int, int] | None:
    if s is None or s == "none" or s == "":
        return None
    s = s.strip()
    if s.endswith("+"):
        return int(s[:-1]), MAXV
    if "-" in s:
        a, b = s.split("-")
        return int(a), int(b)
    return int(s), int(s)


def in_range(r: tuple[int, int] | None, v: int) -> bool:
    return r is not None and r[0] <= v <= r[1]


def snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
    return s.lower()


@dataclass
class Field:
    name: str
    key: str
    type: str
    versions: tuple[int, int] | None
    nullable: tuple[int, int] | None
    tagged: tuple[int, int] | None
    tag: int | None
    default: str | None
    ignorable: bool
    children: list[Field] | None = None  # struct or struct-array element fields
    struct_name: str | None = None
    flexible_override: tuple[int, int] | bool | None = False  # False = no override

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def elem(self) -> str:
        return self.type[2:] if self.is_array else self.type

    @property
    def is_struct(self) -> bool:
        return self.children is not None


@dataclass
class Message:
    name: str
    api_key: int
    kind: str  # request | response
    valid: tuple[int, int]
    flexible: tuple[int, int] | None
    fields: list[Field]
    file: str = ""


def _default_text(d: object) -> str | None:
    """Spec defaults are usually strings ("-1", "0x7fffffff", "null") but a few files use JSON numbers/booleans."""
    if d is None or isinstance(d, str):
        return d
    if isinstance(d, bool):
        return "true" if d else "false"
    return str(d)


def build_fields(raw: list[dict[str, Any]], common: dict[str, list[dict[str, Any]]]) -> list[Field]:
    fields = []
    for f in raw:
        t = f["type"]
        elem = t[2:] if t.startswith("[]") else t
        children = None
        if elem not in FIXED and elem not in VARIABLE:
            sub = f.get("fields")
            if sub is None:
                sub = common[elem]
            children = build_fields(sub, common)
        fo: tuple[int, int] | bool | None = False
        if "flexibleVersions" in f:
            fo = parse_versions(f["flexibleVersions"])
        fields.append(
            Field(
                name=f["name"],
                key=snake(f["name"]),
                type=t,
                versions=parse_versions(f.get("versions")),
                nullable=parse_versions(f.get("nullableVersions")),
                tagged=parse_versions(f.get("taggedVersions")),
                tag=f.get("tag"),
                default=_default_text(f.get("default")),
                ignorable=bool(f.get("ignorable", False)),
                children=children,
                struct_name=elem if children is not None else None,
                flexible_override=fo,
            )
        )
    return fields


def load_messages(files: tuple[Path, ...] | None = None) -> list[Message]:
    """The request and response specs (default: the pinned release's files)."""
    msgs = []
    for path in files if files is not None else spec_set().files:
        spec = json.loads(strip_comments(path.read_text()))
        if spec.get("type") not in ("request", "response"):
            continue
        common = {c["name"]: c["fields"] for c in spec.get("commonStructs", [])}
        valid = parse_versions(spec["validVersions"])
        assert valid is not None, path
        msgs.append(
            Message(
                name=spec["name"],
                api_key=spec["apiKey"],
                kind=spec["type"],
                valid=valid,
                flexible=parse_versions(spec.get("flexibleVersions")),
                fields=build_fields(spec["fields"], common),
                file=path.name,
            )
        )
    return msgs


def pairs(msgs: list[Message]) -> dict[int, dict[str, Message]]:
    by_key: dict[int, dict[str, Message]] = {}
    for m in msgs:
        by_key.setdefault(m.api_key, {})[m.kind] = m
    return {k: v for k, v in sorted(by_key.items()) if "request" in v and "response" in v}


# ---------------------------------------------------------------------------------------------------------
# default values (as Python source)


def default_is_none(f: Field) -> bool:
    """Whether the field's default (what decoders give when the version lacks it) is None."""
    return f.default == "null" or (f.type == "records" and (f.nullable is not None or f.default is None))


def default_src(f: Field, gen: Gen) -> str:
    d = f.default
    if default_is_none(f):
        return "None"
    if f.is_array:
        return "[]"
    if f.is_struct:
        return gen.default_factory(f) + "()"
    t = f.type
    if t == "bool":
        return "True" if d == "true" else "False"
    if t in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return str(int(d, 0)) if d not in (None, "") else "0"
    if t == "float64":
        return repr(float(d)) if d not in (None, "") else "0.0"
    if t == "string":
        return repr(d) if d is not None else "''"
    if t == "bytes":
        return "b''"
    if t == "uuid":
        return "_ZU"
    raise ValueError(f"no default for {f.name}: {t}")


def encoder_default_src(f: Field, gen: Gen) -> str:
    """Defaults as encoders use them: nothing allocated per call (a missing struct is None, a missing array ())."""
    d = default_src(f, gen)
    if d == "[]":
        return "()"
    if f.is_struct and not f.is_array:
        return "None"
    return d


# ---------------------------------------------------------------------------------------------------------
# types


def version_text(r: tuple[int, int] | None, valid: tuple[int, int]) -> str:
    """A version range as the spec's valid versions see it ("v3+", "v0-v9", "v4")."""
    if r is None or r[1] < valid[0] or r[0] > valid[1]:
        return "no version"
    lo, hi = max(r[0], valid[0]), min(r[1], valid[1])
    if hi == valid[1]:
        return f"v{lo}+"
    return f"v{lo}" if lo == hi else f"v{lo}-v{hi}"


def shape(fields: list[Field]) -> tuple[object, ...]:
    """What two uses of a struct must share to be one TypedDict."""
    return tuple(
        (
            f.key,
            f.type,
            f.versions,
            f.nullable,
            f.tagged,
            f.default,
            shape(f.children) if f.children is not None else None,
        )
        for f in fields
    )


@dataclass
class StructUse:
    """A struct's TypedDict, accumulated over every place the struct is used (a common struct can be used at
    different versions: `AddPartitionsToTxnTopic` in v0-v3 and in v4+)."""

    message: Message  # the first message using it
    fields: list[Field]
    shape: tuple[object, ...]
    present: set[int]  # the versions that carry it
    required: dict[str, bool]
    nullable: dict[str, bool]
    tagged: dict[str, bool]


class Types:
    """The TypedDicts of one API module: a name per struct (by the identity of its field list) and the class
    texts."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.names: dict[int, str] = {}
        self.uses: dict[str, StructUse] = {}

    def name(self, fields: list[Field]) -> str:
        return self.names[id(fields)]

    def struct_name(self, m: Message, struct: str) -> str:
        return struct if struct.startswith(self.api) else m.name + struct

    def add_message(self, m: Message) -> None:
        self._collect(m, m.name, m.fields, list(range(m.valid[0], m.valid[1] + 1)))

    def base(self, f: Field) -> str:
        """The field's type without None."""
        if f.children is not None:
            name = self.name(f.children)
            return f"list[{name}]" if f.is_array else name
        if f.is_array:
            return f"list[{PY_TYPES[f.elem]}]"
        return PY_TYPES[f.type]

    def local(self, f: Field, v: int, or_default: bool = False) -> str:
        """The type of a decoder's local holding the field at version v (`or_default`: also its default)."""
        t = self.base(f)
        if in_range(f.nullable, v) or (or_default and default_is_none(f)):
            t += " | None"
        return t

    def _collect(self, m: Message, name: str, fields: list[Field], present: list[int]) -> None:
        use = self.uses.get(name)
        if use is None:
            use = self.uses[name] = StructUse(
                m,
                fields,
                shape(fields),
                set(),
                {f.key: True for f in fields},
                {f.key: default_is_none(f) for f in fields},
                {f.key: False for f in fields},
            )
        elif use.shape != shape(fields):
            raise SystemExit(f"{m.file}: two different structs would be named {name}: extend Types.struct_name")
        self.names[id(fields)] = name
        use.present.update(present)
        for f in fields:
            at = [v for v in present if in_range(f.versions, v)]
            if f.children is not None:
                self._collect(m, self.struct_name(m, f.struct_name or ""), f.children, at)
            tagged = any(in_range(m.flexible, v) and in_range(f.tagged, v) for v in at)
            use.required[f.key] = use.required[f.key] and bool(at) and len(at) == len(present) and not tagged
            use.nullable[f.key] = use.nullable[f.key] or any(in_range(f.nullable, v) for v in at)
            use.tagged[f.key] = use.tagged[f.key] or tagged

    def classes(self) -> dict[str, str]:
        """name -> class text, each struct before the structs holding it: the modules evaluate annotations (so that
        TypedDict sees NotRequired at run time too), and a class must exist before one names it."""
        order: list[str] = []

        def visit(name: str) -> None:
            if name in order:
                return
            for f in self.uses[name].fields:
                if f.children is not None:
                    visit(self.name(f.children))
            order.append(name)

        for name in list(self.uses):
            visit(name)
        out = {}
        for name in order:
            use = self.uses[name]
            m = use.message
            lines = []
            for f in use.fields:
                t = self.base(f) + (" | None" if use.nullable[f.key] else "")
                if use.required[f.key]:
                    lines.append(f"    {f.key}: {t}")
                    continue
                note = version_text(f.versions, m.valid)
                lines.append(f"    {f.key}: NotRequired[{t}]  # {'tagged, ' if use.tagged[f.key] else ''}{note}")
            where = "no version"
            if use.present:
                where = ", ".join(version_text(r, m.valid) for r in ranges(sorted(use.present)))
            doc = f"{m.name} body" if use.fields is m.fields else f"{m.name} struct {name}"
            text = f'class {name}(TypedDict):\n    """{doc} ({where})."""\n'
            out[name] = text + ("\n" + "\n".join(lines) if lines else "")
        return out


def ranges(versions: list[int]) -> list[tuple[int, int]]:
    """Sorted versions as runs of consecutive ones; a run reaching the last known version is open-ended."""
    out: list[tuple[int, int]] = []
    for v in versions:
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


# ---------------------------------------------------------------------------------------------------------
# code generation


class Structs:
    """struct.Struct constants, shared by every API module (defined once, in _runtime)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}  # fmt -> name

    def name(self, fmt: str) -> str:
        if fmt not in self.names:
            self.names[fmt] = "_S" + fmt.lstrip(">").replace("16s", "u").replace("?", "o")
        return self.names[fmt]


class Gen:
    """The functions and constants of one API module; a function body emitted twice is emitted once."""

    def __init__(self, structs: Structs, types: Types) -> None:
        self.structs = structs
        self.types = types
        self.funcs: dict[str, str] = {}  # signature + body text -> name
        self.order: list[tuple[str, str]] = []
        self.constants: dict[str, str] = {}
        self.counter = 0

    def struct(self, fmt: str) -> str:
        return self.structs.name(fmt)

    def emit(self, prefix: str, sig: str, body: list[str]) -> str:
        text = f"{sig}:\n" + "\n".join("    " + ln for ln in body) + "\n"
        name = self.funcs.get(text)
        if name is None:
            self.counter += 1
            name = f"_{prefix}{self.counter}"
            self.funcs[text] = name
            self.order.append((name, text))
        return name

    def default_factory(self, f: Field) -> str:
        assert f.children is not None
        body = ["return {" + ", ".join(f"{c.key!r}: {default_src(c, self)}" for c in f.children) + "}"]
        return self.emit("df", f"() -> {self.types.name(f.children)}", body)

    def default_constant(self, f: Field) -> str:
        """A module-level instance of a struct's default, for encoders to compare against (never handed out)."""
        factory = self.default_factory(f)
        name = "_K" + factory.lstrip("_")
        self.constants[name] = f"{factory}()"
        return name


class Ctx:
    """Local-variable allocator for one generated function; remembers which locals carry a type declaration
    (a bare annotation, which costs nothing at run time)."""

    def __init__(self) -> None:
        self.n = 0
        self.declared: set[str] = set()

    def var(self) -> str:
        self.n += 1
        return f"v{self.n}"

    def declare(self, var: str, type_: str, ind: str) -> list[str]:
        if var in self.declared:
            return []
        self.declared.add(var)
        return [f"{ind}{var}: {type_}"]


def uvarint_read(var: str, ind: str, two_bytes: bool = False) -> list[str]:
    """Inline read of an unsigned varint; `two_bytes` also inlines the two-byte form (values 128..16383), for
    lengths that are usually past 127 (a partition's records): a call to _uv costs more than the rest of the
    field."""
    lines = [f"{ind}{var} = buf[pos]", f"{ind}if {var} < 128:", f"{ind}    pos += 1"]
    if two_bytes:
        lines += [
            f"{ind}elif buf[pos + 1] < 128:",
            f"{ind}    {var} = ({var} & 127) | (buf[pos + 1] << 7)",
            f"{ind}    pos += 2",
        ]
    return [*lines, f"{ind}else:", f"{ind}    {var}, pos = _uv(buf, pos)"]


def uvarint_write(expr: str, ind: str) -> list[str]:
    return [
        f"{ind}_n = {expr}",
        f"{ind}if _n < 128:",
        f"{ind}    b.append(_n)",
        f"{ind}else:",
        f"{ind}    b += _uvb(_n)",
    ]


def is_flexible_field(f: Field, flexible: bool, v: int) -> bool:
    if f.flexible_override is False:
        return flexible
    return in_range(f.flexible_override, v)  # type: ignore[arg-type]  # not False: a range or None


def tag_order(f: Field) -> int:
    return -1 if f.tag is None else f.tag


def kids(f: Field) -> list[Field]:
    """A struct field's fields."""
    assert f.children is not None, f.name
    return f.children


def is_leaf(fields: list[Field], v: int) -> bool:
    """Whether a struct holds, at version v, neither arrays nor structs."""
    return all(f.type in FIXED or f.type in VARIABLE for f in fields if in_range(f.versions, v))


def is_shallow(fields: list[Field], v: int) -> bool:
    """Whether a struct holds, at version v, no structs but leaf ones (in arrays or not): inlining it in a loop
    costs the generated code a few lines, not a copy of a whole tree."""
    return all(f.children is None or is_leaf(f.children, v) for f in fields if in_range(f.versions, v))


class DecoderGen:
    def __init__(self, gen: Gen) -> None:
        self.gen = gen

    def struct_fn(self, fields: list[Field], v: int, flexible: bool) -> str:
        body, value = self.struct_body(fields, v, flexible, Ctx())
        body.append(f"return {value}, pos")
        sig = f"(buf: memoryview, pos: int, end: int) -> tuple[{self.gen.types.name(fields)}, int]"
        return self.gen.emit("d", sig, body)

    def struct_body(self, fields: list[Field], v: int, flexible: bool, ctx: Ctx) -> tuple[list[str], str]:
        """The statements that read one struct at `pos` (advancing it), and the dict expression that is its value
        after them."""
        body: list[str] = []
        present = [f for f in fields if in_range(f.versions, v)]
        tagged = sorted((f for f in present if flexible and in_range(f.tagged, v)), key=tag_order)
        untagged = [f for f in present if f not in tagged]
        local: dict[str, str] = {}
        i = 0
        while i < len(untagged):
            f = untagged[i]
            if f.type in FIXED:
                run = []
                while i < len(untagged) and untagged[i].type in FIXED:
                    run.append(untagged[i])
                    i += 1
                fmt = ">" + "".join(FIXED[g.type][0] for g in run)
                size = sum(FIXED[g.type][1] for g in run)
                names = [ctx.var() for _ in run]
                for g, nm in zip(run, names):
                    local[g.key] = nm
                body.append(f"{', '.join(names)}, = {self.gen.struct(fmt)}.unpack_from(buf, pos)")
                body.append(f"pos += {size}")
                for g, nm in zip(run, names):
                    if g.type == "uuid":
                        body.append(f"{nm} = _UUID(bytes={nm})")
                continue
            nm = ctx.var()
            local[f.key] = nm
            body += self.field(f, nm, v, flexible, "end", "", ctx)
            i += 1
        if flexible:
            for f in tagged:
                nm = ctx.var()
                local[f.key] = nm
                body += ctx.declare(nm, self.gen.types.local(f, v, or_default=True), "")
                body.append(f"{nm} = {default_src(f, self.gen)}")
            if tagged:
                body += uvarint_read("_nt", "")
                body.append("for _ in range(_nt):")
                body += uvarint_read("_tg", "    ")
                body += uvarint_read("_sz", "    ")
                body.append("    _te = pos + _sz")
                body.append("    if _te > end:")
                body.append("        _trunc()")
                kw = "if"
                for f in tagged:
                    body.append(f"    {kw} _tg == {f.tag}:")
                    body += self.field(f, local[f.key], v, flexible, "_te", "        ", ctx)
                    body.append("        if pos > _te:")
                    body.append("            _bad('tagged field overruns its size')")
                    kw = "elif"
                body.append("    pos = _te")
            else:
                body.append("if buf[pos]:")
                body.append("    pos = _skip_tags(buf, pos, end)")
                body.append("else:")
                body.append("    pos += 1")
        items = []
        for f in fields:
            src = local.get(f.key) or default_src(f, self.gen)
            items.append(f"{f.key!r}: {src}")
        return body, "{" + ", ".join(items) + "}"

    def read_len(self, var: str, compact: bool, width: int, ind: str, two_bytes: bool = False) -> list[str]:
        if compact:
            return [*uvarint_read(var, ind, two_bytes), f"{ind}{var} -= 1"]
        fmt = ">h" if width == 2 else ">i"
        return [f"{ind}{var}, = {self.gen.struct(fmt)}.unpack_from(buf, pos)", f"{ind}pos += {width}"]

    def field(self, f: Field, out: str, v: int, flexible: bool, end: str, ind: str, ctx: Ctx) -> list[str]:
        compact = is_flexible_field(f, flexible, v)
        nullable = in_range(f.nullable, v)
        null_stmt = f"{out} = None" if nullable else f"_bad('null {f.key}')"
        t = f.type
        L: list[str] = []
        if t in FIXED:
            fmt, size = FIXED[t]
            raw = ctx.var() if t == "uuid" else out  # `out` may be declared a UUID (a tagged field)
            L.append(f"{ind}{raw}, = {self.gen.struct('>' + fmt)}.unpack_from(buf, pos)")
            L.append(f"{ind}pos += {size}")
            if t == "uuid":
                L.append(f"{ind}{out} = _UUID(bytes={raw})")
            return L
        if t in VARIABLE:
            ln = ctx.var()
            L += ctx.declare(out, self.gen.types.local(f, v), ind)
            L += self.read_len(ln, compact, 2 if t == "string" else 4, ind, two_bytes=t == "records")
            L.append(f"{ind}if {ln} < 0:")
            L.append(f"{ind}    {null_stmt}")
            L.append(f"{ind}else:")
            L.append(f"{ind}    if pos + {ln} > {end}:")
            L.append(f"{ind}        _trunc()")
            if t == "string":
                L.append(f"{ind}    {out} = str(buf[pos:pos + {ln}], 'utf-8')")
            elif t == "bytes":
                L.append(f"{ind}    {out} = bytes(buf[pos:pos + {ln}])")
            else:  # records: zero copy
                L.append(f"{ind}    {out} = buf[pos:pos + {ln}]")
            L.append(f"{ind}    pos += {ln}")
            return L
        if f.is_array:
            n = ctx.var()
            L += ctx.declare(out, self.gen.types.local(f, v), ind)
            L += self.read_len(n, compact, 4, ind)
            L.append(f"{ind}if {n} < 0:")
            L.append(f"{ind}    {null_stmt}")
            L.append(f"{ind}else:")
            ind2 = ind + "    "
            e = f.elem
            if e in FIXED:
                fmt, size = FIXED[e]
                L.append(f"{ind2}if {n} * {size} > {end} - pos:")
                L.append(f"{ind2}    _trunc()")
                if e == "uuid":
                    L.append(
                        f"{ind2}{out} = [_UUID(bytes=bytes(buf[pos + 16 * _i:pos + 16 * _i + 16])) "
                        f"for _i in range({n})]"
                    )
                else:
                    L.append(f"{ind2}{out} = list(_unpack_from('>%d{fmt}' % {n}, buf, pos))")
                L.append(f"{ind2}pos += {n} * {size}")
                return L
            # every element takes at least one byte on the wire: refuse counts the bytes cannot hold
            L.append(f"{ind2}if {n} > {end} - pos:")
            L.append(f"{ind2}    _trunc()")
            L.append(f"{ind2}{out} = []")
            item = ctx.var()
            if f.is_struct and end == "end" and is_leaf(kids(f), v):
                # a leaf element (Produce's partitions, Fetch's): read in the loop itself, which saves a call
                # and a tuple per element; not inside a tagged field, whose own _te the element's would clobber
                lines, value = self.struct_body(kids(f), v, flexible, ctx)
                L.append(f"{ind2}for _ in range({n}):")
                L += [f"{ind2}    {ln}" for ln in lines]
                L.append(f"{ind2}    {out}.append({value})")
            elif f.is_struct:
                fn = self.struct_fn(kids(f), v, flexible)
                L.append(f"{ind2}for _ in range({n}):")
                L.append(f"{ind2}    {item}, pos = {fn}(buf, pos, {end})")
                L.append(f"{ind2}    {out}.append({item})")
            else:  # array of strings / bytes
                elem = Field(f.name, f.key, e, f.versions, None, None, None, None, False)
                L.append(f"{ind2}for _ in range({n}):")
                L += self.field(elem, item, v, flexible, end, ind2 + "    ", ctx)
                L.append(f"{ind2}    {out}.append({item})")
            return L
        if f.is_struct:
            fn = self.struct_fn(kids(f), v, flexible)
            L += ctx.declare(out, self.gen.types.local(f, v), ind)
            if nullable:
                m = ctx.var()
                L.append(f"{ind}{m}, = {self.gen.struct('>b')}.unpack_from(buf, pos)")
                L.append(f"{ind}pos += 1")
                L.append(f"{ind}if {m} < 0:")
                L.append(f"{ind}    {out} = None")
                L.append(f"{ind}else:")
                L.append(f"{ind}    {out}, pos = {fn}(buf, pos, {end})")
            else:
                L.append(f"{ind}{out}, pos = {fn}(buf, pos, {end})")
            return L
        raise ValueError(f"unhandled type {t}")


class EncoderGen:
    def __init__(self, gen: Gen) -> None:
        self.gen = gen

    def struct_fn(self, fields: list[Field], v: int, flexible: bool) -> str:
        body = self.struct_body(fields, v, flexible, Ctx(), "o")
        body.append("return b")
        sig = f"(o: {self.gen.types.name(fields)}, b: bytearray, parts: list[Buffer]) -> bytearray"
        return self.gen.emit("e", sig, body)

    def struct_body(self, fields: list[Field], v: int, flexible: bool, ctx: Ctx, o: str) -> list[str]:
        """The statements that write the struct held in variable `o` to `b` (and `parts`)."""
        body: list[str] = []
        present = [f for f in fields if in_range(f.versions, v)]
        tagged = sorted((f for f in present if flexible and in_range(f.tagged, v)), key=tag_order)
        untagged = [f for f in present if f not in tagged]
        i = 0
        while i < len(untagged):
            f = untagged[i]
            if f.type in FIXED:
                run = []
                while i < len(untagged) and untagged[i].type in FIXED:
                    run.append(untagged[i])
                    i += 1
                fmt = ">" + "".join(FIXED[g.type][0] for g in run)
                args = []
                for g in run:
                    a = f"{o}.get({g.key!r}, {encoder_default_src(g, self.gen)})"
                    args.append(f"_ub({a})" if g.type == "uuid" else a)
                body.append(f"b += {self.gen.struct(fmt)}.pack({', '.join(args)})")
                continue
            x = ctx.var()
            body.append(f"{x} = {o}.get({f.key!r}, {encoder_default_src(f, self.gen)})")
            body += self.field(f, x, v, flexible, "", ctx, tagged=False)
            i += 1
        if flexible:
            if tagged:
                body += ctx.declare("_tags", "list[tuple[int, bytearray]]", "")
                body.append("_tags = []")
                for f in tagged:
                    x = ctx.var()
                    d = default_src(f, self.gen)
                    if f.is_struct and not f.is_array and d != "None":
                        body.append(f"{x} = {o}.get({f.key!r})")
                        cond = f"{x} is not None and {x} != {self.gen.default_constant(f)}"
                    else:
                        d = encoder_default_src(f, self.gen)
                        body.append(f"{x} = {o}.get({f.key!r}, {d})")
                        cond = f"{x} is not None" if d == "None" else f"{x} != {d}"
                        if d == "()":
                            cond = f"{x}"  # a non-empty array (an empty list equals the default)
                    body.append(f"if {cond}:")
                    body.append("    _outer = b")
                    body.append("    b = bytearray()")
                    body += self.field(f, x, v, flexible, "    ", ctx, tagged=True)
                    body.append(f"    _tags.append(({f.tag}, b))")
                    body.append("    b = _outer")
                body += uvarint_write("len(_tags)", "")
                body.append("for _tg, _tb in _tags:")
                body += uvarint_write("_tg", "    ")
                body += uvarint_write("len(_tb)", "    ")
                body.append("    b += _tb")
            else:
                body.append("b.append(0)")
        return body

    def write_len(self, expr: str, compact: bool, width: int, ind: str) -> list[str]:
        if compact:
            return uvarint_write(f"{expr} + 1", ind)
        return [f"{ind}b += {self.gen.struct('>h' if width == 2 else '>i')}.pack({expr})"]

    def write_null(self, compact: bool, width: int, ind: str) -> list[str]:
        if compact:
            return [f"{ind}b.append(0)"]
        ff = repr(b"\xff" * width)
        return [f"{ind}b += {ff}"]

    def field(self, f: Field, x: str, v: int, flexible: bool, ind: str, ctx: Ctx, tagged: bool) -> list[str]:
        """`tagged`: the field is written inside a tagged-field section (into its own `b`, with `_outer` and
        `_tags` in use)."""
        compact = is_flexible_field(f, flexible, v)
        nullable = in_range(f.nullable, v)
        t = f.type
        L: list[str] = []

        def null_branch(width: int) -> list[str]:
            if nullable:
                return self.write_null(compact, width, ind + "    ")
            return [f"{ind}    _enc_null({f.key!r})"]

        if t in FIXED:
            fmt, _ = FIXED[t]
            val = f"_ub({x})" if t == "uuid" else x
            L.append(f"{ind}b += {self.gen.struct('>' + fmt)}.pack({val})")
            return L
        if t == "string":
            L.append(f"{ind}if {x} is None:")
            L += null_branch(2)
            L.append(f"{ind}else:")
            z = ctx.var()
            L.append(f"{ind}    {z} = {x}.encode()")
            L += self.write_len(f"len({z})", compact, 2, ind + "    ")
            L.append(f"{ind}    b += {z}")
            return L
        if t == "bytes":
            L.append(f"{ind}if {x} is None:")
            L += null_branch(4)
            L.append(f"{ind}else:")
            L += self.write_len(f"len({x})", compact, 4, ind + "    ")
            L.append(f"{ind}    b += {x}")
            return L
        if t == "records":
            L.append(f"{ind}if {x} is None:")
            L += null_branch(4)
            # isinstance, which type checkers follow, once per type: with a tuple of types it costs four times more
            L.append(f"{ind}elif isinstance({x}, list) or isinstance({x}, tuple):")
            L += self.write_len(f"sum(map(len, {x}))", compact, 4, ind + "    ")
            L.append(f"{ind}    parts.append(b)")
            L.append(f"{ind}    parts.extend({x})")
            L.append(f"{ind}    b = bytearray()")
            L.append(f"{ind}else:")
            L += self.write_len(f"len({x})", compact, 4, ind + "    ")
            L.append(f"{ind}    if len({x}) >= 4096:")
            L.append(f"{ind}        parts.append(b)")
            L.append(f"{ind}        parts.append({x})")
            L.append(f"{ind}        b = bytearray()")
            L.append(f"{ind}    else:")
            L.append(f"{ind}        b += {x}")
            return L
        if f.is_array:
            L.append(f"{ind}if {x} is None:")
            L += null_branch(4)
            L.append(f"{ind}else:")
            ind2 = ind + "    "
            L += self.write_len(f"len({x})", compact, 4, ind2)
            e = f.elem
            y = ctx.var()
            if e in FIXED:
                fmt, _ = FIXED[e]
                if e == "uuid":
                    L.append(f"{ind2}for {y} in {x}:")
                    L.append(f"{ind2}    b += _ub({y})")
                else:
                    L.append(f"{ind2}b += _pack('>%d{fmt}' % len({x}), *{x})")
            elif f.is_struct and not tagged and is_shallow(kids(f), v):
                # written in the loop itself (Produce's partition answers, Fetch's): saves a call per element;
                # not inside a tagged field, whose _outer and _tags the element's own tagged fields would clobber
                L.append(f"{ind2}for {y} in {x}:")
                L += [f"{ind2}    {ln}" for ln in self.struct_body(kids(f), v, flexible, ctx, y)]
            elif f.is_struct:
                fn = self.struct_fn(kids(f), v, flexible)
                L.append(f"{ind2}for {y} in {x}:")
                L.append(f"{ind2}    b = {fn}({y}, b, parts)")
            else:
                elem = Field(f.name, f.key, e, f.versions, None, None, None, None, False)
                L.append(f"{ind2}for {y} in {x}:")
                L += self.field(elem, y, v, flexible, ind2 + "    ", ctx, tagged)
            return L
        if f.is_struct:
            fn = self.struct_fn(kids(f), v, flexible)
            if nullable:
                L.append(f"{ind}if {x} is None:")
                L.append(f"{ind}    b += b'\\xff'")
                L.append(f"{ind}else:")
                L.append(f"{ind}    b.append(1)")
                L.append(f"{ind}    b = {fn}({x}, b, parts)")
            else:
                L.append(f"{ind}b = {fn}({x} if {x} is not None else _NO_FIELDS, b, parts)")
            return L
        raise ValueError(f"unhandled type {t}")


# ---------------------------------------------------------------------------------------------------------
# the package's files


RUNTIME = '''
"""What every generated API module of the package shares: the struct.Struct constants, varint and tagged-field
helpers, the helpers that raise on nulls and truncation, the type aliases the modules' annotations use, and the
version lookup with the wrappers that turn low-level exceptions into MalformedMessage / EncodeError. Holds no state.
"""
from __future__ import annotations

import struct as _struct
from collections.abc import Callable
from typing import Any, NoReturn, TypeAlias, TypeVar
from uuid import UUID as _UUID

from mqk.protocol.kafka.errors import EncodeError, MalformedMessage, UnsupportedApiVersion

#: a bytes-like a decoder reads or an encoder writes
Buffer: TypeAlias = bytes | bytearray | memoryview
#: a `records` field: decoders give a memoryview into their input, encoders take a bytes-like or a list or tuple of
#: them (each emitted as its own buffer, never copied)
Records: TypeAlias = Buffer | list[Buffer] | tuple[Buffer, ...]
_T = TypeVar("_T")
_F = TypeVar("_F")
#: one version's decoder: (input, position, end) -> (message, position after it)
Decoder: TypeAlias = Callable[[memoryview, int, int], tuple[_T, int]]
#: one version's encoder: (message, buffer to append to, finished parts) -> the buffer to go on with
Encoder: TypeAlias = Callable[[_T, bytearray, list[Buffer]], bytearray]
#: a body's top-level fields: (key, first version, last version, ignorable, default)
FieldInfo: TypeAlias = tuple[tuple[str, int, int, bool, object], ...]

_pack = _struct.pack
_unpack_from = _struct.unpack_from
_ZU = _UUID(int=0)
# Read-only: "every field at its default" for a missing nested struct. Any, because it stands in for every struct's
# TypedDict: the encoders only call .get(key, default) on it.
_NO_FIELDS: Any = {}
# What malformed input can raise inside a decoder (UnicodeDecodeError is a ValueError); all become MalformedMessage.
_DECODE_ERRORS = (_struct.error, IndexError, ValueError, TypeError, OverflowError)
# What a wrong value from a handler can raise inside an encoder; all become EncodeError.
_ENCODE_ERRORS = (_struct.error, TypeError, ValueError, AttributeError, OverflowError)


def _bad(why: str) -> NoReturn:
    raise MalformedMessage(why)


def _trunc() -> NoReturn:
    raise MalformedMessage("truncated or oversized length")


def _enc_null(key: str) -> NoReturn:
    raise EncodeError(f"field {key!r} is not nullable in this version")


def _uv(buf: memoryview, pos: int) -> tuple[int, int]:
    """Unsigned varint (LEB128, at most 5 bytes for 32 bits) -> (value, new pos)."""
    result = 0
    shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise MalformedMessage("varint too long")


def _uvb(n: int) -> bytearray:
    if n < 0:
        raise EncodeError("negative length")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return out


def _skip_tags(buf: memoryview, pos: int, end: int) -> int:
    n, pos = _uv(buf, pos)
    for _ in range(n):
        _tag, pos = _uv(buf, pos)
        size, pos = _uv(buf, pos)
        pos += size
        if pos > end:
            _trunc()
    return pos


def _ub(u: _UUID | bytes) -> bytes:
    if isinstance(u, _UUID):
        return u.bytes
    u = bytes(u)
    if len(u) != 16:
        raise EncodeError("uuid must be uuid.UUID or 16 bytes")
    return u


def _pick(entry: tuple[int, tuple[_F, ...]], api_key: int, api_version: int) -> _F:
    """The function for `api_version` from a (first version, functions by version) table entry."""
    lo, fns = entry
    i = api_version - lo
    if i < 0 or i >= len(fns):
        raise UnsupportedApiVersion(api_key, api_version)
    return fns[i]


def _run_decoder(fn: Decoder[_T], api_key: int, api_version: int, buf: Buffer) -> _T:
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    try:
        obj, _pos = fn(view, 0, len(view))
    except MalformedMessage:
        raise
    except _DECODE_ERRORS as e:
        raise MalformedMessage(f"api {api_key} v{api_version}: {e.__class__.__name__}: {e}") from None
    return obj


def _run_encoder(fn: Encoder[_T], api_key: int, api_version: int, obj: _T, head: bytearray | None) -> list[Buffer]:
    parts: list[Buffer] = []
    try:
        b = fn(obj, bytearray() if head is None else head, parts)
    except EncodeError:
        raise
    except _ENCODE_ERRORS as e:
        raise EncodeError(f"api {api_key} v{api_version}: {e.__class__.__name__}: {e}") from None
    parts.append(b)
    return parts
'''

INIT_API = '''

# filled by module_for(), an API at a time
_REQ_DEC: dict[int, tuple[int, tuple[Decoder[Any], ...]]] = {}
_REQ_ENC: dict[int, tuple[int, tuple[Encoder[Any], ...]]] = {}
_RESP_DEC: dict[int, tuple[int, tuple[Decoder[Any], ...]]] = {}
_RESP_ENC: dict[int, tuple[int, tuple[Encoder[Any], ...]]] = {}
_FIELDS: dict[tuple[str, int], FieldInfo] = {}


def module_for(api_key: int) -> ModuleType:
    """The API's generated module, imported the first time it is asked for; unknown key -> UnknownApiKey."""
    name = MODULES.get(api_key)
    if name is None:
        raise UnknownApiKey(api_key)
    module = import_module(f"{__name__}.{name}")
    _REQ_DEC[api_key] = module.REQUEST_DECODERS
    _REQ_ENC[api_key] = module.REQUEST_ENCODERS
    _RESP_DEC[api_key] = module.RESPONSE_DECODERS
    _RESP_ENC[api_key] = module.RESPONSE_ENCODERS
    _FIELDS["request", api_key] = module.REQUEST_FIELDS
    _FIELDS["response", api_key] = module.RESPONSE_FIELDS
    return module


def decode_request(api_key: int, api_version: int, buf: Buffer) -> Any:
    """Request body bytes (no size, no header) -> dict with every schema field (defaults where absent): the API's
    `<Name>Request` TypedDict."""
    entry = _REQ_DEC.get(api_key)
    if entry is None:
        entry = module_for(api_key).REQUEST_DECODERS
    return _run_decoder(_pick(entry, api_key, api_version), api_key, api_version, buf)


def decode_response(api_key: int, api_version: int, buf: Buffer) -> Any:
    entry = _RESP_DEC.get(api_key)
    if entry is None:
        entry = module_for(api_key).RESPONSE_DECODERS
    return _run_decoder(_pick(entry, api_key, api_version), api_key, api_version, buf)


def encode_request(api_key: int, api_version: int, obj: Mapping[str, Any],
                   head: bytearray | None = None) -> list[Buffer]:
    """dict -> list of bytes-likes (the body only, or appended to `head`)."""
    entry = _REQ_ENC.get(api_key)
    if entry is None:
        entry = module_for(api_key).REQUEST_ENCODERS
    return _run_encoder(_pick(entry, api_key, api_version), api_key, api_version, obj, head)


def encode_response(api_key: int, api_version: int, obj: Mapping[str, Any],
                    head: bytearray | None = None) -> list[Buffer]:
    """dict -> list of bytes-likes (the body only); `records` lists are passed through uncopied.
    `head`: a bytearray (e.g. size prefix + response header) the body is appended to; it becomes parts[0]."""
    entry = _RESP_ENC.get(api_key)
    if entry is None:
        entry = module_for(api_key).RESPONSE_ENCODERS
    return _run_encoder(_pick(entry, api_key, api_version), api_key, api_version, obj, head)


def check_ignorable(kind: str, api_key: int, api_version: int, obj: Mapping[str, Any]) -> list[str]:
    """Top-level fields set to a non-default value that `api_version` cannot carry and that the spec does not
    mark ignorable (Kafka's encoder would refuse them). Returns their keys; the encoders themselves drop them."""
    info = _FIELDS.get((kind, api_key))
    if info is None:
        module_for(api_key)
        info = _FIELDS[kind, api_key]
    out = []
    for key, lo, hi, ignorable, default in info:
        if not (lo <= api_version <= hi) and not ignorable and key in obj and obj[key] != default:
            out.append(key)
    return out
'''

INIT_GETATTR = '''else:
    def __getattr__(name: str) -> Any:
        """A TypedDict (or an API module) by name, importing its module on first use."""
        module = _TYPES.get(name)
        if module is not None:
            value = getattr(import_module(f"{__name__}.{module}"), name)
        elif name in _MODULE_NAMES:
            value = import_module(f"{__name__}.{name}")
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = value
        return value
'''


def header(spec: SpecSet) -> str:
    return f"{MARK} from Kafka's JSON message specs shipped in {DIST} {spec.release}; DO NOT EDIT (run `make gen`)."


def wrap_names(names: list[str], lead: str, width: int = 116) -> list[str]:
    """`names` as `lead` + comma-separated lines of at most `width` characters (for import lists)."""
    lines, line = [], lead
    for n in names:
        piece = n + ","
        if len(line) + 1 + len(piece) > width:
            lines.append(line)
            line = lead
        line = f"{line} {piece}" if line != lead else lead + piece
    if line != lead:
        lines.append(line)
    return lines


IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RUNTIME_NAMES = {
    "Buffer",
    "Records",
    "Decoder",
    "Encoder",
    "FieldInfo",
    "_ZU",
    "_NO_FIELDS",
    "_bad",
    "_trunc",
    "_enc_null",
    "_uv",
    "_uvb",
    "_skip_tags",
    "_ub",
    "_pack",
    "_unpack_from",
    "_pick",
    "_run_decoder",
    "_run_encoder",
}


def api_module(pair: dict[str, Message], structs: Structs, spec: SpecSet) -> tuple[str, list[str]]:
    """One API's module text and the TypedDict names it defines."""
    req, resp = pair["request"], pair["response"]
    api = req.name[: -len("Request")]
    types = Types(api)
    types.add_message(req)
    types.add_message(resp)
    gen = Gen(structs, types)
    dec, enc = DecoderGen(gen), EncoderGen(gen)
    tables, infos = [], []
    for kind, m in (("REQUEST", req), ("RESPONSE", resp)):
        lo, hi = m.valid
        dfns, efns = [], []
        for v in range(lo, hi + 1):
            flexible = in_range(m.flexible, v)
            dfns.append(dec.struct_fn(m.fields, v, flexible))
            efns.append(enc.struct_fn(m.fields, v, flexible))
        tables.append(f"{kind}_DECODERS: tuple[int, tuple[Decoder[{m.name}], ...]] = ({lo}, ({', '.join(dfns)},))")
        tables.append(f"{kind}_ENCODERS: tuple[int, tuple[Encoder[{m.name}], ...]] = ({lo}, ({', '.join(efns)},))")
        info = []
        for f in m.fields:
            vr = f.versions or (1, 0)
            info.append(f"({f.key!r}, {vr[0]}, {vr[1]}, {f.ignorable}, {default_src(f, gen)})")
        infos.append(f"{kind}_FIELDS: FieldInfo = ({''.join(i + ', ' for i in info).rstrip()})")

    body = [f"API_KEY = {req.api_key}", ""]
    classes = types.classes()
    for text in classes.values():
        body += ["", text, ""]
    for name, text in gen.order:
        body += ["", f"def {name}{text}"]
    body.append("")
    body += [f"{name} = {expr}" for name, expr in sorted(gen.constants.items())]
    body += ["", *tables, *infos]
    for kind, m in (("request", req), ("response", resp)):
        up = kind.upper()
        body += [
            "",
            "",
            f"def decode_{kind}(api_version: int, buf: Buffer) -> {m.name}:",
            f'    """{m.name} body bytes (no size, no header) -> every field of the schema (defaults where the '
            'version lacks one)."""',
            f"    return _run_decoder(_pick({up}_DECODERS, API_KEY, api_version), API_KEY, api_version, buf)",
            "",
            "",
            f"def encode_{kind}(api_version: int, obj: {m.name}, head: bytearray | None = None) -> list[Buffer]:",
            f'    """{m.name} body -> bytes-likes (appended to `head` when given, which becomes the first)."""',
            f"    return _run_encoder(_pick({up}_ENCODERS, API_KEY, api_version), API_KEY, api_version, obj, head)",
        ]
    text = "\n".join(body)
    used = set(IDENT.findall(text))
    runtime = sorted(RUNTIME_NAMES & used, key=lambda n: (n.startswith("_"), n))
    shared = sorted(set(structs.names.values()) & used)
    typing = [n for n in ("NotRequired", "TypedDict") if n in used]
    doc = (
        f'"""{api} (api key {req.api_key}): the TypedDicts and codecs of its request (versions '
        f"{req.valid[0]}-{req.valid[1]}) and response (versions {resp.valid[0]}-{resp.valid[1]}), generated.\n\n"
        f"Types: `{req.name}`, `{resp.name}` and their structs. Entry points: `decode_request(version, buf)`,\n"
        "`encode_request(version, obj, head=None)`, `decode_response`, `encode_response`; the untyped ones by api\n"
        'key are in the package (mqk.protocol.kafka.messages).\n"""'
    )
    # no `from __future__ import annotations`: TypedDict reads NotRequired only from evaluated annotations
    head = [header(spec), doc]
    if typing:
        head.append(f"from typing import {', '.join(typing)}")
    if "_UUID" in used:
        head.append("from uuid import UUID as _UUID")
    head += ["", f"from {PACKAGE} import _runtime", f"from {PACKAGE}._runtime import ("]
    head += wrap_names(runtime, "    ")
    head.append(")")
    if shared:
        # Assigned, not imported by name: CPython compiles `name.method(...)` without its method-call shortcut
        # (a bound method per call) when `name` comes from an import statement, and these run per field.
        head += ["", *(f"{n} = _runtime.{n}" for n in shared)]
    return "\n".join(head) + "\n\n" + text.rstrip() + "\n", list(classes)


def runtime_module(structs: Structs, spec: SpecSet) -> str:
    lines = [
        header(spec),
        RUNTIME.strip("\n"),
        "",
        "# one struct.Struct per run of fixed-width fields, named after its format (o: bool, u: uuid)",
    ]
    for fmt, name in sorted(structs.names.items(), key=lambda kv: kv[1]):
        lines.append(f"{name} = _struct.Struct({fmt!r})")
    return "\n".join(lines) + "\n"


def init_module(spec: SpecSet, meta: list[str], modules: dict[int, str], types: dict[int, list[str]]) -> str:
    lines = [
        header(spec),
        f'"""Kafka message codecs and types, one module per API, generated from the JSON message specs of {DIST}',
        f"{spec.release} (tools/gen_kafka_messages.py describes the layout, the types and the wire rules).",
        f"Spec files sha256: {spec.sha256}",
        "",
        "Untyped entry points by api key, as the connection codec calls them (the TypedDict depends on the key):",
        "`decode_request(api_key, version, buf)`, `encode_response(api_key, version, obj, head=None)`, the symmetric",
        "`encode_request` / `decode_response`, and `check_ignorable(kind, api_key, version, obj)`. An API's module is",
        "imported the first time one of its messages passes (`module_for(api_key)`): a process compiles the codecs of",
        "the APIs it uses, no others.",
        "",
        "Types: every request, response and struct TypedDict of every API module can be imported from here",
        "(`from mqk.protocol.kafka.messages import ProduceRequest`); type checkers see them through the imports under",
        "TYPE_CHECKING, and at run time a module __getattr__ imports the API's module when a name is first used.",
        '"""',
        "from __future__ import annotations",
        "",
        "from collections.abc import Mapping",
        "from importlib import import_module",
        "from types import ModuleType",
        "from typing import TYPE_CHECKING, Any",
        "",
        "from mqk.protocol.kafka.errors import UnknownApiKey",
        f"from {PACKAGE}._runtime import _ZU, Buffer, Decoder, Encoder, FieldInfo, _pick, _run_decoder, _run_encoder",
        "",
        "#: the release the codecs were generated from, and the sha256 of its spec files (see the generator)",
        f"SPEC_RELEASE = {DIST + '==' + spec.release!r}",
        f"SPEC_SHA256 = {spec.sha256!r}",
        "#: the uuid every uuid field defaults to",
        "ZERO_UUID = _ZU",
        "",
        "#: api_key -> (name, min_version, max_version, first flexible request version or -1)",
        "MESSAGES: dict[int, tuple[str, int, int, int]] = {",
        *meta,
        "}",
        "#: api_key -> the module of this package that holds the API's codecs and types",
        "MODULES: dict[int, str] = {",
        *(f"    {k}: {name!r}," for k, name in modules.items()),
        "}",
        "_MODULE_NAMES = frozenset(MODULES.values())",
        "# TypedDict name -> its module",
        "_TYPES: dict[str, str] = {",
        *(f"    {n!r}: {modules[k]!r}," for k, names in types.items() for n in names),
        "}",
    ]
    lines.append(INIT_API.rstrip("\n"))
    lines += ["", "", "if TYPE_CHECKING:"]
    for k, names in types.items():
        lines.append(f"    from {PACKAGE}.{modules[k]} import (")
        lines += wrap_names([f"{n} as {n}" for n in names], "        ")
        lines.append("    )")
    lines.append(INIT_GETATTR.rstrip("\n"))
    return "\n".join(lines) + "\n"


def generate(spec: SpecSet | None = None) -> dict[str, str]:
    """file name -> text, for every file of the package."""
    spec = spec or spec_set()
    structs = Structs()
    files: dict[str, str] = {}
    meta, modules, types = [], {}, {}
    owner: dict[str, str] = {}
    for api_key, pair in pairs(load_messages(spec.files)).items():
        req = pair["request"]
        api = req.name[: -len("Request")]
        modules[api_key] = snake(api)
        text, names = api_module(pair, structs, spec)
        for n in names:
            if n in owner:
                raise SystemExit(
                    f"TypedDict {n} would be defined by both {owner[n]} and {modules[api_key]}: "
                    "extend Types.struct_name"
                )
            owner[n] = modules[api_key]
        files[modules[api_key] + ".py"] = text
        types[api_key] = names
        flex_lo = req.flexible[0] if req.flexible else -1
        meta.append(f"    {api_key}: ({api!r}, {req.valid[0]}, {req.valid[1]}, {flex_lo}),")
    files["_runtime.py"] = runtime_module(structs, spec)
    files["__init__.py"] = init_module(spec, meta, modules, types)
    return dict(sorted(files.items()))


def recorded_sha256(out: Path) -> str | None:
    init = out / "__init__.py"
    if not init.exists():
        return None
    m = re.search(r"^SPEC_SHA256 = ['\"]([0-9a-f]+)['\"]$", init.read_text(), re.M)
    return m.group(1) if m else None


def generated_files(out: Path) -> list[Path]:
    """The files in `out` that say they were generated (what a regeneration replaces or removes)."""
    return sorted(p for p in out.glob("*.py") if p.read_text().startswith(MARK))


def check(out: Path, files: dict[str, str], spec: SpecSet) -> list[str]:
    """What keeps the committed package at `out` from being this generation (empty: it is)."""
    problems = []
    recorded = recorded_sha256(out)
    if recorded != spec.sha256:
        problems.append(
            f"spec set: the committed codecs record sha256 {recorded}, the spec files of the installed "
            f"{DIST} {spec.release} hash to {spec.sha256}"
        )
    for name, text in files.items():
        path = out / name
        if not path.exists():
            problems.append(f"{path}: missing")
        elif path.read_text() != text:
            problems.append(f"{path}: differs from a fresh generation")
    problems += [f"{p}: left over (no API generates it)" for p in generated_files(out) if p.name not in files]
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed package is not current")
    ap.add_argument("--output", type=Path, default=OUT, help="the package directory")
    args = ap.parse_args(argv)
    spec = spec_set()
    files = generate(spec)
    out: Path = args.output
    if args.check:
        problems = check(out, files, spec)
        if problems:
            print(f"{out} is stale (run `make gen`, tools/gen_kafka_messages.py):", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            return 1
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for old in generated_files(out):
        if old.name not in files:
            old.unlink()
    for name, text in files.items():
        path = out / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    lines = sum(len(t.splitlines()) for t in files.values())
    print(f"wrote {out} ({len(files)} files, {lines} lines) from {DIST} {spec.release}, specs sha256 {spec.sha256}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Generate mqk/protocol/kafka/messages.py from Kafka's JSON message specs (the copies kafka-python ships).

Usage:  python tools/gen_kafka_messages.py            # (re)write the module
        python tools/gen_kafka_messages.py --check    # exit 1 if the committed module is stale

What comes out: for every request/response pair and every valid version, a decoder and an encoder specialised for
that version, as straight-line Python (consecutive fixed-width fields packed/unpacked by one precompiled
struct.Struct, inline varints, no per-field dispatch at run time). Identical function bodies across versions are
emitted once. Messages are plain dicts with snake_case keys; decoders fill every field the schema knows (defaults
for those absent from the version), encoders take any subset (defaults for the rest).

Wire rules implemented (Kafka's "flexible versions", KIP-482): compact strings/bytes/arrays (unsigned varint
length + 1, 0 = null), a tagged-field section after every struct, tagged fields written only when they differ
from their default; non-flexible versions use int16 string lengths, int32 bytes/array lengths, -1 = null.
Nullable structs carry an int8 presence marker. `records` decode as memoryviews into the input and encode from
bytes-likes or lists of them (emitted as separate buffers, never copied).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "mqk" / "protocol" / "kafka" / "messages.py"
MAXV = 0x7FFF

FIXED = {"bool": ("?", 1), "int8": ("b", 1), "int16": ("h", 2), "uint16": ("H", 2), "int32": ("i", 4),
         "uint32": ("I", 4), "int64": ("q", 8), "float64": ("d", 8), "uuid": ("16s", 16)}
VARIABLE = {"string", "bytes", "records"}


def spec_dir() -> Path:
    # Located without importing kafka-python (importing it runs client code and emits deprecation warnings).
    import importlib.util

    spec = importlib.util.find_spec("kafka")
    if spec is None or spec.origin is None:
        raise SystemExit("kafka-python (the source of the JSON specs) is not installed")
    return Path(spec.origin).resolve().parent / "protocol" / "schemas" / "resources"


def kafka_python_version() -> str:
    from importlib.metadata import version

    return version("kafka-python")


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
    children: list["Field"] | None = None  # struct or struct-array element fields
    struct_name: str | None = None
    flexible_override: tuple[int, int] | None | bool = False  # False = no override

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


def build_fields(raw: list[dict], common: dict[str, list[dict]]) -> list[Field]:
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
        fo: tuple[int, int] | None | bool = False
        if "flexibleVersions" in f:
            fo = parse_versions(f["flexibleVersions"])
        fields.append(Field(
            name=f["name"], key=snake(f["name"]), type=t, versions=parse_versions(f.get("versions")),
            nullable=parse_versions(f.get("nullableVersions")), tagged=parse_versions(f.get("taggedVersions")),
            tag=f.get("tag"), default=_default_text(f.get("default")), ignorable=bool(f.get("ignorable", False)),
            children=children, struct_name=elem if children is not None else None, flexible_override=fo))
    return fields


def load_messages(directory: Path | None = None) -> list[Message]:
    directory = directory or spec_dir()
    msgs = []
    for path in sorted(directory.glob("*.json")):
        spec = json.loads(strip_comments(path.read_text()))
        if spec.get("type") not in ("request", "response"):
            continue
        common = {c["name"]: c["fields"] for c in spec.get("commonStructs", [])}
        msgs.append(Message(name=spec["name"], api_key=spec["apiKey"], kind=spec["type"],
                            valid=parse_versions(spec["validVersions"]),
                            flexible=parse_versions(spec.get("flexibleVersions")),
                            fields=build_fields(spec["fields"], common), file=path.name))
    return msgs


def pairs(msgs: list[Message]) -> dict[int, dict[str, Message]]:
    by_key: dict[int, dict[str, Message]] = {}
    for m in msgs:
        by_key.setdefault(m.api_key, {})[m.kind] = m
    return {k: v for k, v in sorted(by_key.items()) if "request" in v and "response" in v}


# ---------------------------------------------------------------------------------------------------------
# default values (as Python source)


def default_src(f: Field, gen: "Gen") -> str:
    d = f.default
    nullable_somewhere = f.nullable is not None
    if d == "null":
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
    if t == "records":
        return "None" if nullable_somewhere or d is None else "b''"
    if t == "uuid":
        return "_ZU"
    raise ValueError(f"no default for {f.name}: {t}")


# ---------------------------------------------------------------------------------------------------------
# code generation


class Gen:
    def __init__(self) -> None:
        self.funcs: dict[str, str] = {}  # body text -> name
        self.order: list[tuple[str, str]] = []
        self.structs: dict[str, str] = {}  # fmt -> name
        self.constants: dict[str, str] = {}
        self.counter = 0

    def struct(self, fmt: str) -> str:
        if fmt not in self.structs:
            self.structs[fmt] = "_S" + fmt.lstrip(">").replace("16s", "u").replace("?", "o")
        return self.structs[fmt]

    def emit(self, prefix: str, params: str, body: list[str]) -> str:
        text = f"({params}):\n" + "\n".join("    " + ln for ln in body) + "\n"
        name = self.funcs.get(text)
        if name is None:
            self.counter += 1
            name = f"_{prefix}{self.counter}"
            self.funcs[text] = name
            self.order.append((name, text))
        return name

    def default_factory(self, f: Field) -> str:
        body = ["return {" + ", ".join(f"{c.key!r}: {default_src(c, self)}" for c in f.children) + "}"]
        return self.emit("df", "", body)

    def default_constant(self, f: Field) -> str:
        """A module-level instance of a struct's default, for encoders to compare against (never handed out)."""
        factory = self.default_factory(f)
        name = "_K" + factory.lstrip("_")
        self.constants[name] = f"{factory}()"
        return name


def encoder_default_src(f: Field, gen: Gen) -> str:
    """Defaults as encoders use them: nothing allocated per call (a missing struct is None, a missing array ())."""
    d = default_src(f, gen)
    if d == "[]":
        return "()"
    if f.is_struct and not f.is_array:
        return "None"
    return d


class Ctx:
    """Local-variable allocator for one generated function."""

    def __init__(self) -> None:
        self.n = 0

    def var(self) -> str:
        self.n += 1
        return f"v{self.n}"


def uvarint_read(var: str, ind: str, two_bytes: bool = False) -> list[str]:
    """Inline read of an unsigned varint; `two_bytes` also inlines the two-byte form (values 128..16383), for
    lengths that are usually past 127 (a partition's records): a call to _uv costs more than the rest of the
    field."""
    lines = [f"{ind}{var} = buf[pos]",
             f"{ind}if {var} < 128:",
             f"{ind}    pos += 1"]
    if two_bytes:
        lines += [f"{ind}elif buf[pos + 1] < 128:",
                  f"{ind}    {var} = ({var} & 127) | (buf[pos + 1] << 7)",
                  f"{ind}    pos += 2"]
    return lines + [f"{ind}else:",
                    f"{ind}    {var}, pos = _uv(buf, pos)"]


def uvarint_write(expr: str, ind: str) -> list[str]:
    return [f"{ind}_n = {expr}",
            f"{ind}if _n < 128:",
            f"{ind}    b.append(_n)",
            f"{ind}else:",
            f"{ind}    b += _uvb(_n)"]


def is_flexible_field(f: Field, flexible: bool, v: int) -> bool:
    if f.flexible_override is False:
        return flexible
    return in_range(f.flexible_override, v)  # type: ignore[arg-type]


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
        return self.gen.emit("d", "buf, pos, end", body)

    def struct_body(self, fields: list[Field], v: int, flexible: bool, ctx: Ctx) -> tuple[list[str], str]:
        """The statements that read one struct at `pos` (advancing it), and the dict expression that is its value
        after them."""
        body: list[str] = []
        present = [f for f in fields if in_range(f.versions, v)]
        tagged = sorted((f for f in present if flexible and in_range(f.tagged, v)), key=lambda f: f.tag)
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
            return uvarint_read(var, ind, two_bytes) + [f"{ind}{var} -= 1"]
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
            L.append(f"{ind}{out}, = {self.gen.struct('>' + fmt)}.unpack_from(buf, pos)")
            L.append(f"{ind}pos += {size}")
            if t == "uuid":
                L.append(f"{ind}{out} = _UUID(bytes={out})")
            return L
        if t in VARIABLE:
            ln = ctx.var()
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
                    L.append(f"{ind2}{out} = [_UUID(bytes=bytes(buf[pos + 16 * _i:pos + 16 * _i + 16])) "
                             f"for _i in range({n})]")
                else:
                    L.append(f"{ind2}{out} = list(_unpack_from('>%d{fmt}' % {n}, buf, pos))")
                L.append(f"{ind2}pos += {n} * {size}")
                return L
            # every element takes at least one byte on the wire: refuse counts the bytes cannot hold
            L.append(f"{ind2}if {n} > {end} - pos:")
            L.append(f"{ind2}    _trunc()")
            L.append(f"{ind2}{out} = []")
            item = ctx.var()
            if f.is_struct and end == "end" and is_leaf(f.children, v):
                # a leaf element (Produce's partitions, Fetch's): read in the loop itself, which saves a call
                # and a tuple per element; not inside a tagged field, whose own _te the element's would clobber
                lines, value = self.struct_body(f.children, v, flexible, ctx)
                L.append(f"{ind2}for _ in range({n}):")
                L += [f"{ind2}    {ln}" for ln in lines]
                L.append(f"{ind2}    {out}.append({value})")
            elif f.is_struct:
                fn = self.struct_fn(f.children, v, flexible)
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
            fn = self.struct_fn(f.children, v, flexible)
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
        return self.gen.emit("e", "o, b, parts", body)

    def struct_body(self, fields: list[Field], v: int, flexible: bool, ctx: Ctx, o: str) -> list[str]:
        """The statements that write the struct held in variable `o` to `b` (and `parts`)."""
        body: list[str] = []
        present = [f for f in fields if in_range(f.versions, v)]
        tagged = sorted((f for f in present if flexible and in_range(f.tagged, v)), key=lambda f: f.tag)
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
            L.append(f"{ind}    {x} = {x}.encode()")
            L += self.write_len(f"len({x})", compact, 2, ind + "    ")
            L.append(f"{ind}    b += {x}")
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
            L.append(f"{ind}elif {x}.__class__ is list or {x}.__class__ is tuple:")
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
            elif f.is_struct and not tagged and is_shallow(f.children, v):
                # written in the loop itself (Produce's partition answers, Fetch's): saves a call per element;
                # not inside a tagged field, whose _outer and _tags the element's own tagged fields would clobber
                L.append(f"{ind2}for {y} in {x}:")
                L += [f"{ind2}    {ln}" for ln in self.struct_body(f.children, v, flexible, ctx, y)]
            elif f.is_struct:
                fn = self.struct_fn(f.children, v, flexible)
                L.append(f"{ind2}for {y} in {x}:")
                L.append(f"{ind2}    b = {fn}({y}, b, parts)")
            else:
                elem = Field(f.name, f.key, e, f.versions, None, None, None, None, False)
                L.append(f"{ind2}for {y} in {x}:")
                L += self.field(elem, y, v, flexible, ind2 + "    ", ctx, tagged)
            return L
        if f.is_struct:
            fn = self.struct_fn(f.children, v, flexible)
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


PRELUDE = '''
from struct import Struct as _Struct, error as _StructError, pack as _pack, unpack_from as _unpack_from
from uuid import UUID as _UUID

from mqk.protocol.kafka.errors import EncodeError, MalformedMessage, UnknownApiKey, UnsupportedApiVersion

_ZU = _UUID(int=0)
_NO_FIELDS = {}  # read-only: "every field at its default" for a missing nested struct
# What malformed input can raise inside a decoder (UnicodeDecodeError is a ValueError); all become MalformedMessage.
_DECODE_ERRORS = (_StructError, IndexError, ValueError, TypeError, OverflowError)
# What a wrong value from a handler can raise inside an encoder; all become EncodeError.
_ENCODE_ERRORS = (_StructError, TypeError, ValueError, AttributeError, OverflowError)


def _bad(why):
    raise MalformedMessage(why)


def _trunc():
    raise MalformedMessage("truncated or oversized length")


def _enc_null(key):
    raise EncodeError(f"field {key!r} is not nullable in this version")


def _uv(buf, pos):
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


def _uvb(n):
    if n < 0:
        raise EncodeError("negative length")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return out


def _skip_tags(buf, pos, end):
    n, pos = _uv(buf, pos)
    for _ in range(n):
        _tag, pos = _uv(buf, pos)
        size, pos = _uv(buf, pos)
        pos += size
        if pos > end:
            _trunc()
    return pos


def _ub(u):
    if u.__class__ is _UUID:
        return u.bytes
    u = bytes(u)
    if len(u) != 16:
        raise EncodeError("uuid must be uuid.UUID or 16 bytes")
    return u
'''

API = '''

def _lookup(table, api_key, api_version):
    entry = table.get(api_key)
    if entry is None:
        raise UnknownApiKey(api_key)
    lo, fns = entry
    i = api_version - lo
    if i < 0 or i >= len(fns):
        raise UnsupportedApiVersion(api_key, api_version)
    return fns[i]


def _decode(table, api_key, api_version, buf):
    fn = _lookup(table, api_key, api_version)
    if buf.__class__ is not memoryview:
        buf = memoryview(buf)
    if buf.ndim != 1 or buf.itemsize != 1:
        buf = buf.cast("B")
    try:
        obj, _pos = fn(buf, 0, len(buf))
    except MalformedMessage:
        raise
    except _DECODE_ERRORS as e:
        raise MalformedMessage(f"api {api_key} v{api_version}: {e.__class__.__name__}: {e}") from None
    return obj


def _encode(table, api_key, api_version, obj, head=None):
    fn = _lookup(table, api_key, api_version)
    parts = []
    try:
        b = fn(obj, bytearray() if head is None else head, parts)
    except EncodeError:
        raise
    except _ENCODE_ERRORS as e:
        raise EncodeError(f"api {api_key} v{api_version}: {e.__class__.__name__}: {e}") from None
    parts.append(b)
    return parts


def decode_request(api_key, api_version, buf):
    """Request body bytes (no size, no header) -> dict with every schema field (defaults where absent)."""
    return _decode(_REQ_DEC, api_key, api_version, buf)


def decode_response(api_key, api_version, buf):
    return _decode(_RESP_DEC, api_key, api_version, buf)


def encode_request(api_key, api_version, obj, head=None):
    """dict -> list of bytes-likes (the body only, or appended to `head`)."""
    return _encode(_REQ_ENC, api_key, api_version, obj, head)


def encode_response(api_key, api_version, obj, head=None):
    """dict -> list of bytes-likes (the body only); `records` lists are passed through uncopied.
    `head`: a bytearray (e.g. size prefix + response header) the body is appended to; it becomes parts[0]."""
    return _encode(_RESP_ENC, api_key, api_version, obj, head)


def check_ignorable(kind, api_key, api_version, obj):
    """Top-level fields set to a non-default value that `api_version` cannot carry and that the spec does not
    mark ignorable (Kafka's encoder would refuse them). Returns their keys; the encoders themselves drop them."""
    out = []
    for key, lo, hi, ignorable, default in _FIELD_INFO[(kind, api_key)]:
        if not (lo <= api_version <= hi) and not ignorable and key in obj and obj[key] != default:
            out.append(key)
    return out
'''


def generate() -> str:
    msgs = load_messages()
    gen = Gen()
    dec, enc = DecoderGen(gen), EncoderGen(gen)
    tables: dict[str, dict[int, tuple[int, list[str]]]] = {"REQ_DEC": {}, "REQ_ENC": {}, "RESP_DEC": {},
                                                               "RESP_ENC": {}}
    meta = []
    field_info = []
    for api_key, pair in pairs(msgs).items():
        for kind in ("request", "response"):
            m = pair[kind]
            lo, hi = m.valid
            dfns, efns = [], []
            for v in range(lo, hi + 1):
                flexible = in_range(m.flexible, v)
                dfns.append(dec.struct_fn(m.fields, v, flexible))
                efns.append(enc.struct_fn(m.fields, v, flexible))
            pre = "REQ" if kind == "request" else "RESP"
            tables[pre + "_DEC"][api_key] = (lo, dfns)
            tables[pre + "_ENC"][api_key] = (lo, efns)
            info = []
            for f in m.fields:
                vr = f.versions or (1, 0)
                info.append(f"({f.key!r}, {vr[0]}, {vr[1]}, {f.ignorable}, {default_src(f, gen)})")
            field_info.append(f"    ({kind!r}, {api_key}): [{', '.join(info)}],")
        req = pair["request"]
        flex_lo = req.flexible[0] if req.flexible else -1
        meta.append(f"    {api_key}: ({req.name[:-len('Request')]!r}, {req.valid[0]}, {req.valid[1]}, {flex_lo}),")

    digest = hashlib.sha256()
    for p in sorted(spec_dir().glob("*.json")):
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    lines = [
        f"# Generated by tools/gen_kafka_messages.py from Kafka's JSON message specs shipped in kafka-python "
        f"{kafka_python_version()}; DO NOT EDIT (run `make gen`).",
        '"""Per-version Kafka message codecs (generated). Messages are plain dicts with snake_case keys; see',
        "mqk/protocol/kafka/__init__.py for the shape and tools/gen_kafka_messages.py for the wire rules.",
        f"Spec files sha256: {digest.hexdigest()}",
        '"""',
        "# ruff: noqa",
        "from __future__ import annotations",
    ]
    lines.append(PRELUDE)
    for fmt, name in sorted(gen.structs.items(), key=lambda kv: kv[1]):
        lines.append(f"{name} = _Struct({fmt!r})")
    lines.append("")
    for name, text in gen.order:
        lines.append(f"\ndef {name}{text}")
    lines.append("")
    for name, expr in sorted(gen.constants.items()):
        lines.append(f"{name} = {expr}")
    lines.append("")
    lines.append("# api_key -> (name, min_version, max_version, first flexible request version or -1)")
    lines.append("MESSAGES = {")
    lines += meta
    lines.append("}")
    for tname, table in tables.items():
        lines.append(f"_{tname} = {{")
        for api_key, (lo, fns) in table.items():
            lines.append(f"    {api_key}: ({lo}, ({', '.join(fns)},)),")
        lines.append("}")
    lines.append("_FIELD_INFO = {")
    lines += field_info
    lines.append("}")
    lines.append(API)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed module is not current")
    ap.add_argument("--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    text = generate()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run `make gen` (tools/gen_kafka_messages.py)", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

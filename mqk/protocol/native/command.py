"""RocketMQ remoting frames and commands, sans-IO (bytes in, `RemotingCommand` out, and back).

Frame: `[total length: i32][serialize type: u8 | header length: u24][header][body]`, big-endian, where total length
counts everything after itself. The header is either JSON (RemotingSerializable; what every 4.x client sends by
default, and the only form ali-ons understands) or ROCKETMQ's compact binary form (RocketMQSerializable). A
response is always written in the serialisation of the request it answers.

`FrameDecoder` checks a frame's declared sizes before it buffers or allocates anything: a total length outside
[4, max_frame_bytes] raises `FrameTooLarge`, a header length that cannot fit in its frame raises
`RemotingProtocolError`. Either way the caller closes the connection. Bytes are buffered in one bytearray with a
read position, so a frame arriving in many small chunks costs no quadratic re-scanning.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from mqk.errors import FrameTooLarge, ProtocolError
from mqk.protocol.native.codes import FLAG_ONEWAY, FLAG_RESPONSE, LanguageCode, SerializeType

#: RocketMQ's own default ceiling for a remoting frame (NettySystemConfig's frame max length is 16 MiB)
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
#: the version number mqk reports in its own commands (RocketMQ's MQVersion for 4.9.x)
MQK_VERSION = 401
_MAX_HEADER = (1 << 24) - 1
_I32 = struct.Struct(">i")
_BIN_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1  # what an int ext field may hold (a Java long)


class RemotingProtocolError(ProtocolError):
    """The peer sent bytes that are not a valid remoting frame or header."""


class HeaderFieldError(RemotingProtocolError):
    """A request lacks a required ext field, or one does not parse (RocketMQ: RemotingCommandException)."""


@dataclass
class RemotingCommand:
    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    language: str = "JAVA"
    version: int = MQK_VERSION
    serialize_type: int = SerializeType.JSON

    # --- kinds ------------------------------------------------------------------------------------------

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(
        self, code: int, remark: str | None = None, ext: dict[str, Any] | None = None, body: bytes | None = None
    ) -> RemotingCommand:
        """A response to this request: same opaque and serialisation, the response bit set."""
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=stringify_fields(ext or {}),
            body=body,
            language="JAVA",
            version=self.version,
            serialize_type=self.serialize_type,
        )

    # --- ext field accessors (RocketMQ's decodeCommandCustomHeader) ---------------------------------------

    def get_str(self, name: str, default: str | None = None, required: bool = False) -> str | None:
        value = self.ext_fields.get(name)
        if value is None:
            if required:
                raise HeaderFieldError(f"the custom field <{name}> is null")
            return default
        return value

    def get_int(self, name: str, default: int | None = None, required: bool = False) -> int | None:
        value = self.ext_fields.get(name)
        if value is None or value == "" or value == "null":
            if required:
                raise HeaderFieldError(f"the custom field <{name}> is null")
            return default
        try:
            number = int(value)
        except ValueError:
            try:  # JS clients may send 1.0-style numbers
                as_float = float(value)
            except ValueError:
                raise HeaderFieldError(f"the custom field <{name}> is not a number: {value[:40]!r}") from None
            if as_float != as_float or as_float in (float("inf"), float("-inf")):
                raise HeaderFieldError(f"the custom field <{name}> is not a finite number") from None
            number = int(as_float)
        # a Java long at most (RocketMQ parses these with Long.parseLong): a larger number would reach the kernels,
        # which take 64-bit integers, and fail there with an untyped error
        if not _LONG_MIN <= number <= _LONG_MAX:
            raise HeaderFieldError(f"the custom field <{name}> is outside the 64-bit range: {value[:40]!r}")
        return number

    def get_bool(self, name: str, default: bool = False) -> bool:
        value = self.ext_fields.get(name)
        if value is None:
            return default
        return value.lower() == "true"

    # --- encoding ----------------------------------------------------------------------------------------

    def encode_header(self) -> bytes:
        if self.serialize_type == SerializeType.ROCKETMQ:
            return _encode_binary_header(self)
        doc: dict[str, Any] = {
            "code": self.code,
            "language": self.language,
            "version": self.version,
            "opaque": self.opaque,
            "flag": self.flag,
        }
        if self.remark is not None:
            doc["remark"] = self.remark
        doc["extFields"] = self.ext_fields
        doc["serializeTypeCurrentRPC"] = "JSON"
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()

    def encode(self) -> bytes:
        header = self.encode_header()
        if len(header) > _MAX_HEADER:
            raise RemotingProtocolError(f"header of {len(header)} bytes does not fit the 24-bit length")
        body = self.body or b""
        total = 4 + len(header) + len(body)
        return b"".join(
            (
                _I32.pack(total),
                _I32.pack((int(self.serialize_type) << 24) | len(header)),
                header,
                body,
            )
        )


def stringify_fields(fields: dict[str, Any]) -> dict[str, str]:
    """ext fields are strings on the wire; JS clients send numbers and booleans, Java sends `true`/`false`."""
    if all(type(v) is str for v in fields.values()):  # the common case (Java clients, our own strings)
        return fields if all(type(k) is str for k in fields) else {str(k): v for k, v in fields.items()}
    out: dict[str, str] = {}
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out[str(key)] = "true" if value else "false"
        elif isinstance(value, (dict, list)):
            out[str(key)] = json.dumps(value, separators=(",", ":"))
        else:
            out[str(key)] = str(value)
    return out


# --- header decoding ------------------------------------------------------------------------------------


def decode_header(data: bytes | memoryview, serialize_type: int) -> RemotingCommand:
    if serialize_type == SerializeType.JSON:
        return _decode_json_header(bytes(data))
    if serialize_type == SerializeType.ROCKETMQ:
        return _decode_binary_header(memoryview(data))
    raise RemotingProtocolError(f"unknown serialize type {serialize_type}")


def _int_field(doc: dict[str, Any], name: str, default: int = 0) -> int:
    value = doc.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RemotingProtocolError(f"header field {name} is not a number")
    try:
        number = int(value)
    except (ValueError, OverflowError):
        raise RemotingProtocolError(f"header field {name} is not a number") from None
    if not -(1 << 31) <= number < (1 << 31):
        raise RemotingProtocolError(f"header field {name} out of int32 range")
    return number


def _decode_json_header(raw: bytes) -> RemotingCommand:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RemotingProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RemotingProtocolError("JSON header is not an object")
    ext = doc.get("extFields") or {}
    if not isinstance(ext, dict):
        raise RemotingProtocolError("extFields is not an object")
    remark = doc.get("remark")
    language = doc.get("language", "JAVA")
    return RemotingCommand(
        code=_int_field(doc, "code"),
        opaque=_int_field(doc, "opaque"),
        flag=_int_field(doc, "flag"),
        remark=None if remark is None else str(remark),
        ext_fields=stringify_fields(ext),
        language=str(language) if language is not None else "JAVA",
        version=_int_field(doc, "version"),
        serialize_type=SerializeType.JSON,
    )


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    try:
        language = LanguageCode[cmd.language].value
    except KeyError:
        language = LanguageCode.OTHER.value
    # the code is a short here, cast as RocketMQSerializable casts it: the POP family's codes (200050 and up) do
    # not survive this serialisation, which is why RocketMQ's clients send those requests as JSON
    code = (cmd.code + 0x8000) % 0x10000 - 0x8000
    parts = [_BIN_FIXED.pack(code, language, cmd.version, cmd.opaque, cmd.flag)]
    remark = cmd.remark.encode() if cmd.remark else b""
    parts += [_I32.pack(len(remark)), remark]
    ext = bytearray()
    for key, value in cmd.ext_fields.items():
        k, v = key.encode(), value.encode()
        if len(k) > 0x7FFF:
            raise RemotingProtocolError(f"ext field name too long: {key[:40]!r}")
        ext += struct.pack(">h", len(k)) + k + _I32.pack(len(v)) + v
    parts += [_I32.pack(len(ext)), bytes(ext)]
    return b"".join(parts)


def _decode_binary_header(view: memoryview) -> RemotingCommand:
    end = len(view)

    def need(pos: int, n: int, what: str) -> None:
        if n < 0 or pos + n > end:
            raise RemotingProtocolError(f"binary header truncated reading {what} ({n} bytes at {pos}, {end} total)")

    need(0, _BIN_FIXED.size, "fixed fields")
    code, language, version, opaque, flag = _BIN_FIXED.unpack_from(view, 0)
    pos = _BIN_FIXED.size
    need(pos, 4, "remark length")
    (remark_len,) = _I32.unpack_from(view, pos)
    pos += 4
    need(pos, remark_len, "remark")
    remark = _utf8(view[pos : pos + remark_len], "remark") if remark_len > 0 else None
    pos += remark_len
    need(pos, 4, "ext fields length")
    (ext_len,) = _I32.unpack_from(view, pos)
    pos += 4
    need(pos, ext_len, "ext fields")
    ext_end = pos + ext_len
    ext: dict[str, str] = {}
    while pos < ext_end:
        if pos + 2 > ext_end:
            raise RemotingProtocolError("ext field name length truncated")
        (klen,) = struct.unpack_from(">h", view, pos)
        pos += 2
        if klen < 0 or pos + klen + 4 > ext_end:
            raise RemotingProtocolError("ext field name truncated")
        key = _utf8(view[pos : pos + klen], "ext field name")
        pos += klen
        (vlen,) = _I32.unpack_from(view, pos)
        pos += 4
        if vlen < 0 or pos + vlen > ext_end:
            raise RemotingProtocolError("ext field value truncated")
        ext[key] = _utf8(view[pos : pos + vlen], "ext field value")
        pos += vlen
    if pos != end:
        raise RemotingProtocolError(f"{end - pos} unexpected bytes after the binary header")
    try:
        language_name = LanguageCode(language).name
    except ValueError:
        language_name = "OTHER"
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext,
        language=language_name,
        version=version,
        serialize_type=SerializeType.ROCKETMQ,
    )


def _utf8(data: memoryview, what: str) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise RemotingProtocolError(f"{what} is not UTF-8") from None


# --- framing --------------------------------------------------------------------------------------------


def decode_frame(frame: bytes | memoryview) -> RemotingCommand:
    """One whole frame without its 4-byte total length prefix: `[type|header len][header][body]`."""
    view = memoryview(frame)
    if len(view) < 4:
        raise RemotingProtocolError("frame shorter than its header length field")
    (word,) = struct.unpack_from(">I", view, 0)
    serialize_type, header_len = word >> 24, word & _MAX_HEADER
    if header_len > len(view) - 4:
        raise RemotingProtocolError(f"header length {header_len} exceeds the frame ({len(view) - 4} bytes)")
    cmd = decode_header(view[4 : 4 + header_len], serialize_type)
    body = view[4 + header_len :]
    cmd.body = bytes(body) if len(body) else None
    return cmd


class FrameDecoder:
    """Incremental frame reader: `receive_data(bytes)`, then `next_command()` until it returns None."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0

    def receive_data(self, data: bytes) -> None:
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[: self._pos]  # compact once the consumed prefix dominates: amortised O(n)
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def next_command(self) -> RemotingCommand | None:
        available = len(self._buf) - self._pos
        if available < 4:
            return None
        (total,) = _I32.unpack_from(self._buf, self._pos)
        if total < 4 or total > self.max_frame_bytes:
            raise FrameTooLarge(f"remoting frame of {total} bytes outside [4, {self.max_frame_bytes}]")
        if available >= 8:
            (word,) = struct.unpack_from(">I", self._buf, self._pos + 4)
            serialize_type, header_len = word >> 24, word & _MAX_HEADER
            if serialize_type not in (SerializeType.JSON, SerializeType.ROCKETMQ):
                raise RemotingProtocolError(f"unknown serialize type {serialize_type}")
            if header_len > total - 4:
                raise RemotingProtocolError(f"header length {header_len} exceeds frame length {total}")
        if available < 4 + total:
            return None
        start = self._pos + 4
        self._pos = start + total
        # a copy, so no memoryview export pins the buffer (it must stay resizable, even after an error)
        return decode_frame(bytes(self._buf[start : start + total]))

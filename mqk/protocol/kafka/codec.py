"""Kafka framing and request/response headers, sans-IO (in the manner of h11): bytes in, `Request`s out;
response dicts in, a list of buffers out. Owns the receive buffer and the header-version rules; never touches a
socket and never imports asyncio.

Wire rules:
- Frame: int32 size, then `size` bytes. The size is checked (negative or above `max_request_bytes` ->
  `mqk.errors.FrameTooLarge`) before anything is allocated for the frame.
- Request header v1 (non-flexible API versions): api_key int16, api_version int16, correlation_id int32,
  client_id nullable int16-length string. v2 (flexible versions) adds a tagged-field section. client_id stays a
  non-compact string in v2 (the spec marks it `flexibleVersions: none`).
- Response header v0: correlation_id. v1 (flexible versions) adds a tagged-field section, EXCEPT for ApiVersions,
  whose response header is always v0 so that a client can parse the answer whatever version it asked for.
- ApiVersions at a version the broker does not support: the request is still returned (with `unsupported=True`
  and an empty body) so the server can answer UNSUPPORTED_VERSION plus the full API list; the answer is encoded
  with the v0 body schema. Any other unsupported version -> `UnsupportedApiVersion`; unknown key -> `UnknownApiKey`.

Receive buffer (`get_buffer` / `buffer_updated`, the shape of asyncio.BufferedProtocol): the transport reads
straight into the buffer frames are handed out from, as memoryviews, so Produce record bytes are never copied on
their way to the store. Bytes are only ever written past everything handed out: when the buffer runs out of room,
the unframed tail moves to a fresh one and the old one lives on as long as views of it do (a buffer whose bytes
are all handed out is let go at once, so an idle connection holds no buffer). A frame whose size prefix has
arrived gets a buffer with room for all of it (up to `AHEAD_MAX`; a bigger frame's buffer doubles as its bytes
arrive, so a size prefix alone never makes the broker set aside `max_request_bytes`); small frames share
`READ_CHUNK`-sized buffers. Once a peer's frame did not fit one, its fresh buffers get `AHEAD_MAX` of room, so
that its next frames land whole and only a frame straddling a buffer's end is copied. `receive_data(bytes)`
copies into the same buffer, for callers holding bytes.
"""

from __future__ import annotations

import collections
import enum
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from mqk._fast import handwritten, load
from mqk.errors import FrameTooLarge
from mqk.protocol.kafka import api, messages, newer
from mqk.protocol.kafka.errors import MalformedMessage, UnknownApiKey, UnsupportedApiVersion

if TYPE_CHECKING:
    from typing_extensions import Buffer

#: an encoded message as buffers for `transport.writelines`
Parts: TypeAlias = list[bytes | bytearray | memoryview]

_SIZE = struct.Struct(">i")
_REQ_HEAD = struct.Struct(">hhi")
_STR_LEN = struct.Struct(">h")
_RESP_HEAD = struct.Struct(">ii")  # size, correlation_id
DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024
#: the size of a receive buffer shared by small frames
READ_CHUNK = 256 * 1024
#: below this much room a buffer is done with: the next read gets a fresh one
MIN_ROOM = 4096
#: a frame's buffer is sized for at most this much beyond the bytes that have arrived
AHEAD_MAX = 8 * 1024 * 1024

_new_buffer = load("recbatch").new_buffer
_produce_kernel = load("producereq").decode_produce_request
_fetch_kernel = load("fetchreq").decode_fetch_request
_produce_answer_kernel = load("produceresp").encode_produce_response
_fetch_answer_kernel = load("fetchresp").encode_fetch_response
_PRODUCE = int(api.ApiKey.PRODUCE)
_FETCH = int(api.ApiKey.FETCH)


class Declined(enum.IntEnum):
    """Why a hand-written kernel left a Produce or Fetch body to the generated codec: the codes the kernels return
    (mqk._fast.handwritten's DECLINE_*)."""

    VERSION = handwritten.DECLINE_VERSION
    SHAPE = handwritten.DECLINE_SHAPE
    VALUE = handwritten.DECLINE_VALUE
    TEXT = handwritten.DECLINE_TEXT
    FIELD = handwritten.DECLINE_FIELD


#: (api key, Declined code) -> the bodies this process's kernels left to the generated codec (/metrics reports
#: them: a kernel that starts declining what brokers answer or clients send shows there, not only as a slower path)
DECLINED: collections.Counter[tuple[int, int]] = collections.Counter()


def _decode_by_kernel(
    kernel: Callable[[memoryview, int], dict[str, Any] | int], api_key: int, api_version: int, body: memoryview
) -> dict[str, Any] | int:
    """Produce and Fetch bodies are decoded by hand-written `_fast` kernels (hot paths may be written by hand,
    docs/architecture.md): the same dict as the generated decoder, at a fraction of its cost per partition, which
    counts when a request names many partitions (a producer spreading its records, a consumer assigned a large
    topic). An int: the kernel left the body to the generated decoder, and why (a `Declined` code). Its ValueError
    becomes MalformedMessage, as the generated decoder's errors do."""
    try:
        return kernel(body, api_version)
    except ValueError as exc:  # UnicodeDecodeError included
        raise MalformedMessage(f"api {api_key} v{api_version}: {exc.__class__.__name__}: {exc}") from None


class Request(NamedTuple):
    """One decoded request. A NamedTuple rather than a frozen dataclass: one is built per request, and a frozen
    dataclass's __init__ sets each field through object.__setattr__ (several times the cost of a tuple)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: dict[str, Any]
    unsupported: bool = False  # only ever True for ApiVersions; answer with api.api_versions_unsupported_body()
    size: int = 0  # frame size in bytes (for metrics / quotas)

    def __repr__(self) -> str:  # the body can be megabytes of records: leave it out
        return (
            f"Request(api_key={self.api_key}, api_version={self.api_version}, "
            f"correlation_id={self.correlation_id}, client_id={self.client_id!r}, size={self.size})"
        )


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise MalformedMessage("varint too long")


def _skip_tagged(buf: memoryview, pos: int) -> int:
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise MalformedMessage("tagged field beyond the header")
    return pos


def parse_request_header(frame: memoryview) -> tuple[int, int, int, str | None, int]:
    """-> (api_key, api_version, correlation_id, client_id, body_pos) using header v1 or v2 as the API requires.
    An unknown api key raises UnknownApiKey (carrying the correlation id)."""
    if len(frame) < 10:
        raise MalformedMessage(f"request frame of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _REQ_HEAD.unpack_from(frame, 0)
    meta = messages.MESSAGES.get(api_key)
    if meta is None:
        meta = newer.NEWER.get(api_key)  # (a second lookup only for the few APIs newer than the spec set)
        if meta is None:
            raise UnknownApiKey(api_key, correlation_id)
    (n,) = _STR_LEN.unpack_from(frame, 8)
    pos = 10
    if n < 0:
        client_id = None
    else:
        if pos + n > len(frame):
            raise MalformedMessage("client_id runs past the frame")
        try:
            client_id = str(frame[pos : pos + n], "utf-8")
        except UnicodeDecodeError as e:
            raise MalformedMessage(f"client_id is not UTF-8: {e}") from None
        pos += n
    flex = meta[3]
    if flex >= 0 and api_version >= flex:
        if pos < len(frame) and frame[pos] == 0:  # the usual case, no tagged fields: skip the varint walk
            return api_key, api_version, correlation_id, client_id, pos + 1
        try:
            pos = _skip_tagged(frame, pos)
        except IndexError:
            raise MalformedMessage("truncated request header tagged fields") from None
    return api_key, api_version, correlation_id, client_id, pos


def response_header_flexible(api_key: int, api_version: int) -> bool:
    return api_key != api.ApiKey.API_VERSIONS and api.is_flexible_request(api_key, api_version)


class KafkaConnectionCodec:
    """One per connection (server side). Feed bytes with `get_buffer` / `buffer_updated` (or `receive_data`);
    drain with `next_request` until None."""

    def __init__(
        self, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, supported: dict[int, tuple[int, int]] | None = None
    ) -> None:
        self.max_request_bytes = max_request_bytes
        self.supported = api.SUPPORTED if supported is None else supported
        self._buf = bytearray()
        self._start = 0  # bytes [_start, _end) of _buf are received and not yet handed out
        self._end = 0
        self._frame_size = -1  # size of the frame at _start once its prefix is read and checked, -1 before
        #: the last frame handed out did not fit a shared read buffer: the peer sends large frames (a producer's
        #: 1 MB batches), and a fresh buffer is made room for several of them (see get_buffer)
        self._large_frames = False

    # -- input ------------------------------------------------------------------------------------------
    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Writable room for the next received bytes; say how many were written with `buffer_updated`."""
        held = self._end - self._start
        room = len(self._buf) - self._end
        try:
            total = self._frame_total()
        except FrameTooLarge:
            total = -1  # next_frame refuses it; until then the bytes go where small frames go
        if total > held:  # a frame is partly here: give it room for the rest
            lacking = total - held
            if lacking <= room:
                return memoryview(self._buf)[self._end :]
            room = max(min(lacking, max(AHEAD_MAX, held)), READ_CHUNK)
            if self._large_frames:
                room = max(room, AHEAD_MAX)  # the frames after it too
        elif room >= MIN_ROOM:
            return memoryview(self._buf)[self._end :]
        else:
            # a peer sending large frames gets AHEAD_MAX: its frames land whole, and only the one left straddling
            # a buffer's end is copied to the next (with READ_CHUNK buffers the head of every frame would be)
            room = AHEAD_MAX if self._large_frames else READ_CHUNK
        buf = _new_buffer(held + room)
        buf[:held] = memoryview(self._buf)[self._start : self._end]
        self._buf, self._start, self._end = buf, 0, held
        return memoryview(buf)[held:]

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` were written at the start of the room the last `get_buffer` returned."""
        self._end += nbytes

    def receive_data(self, received: Buffer) -> None:
        """Take received bytes from a caller that has them as an object (one copy into the buffer)."""
        data = memoryview(received).cast("B")
        done = 0
        while done < len(data):
            room = self.get_buffer()
            step = min(len(room), len(data) - done)
            room[:step] = data[done : done + step]
            self.buffer_updated(step)
            done += step

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a request (for back-pressure decisions)."""
        return self._end - self._start

    def _frame_total(self) -> int:
        """Prefix plus payload size of the frame at _start, or -1 while its prefix has not arrived. The size is
        checked here, before any buffer is sized for it."""
        size = self._frame_size
        if size < 0:
            if self._end - self._start < 4:
                return -1
            (size,) = _SIZE.unpack_from(self._buf, self._start)
            if size < 0 or size > self.max_request_bytes:
                raise FrameTooLarge(f"request frame size {size} outside [0, {self.max_request_bytes}]")
            self._frame_size = size
        return size + 4

    def next_frame(self) -> memoryview | None:
        """The next complete frame payload (without its size prefix), or None if more data is needed."""
        total = self._frame_total()
        if total < 0 or self._end - self._start < total:
            return None
        buf = self._buf
        begin = self._start + 4
        self._start += total
        self._frame_size = -1
        self._large_frames = total > READ_CHUNK
        if self._start == self._end:
            # everything received is handed out: let go of the buffer (the frames' views keep it alive as long
            # as they need it), so an idle connection holds none; the next read gets a fresh one
            self._buf = bytearray()
            self._start = self._end = 0
        return memoryview(buf)[begin : begin + total - 4]

    def next_request(self) -> Request | None:
        frame = self.next_frame()
        if frame is None:
            return None
        api_key, api_version, correlation_id, client_id, pos = parse_request_header(frame)
        rng = self.supported.get(api_key)
        if rng is None:
            raise UnknownApiKey(api_key, correlation_id)
        if not rng[0] <= api_version <= rng[1]:
            if api_key == api.ApiKey.API_VERSIONS:
                return Request(api_key, api_version, correlation_id, client_id, {}, True, len(frame))
            raise UnsupportedApiVersion(api_key, api_version, correlation_id)
        try:
            decoded: dict[str, Any] | int | None = None
            if api_key == _PRODUCE:
                decoded = _decode_by_kernel(_produce_kernel, api_key, api_version, frame[pos:])
            elif api_key == _FETCH:
                decoded = _decode_by_kernel(_fetch_kernel, api_key, api_version, frame[pos:])
            if type(decoded) is dict:
                body = decoded
            else:
                if isinstance(decoded, int):  # the kernel's reason
                    DECLINED[(api_key, decoded)] += 1
                if api_key in newer.NEWER:
                    body = newer.decode_request(api_key, api_version, frame[pos:])
                else:
                    body = messages.decode_request(api_key, api_version, frame[pos:])
        except MalformedMessage as exc:
            # say which request it was, for the server's one log line
            exc.api_key, exc.api_version, exc.correlation_id = api_key, api_version, correlation_id
            exc.args = (f"{api.NAMES.get(api_key, api_key)} v{api_version} (correlation id {correlation_id}): {exc}",)
            raise
        return Request(api_key, api_version, correlation_id, client_id, body, False, len(frame))

    # -- output -----------------------------------------------------------------------------------------
    def encode_response(self, request: Request, body: dict[str, Any]) -> Parts:
        return encode_response(request, body)


def encode_response(request: Request, body: dict[str, Any]) -> Parts:
    """Size prefix + response header + body as a list of bytes-likes for `transport.writelines`."""
    api_key = request.api_key
    version = 0 if request.unsupported else request.api_version
    flexible = response_header_flexible(api_key, version)
    head = bytearray(9 if flexible else 8)
    if flexible:
        head[8] = 0  # empty tagged-field section
    # the usual Produce and Fetch answers are written by _fast kernels (the generated encoder's bytes); anything
    # else, or what a kernel declines, by the generated encoder
    encoded: Parts | int | None = None
    if api_key == _PRODUCE:
        encoded = _produce_answer_kernel(body, version, head) or [head]
    elif api_key == _FETCH:
        encoded = _fetch_answer_kernel(body, version, head)
    if type(encoded) is list:
        parts = encoded
    else:
        if isinstance(encoded, int):  # the kernel's reason
            DECLINED[(api_key, encoded)] += 1
        if api_key in newer.NEWER:
            parts = newer.encode_response(api_key, version, body, head)
        else:
            parts = messages.encode_response(api_key, version, body, head)
    total = 0
    for p in parts:
        total += len(p)
    _RESP_HEAD.pack_into(head, 0, total - 4, request.correlation_id)
    return parts


# --- client side (tests, tools, fuzzing) ---------------------------------------------------------------


def encode_request(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: dict[str, Any]
) -> Parts:
    """A complete request frame (size prefix included) as a list of bytes-likes."""
    head = bytearray(4)  # size, patched below
    head += _REQ_HEAD.pack(api_key, api_version, correlation_id)
    if client_id is None:
        head += b"\xff\xff"
    else:
        cid = client_id.encode()
        head += _STR_LEN.pack(len(cid)) + cid
    if api.is_flexible_request(api_key, api_version):
        head.append(0)
    if api_key in newer.NEWER:
        parts = newer.encode_request(api_key, api_version, body, head)
    else:
        parts = messages.encode_request(api_key, api_version, body, head)
    total = sum(len(p) for p in parts)
    _SIZE.pack_into(head, 0, total - 4)
    return parts


def decode_response_frame(api_key: int, api_version: int, frame: bytes | memoryview) -> tuple[int, dict[str, Any]]:
    """A response frame WITHOUT its size prefix -> (correlation_id, body). ApiVersions error answers are read with
    the v0 schema, as a client must."""
    view = memoryview(frame)
    if len(view) < 4:
        raise MalformedMessage("response shorter than its header")
    (correlation_id,) = _SIZE.unpack_from(view, 0)
    pos = 4
    if api_key == api.ApiKey.API_VERSIONS:
        if len(view) >= 6 and _STR_LEN.unpack_from(view, 4)[0] == api.UNSUPPORTED_VERSION:
            api_version = 0
    elif response_header_flexible(api_key, api_version):
        try:
            pos = _skip_tagged(view, pos)
        except IndexError:
            raise MalformedMessage("truncated response header") from None
    if api_key in newer.NEWER:
        return correlation_id, newer.decode_response(api_key, api_version, view[pos:])
    return correlation_id, messages.decode_response(api_key, api_version, view[pos:])

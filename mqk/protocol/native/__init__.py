"""RocketMQ remoting protocol, sans-IO: frames and commands (`command`), constants (`codes`), message wire
formats (`message`) and the bridge to the store's record batches (`records`). Never imports asyncio."""

from __future__ import annotations

from mqk.protocol.native.codes import LanguageCode, RequestCode, ResponseCode, SerializeType
from mqk.protocol.native.command import (
    FrameDecoder,
    HeaderFieldError,
    RemotingCommand,
    RemotingProtocolError,
    decode_frame,
)
from mqk.protocol.native.message import MessageExt, MessageFormatError

__all__ = [
    "FrameDecoder",
    "HeaderFieldError",
    "LanguageCode",
    "MessageExt",
    "MessageFormatError",
    "RemotingCommand",
    "RemotingProtocolError",
    "RequestCode",
    "ResponseCode",
    "SerializeType",
    "decode_frame",
]

"""ApiVersions: the versions this broker serves (the codec's ranges, limited to APIs that have a handler).

A version above our range is answered with the v0 schema, UNSUPPORTED_VERSION and the full list, so the client
can retry with a version we speak (the codec marks such requests `unsupported` and encodes with v0)."""

from __future__ import annotations

from typing import cast

from mqk.protocol.kafka import api
from mqk.protocol.kafka.messages.api_versions import ApiVersionsRequest, ApiVersionsResponse
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer


async def handle(ctx: KafkaContext, peer: Peer, req: KafkaRequest[ApiVersionsRequest]) -> ApiVersionsResponse:
    # the body is built by mqk.protocol.kafka.api (the codec answers with it too), which types it as a plain dict
    if req.unsupported:
        return cast(ApiVersionsResponse, api.api_versions_unsupported_body(ctx.supported))
    return cast(ApiVersionsResponse, api.api_versions_body(0, ctx.supported))

"""ApiVersions: the versions this broker serves (the codec's ranges, limited to APIs that have a handler).

A version above our range is answered with the v0 schema, UNSUPPORTED_VERSION and the full list, so the client
can retry with a version we speak (the codec marks such requests `unsupported` and encodes with v0)."""
from __future__ import annotations

from mqk.protocol.kafka import api


async def handle(server, conn, req) -> dict:
    if req.unsupported:
        return api.api_versions_unsupported_body(server.supported)
    return api.api_versions_body(0, server.supported)

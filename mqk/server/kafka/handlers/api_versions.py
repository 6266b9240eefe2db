"""ApiVersions: the versions this broker serves (the codec's ranges, limited to APIs that have a handler), and from
v3 the features it finalizes (transaction version 2 where transactions are offered).

A version above our range is answered with the v0 schema, UNSUPPORTED_VERSION and the full list, so the client
can retry with a version we speak (the codec marks such requests `unsupported` and encodes with v0)."""

from __future__ import annotations

from typing import cast

from mqk.protocol.kafka import api
from mqk.protocol.kafka.messages.api_versions import ApiVersionsRequest, ApiVersionsResponse
from mqk.server.kafka.context import KafkaContext, KafkaRequest, Peer

#: the feature KIP-890 part 2 clients look for (KIP-584 finalized features): transaction version 2 on
TRANSACTION_VERSION = "transaction.version"


async def handle(ctx: KafkaContext, peer: Peer, req: KafkaRequest[ApiVersionsRequest]) -> ApiVersionsResponse:
    # the body is built by mqk.protocol.kafka.api (the codec answers with it too), which types it as a plain dict
    if req.unsupported:
        return cast(ApiVersionsResponse, api.api_versions_unsupported_body(ctx.supported))
    body = cast(ApiVersionsResponse, api.api_versions_body(0, ctx.supported))
    if req.api_version >= 3 and ctx.transactions is not None and ctx.cluster is None:
        # transaction version 2 is what this broker's coordinator speaks (mqk.server.kafka.transactions); it
        # finalizes it as a Kafka 4 cluster does by default. No other feature is finalized: clients then use
        # each API at the versions listed, as on a broker without them. A cluster finalizes none: there a
        # transaction's partitions must be added by the producer (version 1), not by the partitions' leaders
        body["supported_features"] = [{"name": TRANSACTION_VERSION, "min_version": 0, "max_version": 2}]
        body["finalized_features_epoch"] = 1
        body["finalized_features"] = [{"name": TRANSACTION_VERSION, "max_version_level": 2, "min_version_level": 2}]
    return body

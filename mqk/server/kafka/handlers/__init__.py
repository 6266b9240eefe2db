"""One handler per Kafka API (or small family): `async def handler(ctx, peer, req) -> body | None`.

`ctx` is the KafkaContext (mqk.server.kafka.context: the broker's services, this broker's identity and address),
`peer` the requesting connection as a handler may see it, `req` a `KafkaRequest[<Api>Request]` whose body is the
API's generated request TypedDict (mqk.protocol.kafka.messages). A handler returns the response body as the
API's response TypedDict (snake_case fields), None when no response is due (Produce with acks=0), or
CloseConnection.
Per-topic and per-partition problems are answered with error codes; a handler raising means a bug, and costs
only the connection it ran on.

`GROUPED` names the APIs whose requests arriving together on a connection are answered by one call:
`prepare(ctx, peer, request)` -> a plan, or None to take that request through its handler alone, and
`async answer(ctx, plans)` -> one response body (or None) per plan, in order.
"""

from __future__ import annotations

from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.context import Grouping, Handler
from mqk.server.kafka.handlers import (
    acls,
    api_versions,
    cluster,
    configs,
    consumer_groups,
    fetch,
    groups,
    leader_epochs,
    list_offsets,
    log_dirs,
    metadata,
    offsets,
    produce,
    quotas,
    replicas,
    sasl,
    share_groups,
    topics,
    transactions,
    users,
)

HANDLERS: dict[int, Handler] = {
    ApiKey.PRODUCE: produce.handle,
    ApiKey.FETCH: fetch.handle,
    ApiKey.LIST_OFFSETS: list_offsets.handle,
    ApiKey.METADATA: metadata.handle,
    ApiKey.OFFSET_COMMIT: offsets.offset_commit,
    ApiKey.OFFSET_FETCH: offsets.offset_fetch,
    ApiKey.FIND_COORDINATOR: groups.find_coordinator,
    ApiKey.JOIN_GROUP: groups.join_group,
    ApiKey.HEARTBEAT: groups.heartbeat,
    ApiKey.LEAVE_GROUP: groups.leave_group,
    ApiKey.SYNC_GROUP: groups.sync_group,
    ApiKey.DESCRIBE_GROUPS: groups.describe_groups,
    ApiKey.LIST_GROUPS: groups.list_groups,
    ApiKey.SASL_HANDSHAKE: sasl.sasl_handshake,
    ApiKey.SASL_AUTHENTICATE: sasl.sasl_authenticate,
    ApiKey.API_VERSIONS: api_versions.handle,
    ApiKey.CREATE_TOPICS: topics.create_topics,
    ApiKey.DELETE_TOPICS: topics.delete_topics,
    ApiKey.DELETE_RECORDS: topics.delete_records,
    ApiKey.INIT_PRODUCER_ID: cluster.init_producer_id,
    ApiKey.DESCRIBE_CONFIGS: configs.describe_configs,
    ApiKey.ALTER_CONFIGS: configs.alter_configs,
    ApiKey.ALTER_REPLICA_LOG_DIRS: log_dirs.alter_replica_log_dirs,
    ApiKey.DESCRIBE_LOG_DIRS: log_dirs.describe_log_dirs,
    ApiKey.CREATE_PARTITIONS: topics.create_partitions,
    ApiKey.DELETE_GROUPS: groups.delete_groups,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: configs.incremental_alter_configs,
    ApiKey.OFFSET_DELETE: groups.offset_delete,
    ApiKey.DESCRIBE_CLUSTER: cluster.describe_cluster,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: leader_epochs.handle,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: users.describe_user_scram_credentials,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: users.alter_user_scram_credentials,
    ApiKey.ELECT_LEADERS: replicas.elect_leaders,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: replicas.alter_partition_reassignments,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: replicas.list_partition_reassignments,
    ApiKey.DESCRIBE_PRODUCERS: replicas.describe_producers,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: quotas.describe_client_quotas,
    ApiKey.ALTER_CLIENT_QUOTAS: quotas.alter_client_quotas,
    ApiKey.DESCRIBE_ACLS: acls.describe_acls,
    ApiKey.CREATE_ACLS: acls.create_acls,
    ApiKey.DELETE_ACLS: acls.delete_acls,
    ApiKey.ADD_PARTITIONS_TO_TXN: transactions.add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: transactions.add_offsets_to_txn,
    ApiKey.END_TXN: transactions.end_txn,
    ApiKey.TXN_OFFSET_COMMIT: transactions.txn_offset_commit,
    ApiKey.DESCRIBE_TRANSACTIONS: transactions.describe_transactions,
    ApiKey.LIST_TRANSACTIONS: transactions.list_transactions,
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: metadata.describe_topic_partitions,
    ApiKey.LIST_CONFIG_RESOURCES: configs.list_config_resources,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: consumer_groups.consumer_group_heartbeat,
    ApiKey.CONSUMER_GROUP_DESCRIBE: consumer_groups.consumer_group_describe,
    ApiKey.SHARE_GROUP_HEARTBEAT: share_groups.share_group_heartbeat,
    ApiKey.SHARE_GROUP_DESCRIBE: share_groups.share_group_describe,
    ApiKey.SHARE_FETCH: share_groups.share_fetch,
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: share_groups.describe_share_group_offsets,
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: share_groups.alter_share_group_offsets,
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: share_groups.delete_share_group_offsets,
    ApiKey.SHARE_ACKNOWLEDGE: share_groups.share_acknowledge,
}

GROUPED: dict[int, Grouping] = {
    ApiKey.PRODUCE: (produce.prepare_request, produce.answer_prepared),
}

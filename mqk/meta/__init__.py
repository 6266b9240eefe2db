"""The meta service: where cluster state lives (etcd), reached through a small typed face.

mqk writes no consensus of its own: every piece of cluster metadata is a key in etcd, written by compare-and-set
transactions, and kept alive by leases (see mqk.broker.cluster for the layout and who writes what). This package only
speaks to etcd: keys, values, revisions, leases, transactions and watches. It knows nothing of brokers or topics.

The etcd client (`aetcd`, asyncio over gRPC) is an optional dependency (`pip install 'mqk[cluster]'`), imported only
when a broker runs with `--cluster`.
"""

from mqk.meta.etcd import (
    Compare,
    Delete,
    EtcdClient,
    LeaseExpired,
    MetaUnavailable,
    Put,
    Record,
    WatchEvent,
    parse_endpoints,
)

__all__ = [
    "Compare",
    "Delete",
    "EtcdClient",
    "LeaseExpired",
    "MetaUnavailable",
    "Put",
    "Record",
    "WatchEvent",
    "parse_endpoints",
]

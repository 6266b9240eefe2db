"""One typed error hierarchy for mqk.

Kafka errors carry their wire `code` and `retriable` flag (the table below is Kafka's own numbering);
`KafkaError.for_code(n)` returns the class for a code. Storage errors are protocol-neutral; the single
place that maps them to Kafka codes is `kafka_code_for()` at the bottom of this module, and the native
(RocketMQ) protocol maps them in `mqk.protocol.native` the same way.
"""

from __future__ import annotations

from typing import Any, ClassVar


class MqkError(Exception):
    """Base of every error mqk raises on purpose."""


# --- storage -------------------------------------------------------------------------------------------


class ClusterStartError(MqkError):
    """The broker cannot join its cluster (etcd unreachable at start, its node id taken by a live broker)."""


class StorageError(MqkError):
    """The store could not do what was asked; the data it already holds is intact."""


class OutOfBounds(StorageError):
    """A read or write would cross the end (or start) of a mapped region."""


class Corrupt(StorageError):
    """Stored bytes fail their checks (CRC, magic, size)."""

    def __init__(self, message: str, position: int = -1) -> None:
        super().__init__(message if position < 0 else f"{message} at position {position}")
        self.position = position


class StorageFull(StorageError):
    """The disk (or the configured share of it) is full; writes are refused, reads go on."""


class NotSupported(StorageError):
    """The engine does not (yet) offer this operation."""


class UnknownShard(StorageError):
    """No such topic or queue."""


class ShardExists(StorageError):
    """The topic already exists."""


class InvalidShardCount(StorageError):
    """A topic cannot have that many queues (every engine takes 1 to MAX_SHARD_COUNT)."""


class InvalidShardName(StorageError):
    """An engine cannot store a topic under that name (empty, too long, or not usable as a file name)."""


class OffsetOutOfRange(StorageError):
    """The offset is below the log start offset or above the end offset."""

    def __init__(self, offset: int, start: int, end: int) -> None:
        super().__init__(f"offset {offset} outside [{start}, {end}]")
        self.offset, self.start, self.end = offset, start, end


class InvalidRecord(StorageError):
    """A record or batch is well formed but not acceptable (e.g. no key on a compacted topic)."""


class InvalidTimestamp(InvalidRecord):
    """A record's create time lies outside the topic's window (message.timestamp.before.max.ms and
    message.timestamp.after.max.ms around the broker's clock)."""


class MessageTooLarge(StorageError):
    """A batch is larger than the topic (or broker) allows."""


class PutRejected(StorageError):
    """A put-message hook refused the append; `reason` is shown to the client."""


# --- cluster metadata ----------------------------------------------------------------------------------


class NotMaster(StorageError):
    """The store takes no local appends: this broker is a replica of its group (its master's bytes only)."""


class PartitionFenced(NotMaster):
    """The store takes no appends for that queue here: its partition is placed in another broker group, or is
    sealed while it moves to one (StoreManager.fence)."""


class MetaUnavailable(MqkError):
    """The cluster's meta service (etcd) cannot be reached or did not answer in time. Retriable: the metadata is
    unchanged, or unknown for a change whose answer was lost."""


class MetaOutcomeUnknown(MetaUnavailable):
    """A transaction reached etcd (or may have) but its answer was lost: it may have been applied. The caller
    re-reads what it wrote before deciding; sending it again would answer for the second try, not the first."""


# --- protocol-level ------------------------------------------------------------------------------------


class ProtocolError(MqkError):
    """Bytes from the peer break the protocol: the connection is closed and the reason logged."""


class FrameTooLarge(ProtocolError):
    """A frame's declared size is negative or over the limit; refused before any allocation."""


# --- Kafka error codes ---------------------------------------------------------------------------------


class KafkaError(MqkError):
    code: int = -1
    retriable: bool = False
    _by_code: ClassVar[dict[int, type[KafkaError]]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.code in KafkaError._by_code:
            raise TypeError(f"duplicate Kafka error code {cls.code}: {cls.__name__}")
        KafkaError._by_code[cls.code] = cls

    @classmethod
    def for_code(cls, code: int) -> type[KafkaError]:
        return KafkaError._by_code.get(code, UnknownServerError)


def _kafka(name: str, code: int, retriable: bool = False) -> type[KafkaError]:
    return type(name, (KafkaError,), {"code": code, "retriable": retriable})


UnknownServerError = _kafka("UnknownServerError", -1)
OffsetOutOfRangeError = _kafka("OffsetOutOfRangeError", 1)
CorruptMessageError = _kafka("CorruptMessageError", 2, True)
UnknownTopicOrPartitionError = _kafka("UnknownTopicOrPartitionError", 3, True)
InvalidFetchSizeError = _kafka("InvalidFetchSizeError", 4)
LeaderNotAvailableError = _kafka("LeaderNotAvailableError", 5, True)
NotLeaderOrFollowerError = _kafka("NotLeaderOrFollowerError", 6, True)
RequestTimedOutError = _kafka("RequestTimedOutError", 7, True)
BrokerNotAvailableError = _kafka("BrokerNotAvailableError", 8, True)
ReplicaNotAvailableError = _kafka("ReplicaNotAvailableError", 9, True)
MessageTooLargeError = _kafka("MessageTooLargeError", 10)
CoordinatorLoadInProgressError = _kafka("CoordinatorLoadInProgressError", 14, True)
CoordinatorNotAvailableError = _kafka("CoordinatorNotAvailableError", 15, True)
NotCoordinatorError = _kafka("NotCoordinatorError", 16, True)
InvalidTopicError = _kafka("InvalidTopicError", 17)
RecordListTooLargeError = _kafka("RecordListTooLargeError", 18)
NotEnoughReplicasError = _kafka("NotEnoughReplicasError", 19, True)
NotEnoughReplicasAfterAppendError = _kafka("NotEnoughReplicasAfterAppendError", 20, True)
InvalidRequiredAcksError = _kafka("InvalidRequiredAcksError", 21)
IllegalGenerationError = _kafka("IllegalGenerationError", 22)
InconsistentGroupProtocolError = _kafka("InconsistentGroupProtocolError", 23)
InvalidGroupIdError = _kafka("InvalidGroupIdError", 24)
UnknownMemberIdError = _kafka("UnknownMemberIdError", 25)
InvalidSessionTimeoutError = _kafka("InvalidSessionTimeoutError", 26)
RebalanceInProgressError = _kafka("RebalanceInProgressError", 27)
InvalidCommitOffsetSizeError = _kafka("InvalidCommitOffsetSizeError", 28)
TopicAuthorizationFailedError = _kafka("TopicAuthorizationFailedError", 29)
GroupAuthorizationFailedError = _kafka("GroupAuthorizationFailedError", 30)
ClusterAuthorizationFailedError = _kafka("ClusterAuthorizationFailedError", 31)
InvalidTimestampError = _kafka("InvalidTimestampError", 32)
UnsupportedSaslMechanismError = _kafka("UnsupportedSaslMechanismError", 33)
IllegalSaslStateError = _kafka("IllegalSaslStateError", 34)
UnsupportedVersionError = _kafka("UnsupportedVersionError", 35)
TopicAlreadyExistsError = _kafka("TopicAlreadyExistsError", 36)
InvalidPartitionsError = _kafka("InvalidPartitionsError", 37)
InvalidReplicationFactorError = _kafka("InvalidReplicationFactorError", 38)
InvalidReplicaAssignmentError = _kafka("InvalidReplicaAssignmentError", 39)
InvalidConfigError = _kafka("InvalidConfigError", 40)
NotControllerError = _kafka("NotControllerError", 41, True)
InvalidRequestError = _kafka("InvalidRequestError", 42)
UnsupportedForMessageFormatError = _kafka("UnsupportedForMessageFormatError", 43)
PolicyViolationError = _kafka("PolicyViolationError", 44)
OutOfOrderSequenceNumberError = _kafka("OutOfOrderSequenceNumberError", 45)
DuplicateSequenceNumberError = _kafka("DuplicateSequenceNumberError", 46)
InvalidProducerEpochError = _kafka("InvalidProducerEpochError", 47)
InvalidTxnStateError = _kafka("InvalidTxnStateError", 48)
InvalidProducerIdMappingError = _kafka("InvalidProducerIdMappingError", 49)
InvalidTransactionTimeoutError = _kafka("InvalidTransactionTimeoutError", 50)
ConcurrentTransactionsError = _kafka("ConcurrentTransactionsError", 51, True)
TransactionalIdAuthorizationFailedError = _kafka("TransactionalIdAuthorizationFailedError", 53)
SecurityDisabledError = _kafka("SecurityDisabledError", 54)
OperationNotAttemptedError = _kafka("OperationNotAttemptedError", 55)
KafkaStorageError = _kafka("KafkaStorageError", 56, True)
LogDirNotFoundError = _kafka("LogDirNotFoundError", 57)
SaslAuthenticationFailedError = _kafka("SaslAuthenticationFailedError", 58)
UnknownProducerIdError = _kafka("UnknownProducerIdError", 59)
ReassignmentInProgressError = _kafka("ReassignmentInProgressError", 60)
NonEmptyGroupError = _kafka("NonEmptyGroupError", 68)
GroupIdNotFoundError = _kafka("GroupIdNotFoundError", 69)
FetchSessionIdNotFoundError = _kafka("FetchSessionIdNotFoundError", 70, True)
InvalidFetchSessionEpochError = _kafka("InvalidFetchSessionEpochError", 71, True)
FencedLeaderEpochError = _kafka("FencedLeaderEpochError", 74, True)
UnknownLeaderEpochError = _kafka("UnknownLeaderEpochError", 75, True)
UnsupportedCompressionTypeError = _kafka("UnsupportedCompressionTypeError", 76)
MemberIdRequiredError = _kafka("MemberIdRequiredError", 79)
PreferredLeaderNotAvailableError = _kafka("PreferredLeaderNotAvailableError", 80, True)
GroupMaxSizeReachedError = _kafka("GroupMaxSizeReachedError", 81)
FencedInstanceIdError = _kafka("FencedInstanceIdError", 82)
EligibleLeadersNotAvailableError = _kafka("EligibleLeadersNotAvailableError", 83, True)
ElectionNotNeededError = _kafka("ElectionNotNeededError", 84)
NoReassignmentInProgressError = _kafka("NoReassignmentInProgressError", 85)
GroupSubscribedToTopicError = _kafka("GroupSubscribedToTopicError", 86)
InvalidRecordError = _kafka("InvalidRecordError", 87)
UnstableOffsetCommitError = _kafka("UnstableOffsetCommitError", 88, True)
ProducerFencedError = _kafka("ProducerFencedError", 90)
ResourceNotFoundError = _kafka("ResourceNotFoundError", 91)
DuplicateResourceError = _kafka("DuplicateResourceError", 92)
UnacceptableCredentialError = _kafka("UnacceptableCredentialError", 93)
UnknownTopicIdError = _kafka("UnknownTopicIdError", 100, True)
TransactionalIdNotFoundError = _kafka("TransactionalIdNotFoundError", 105)
TransactionAbortableError = _kafka("TransactionAbortableError", 120)


def kafka_code_for(exc: BaseException) -> int:
    """The one place storage (and other) errors become Kafka error codes."""
    if isinstance(exc, KafkaError):
        return exc.code
    if isinstance(exc, OffsetOutOfRange):
        return OffsetOutOfRangeError.code
    if isinstance(exc, UnknownShard):
        return UnknownTopicOrPartitionError.code
    if isinstance(exc, ShardExists):
        return TopicAlreadyExistsError.code
    if isinstance(exc, InvalidShardCount):
        return InvalidPartitionsError.code
    if isinstance(exc, InvalidShardName):
        return InvalidTopicError.code
    if isinstance(exc, Corrupt):
        return CorruptMessageError.code
    if isinstance(exc, MessageTooLarge):
        return MessageTooLargeError.code
    if isinstance(exc, InvalidTimestamp):
        return InvalidTimestampError.code
    if isinstance(exc, InvalidRecord):
        return InvalidRecordError.code
    if isinstance(exc, MetaUnavailable):
        return RequestTimedOutError.code
    if isinstance(exc, NotMaster):
        return NotLeaderOrFollowerError.code
    if isinstance(exc, (StorageError, OSError)):
        return KafkaStorageError.code
    return UnknownServerError.code

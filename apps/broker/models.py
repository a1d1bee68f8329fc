"""txhub's Postgres data model.

Three logs, as in RocketMQ: half messages (RMQ_SYS_TRANS_HALF_TOPIC), op records
(RMQ_SYS_TRANS_OP_HALF_TOPIC) and the commit log. Consumer state is per group: a cursor per queue
and a delivery row per received message. See docs/decisions/0002 for offsets and locking."""

import uuid

from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import Q
from django.utils import timezone


def new_msg_id() -> str:
    # RocketMQ message ids are 32 upper-case hex characters.
    return uuid.uuid4().hex.upper()


class Topic(models.Model):
    name = models.CharField(max_length=127, unique=True)
    queues = models.PositiveSmallIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class MessageQueue(models.Model):
    """One row per (topic, queue): the counter that hands out dense queue offsets.

    Appending to a queue takes this row's lock until the appending transaction commits, so offset
    N+1 is handed out only after N is visible (CONTRACT invariant 5).
    """

    # No index of its own: message_queue_unique leads with it (see decision 0030).
    topic = models.ForeignKey(
        Topic, on_delete=models.CASCADE, related_name="message_queues", db_index=False
    )
    queue_id = models.PositiveSmallIntegerField()
    next_offset = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["topic", "queue_id"], name="message_queue_unique")
        ]

    def __str__(self) -> str:
        return f"{self.topic_id}:{self.queue_id}"


class ProducerGroup(models.Model):
    name = models.CharField(max_length=127, unique=True)
    check_url = models.CharField(max_length=2048, blank=True)
    signing_secret = models.CharField(max_length=128)
    # Kept during a rotation so check-back can sign with both (Standard Webhooks).
    previous_signing_secret = models.CharField(max_length=128, blank=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    # The topics this group may send and prepare to; none bound = any topic (docs/decisions/0010).
    topics = models.ManyToManyField(Topic, blank=True, related_name="producer_groups")

    def __str__(self) -> str:
        return self.name


class ConsumeFrom(models.TextChoices):
    FIRST = "first"
    LAST = "last"


class ConsumerGroup(models.Model):
    name = models.CharField(max_length=127, unique=True)
    max_delivery_attempts = models.PositiveSmallIntegerField(default=16)
    consume_from = models.CharField(
        max_length=8, choices=ConsumeFrom.choices, default=ConsumeFrom.FIRST
    )
    created_at = models.DateTimeField(default=timezone.now)
    # Receives each message group's messages in order, one at a time (docs/decisions/0054).
    fifo = models.BooleanField(default=False, db_default=False)
    # The topics this group may receive from; none bound = any topic (docs/decisions/0010).
    topics = models.ManyToManyField(Topic, blank=True, related_name="consumer_groups")

    def __str__(self) -> str:
        return self.name


class ApiToken(models.Model):
    name = models.CharField(max_length=127)
    # SHA-256 of the token: tokens are 256-bit random, so a slow KDF would add nothing.
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # The token's RocketMQ access key (gRPC door); its secret key is derived from a server key and
    # this access key, never stored (docs/decisions/0022). Null for tokens older than the gRPC door.
    access_key = models.CharField(max_length=40, unique=True, null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}...)"


class GrpcClient(models.Model):
    """A RocketMQ client of the gRPC door, by token and client id (decision 0100): its settings
    (kept for a stream reopened without them) and the process holding its stream (for checks)."""

    client_id = models.CharField(max_length=255)
    client_type = models.CharField(max_length=32)  # PRODUCER, SIMPLE_CONSUMER, PUSH_CONSUMER...
    # The producer group (from the token's produce scope) or the consumer group.
    group = models.CharField(max_length=127, blank=True)
    topics = models.JSONField(default=list)
    language = models.CharField(max_length=32, blank=True)
    version = models.CharField(max_length=64, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    token = models.ForeignKey(ApiToken, null=True, on_delete=models.SET_NULL)
    # "<host>:<pid>" of the gRPC process holding the client's Telemetry stream; blank: none.
    stream_process = models.CharField(max_length=255, blank=True)
    connected_at = models.DateTimeField(default=timezone.now)
    seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["group", "client_type"], name="grpc_client_group_idx")]
        constraints = [
            models.UniqueConstraint(fields=["token", "client_id"], name="grpc_client_uq")
        ]

    def __str__(self) -> str:
        return self.client_id


class TransactionState(models.TextChoices):
    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    PARKED = "PARKED"


UNRESOLVED_STATES = (TransactionState.PREPARED, TransactionState.PARKED)


class Resolver(models.TextChoices):
    PRODUCER = "PRODUCER"
    CHECK_BACK = "CHECK_BACK"
    OPERATOR = "OPERATOR"
    SYSTEM = "SYSTEM"


class MessageFields(models.Model):
    """What a producer sends, shared by half messages and the commit log."""

    # 32 hex characters when txhub makes it; a RocketMQ client's own message id (34 characters,
    # "01" + 32 hex) when it came through the gRPC door.
    msg_id = models.CharField(max_length=64, unique=True, default=new_msg_id)
    queue_id = models.PositiveSmallIntegerField()
    tags = models.CharField(max_length=128, blank=True)
    keys = models.JSONField(default=list)
    properties = models.JSONField(default=dict)
    body = models.BinaryField()
    body_is_binary = models.BooleanField(default=False)
    born_at = models.DateTimeField(default=timezone.now)
    # Its message group ("" for none): one group's messages share a queue, in commit order, and
    # a FIFO consumer group receives them one at a time (docs/decisions/0054).
    message_group = models.CharField(max_length=128, blank=True, default="", db_default="")

    class Meta:
        abstract = True


class HalfMessage(MessageFields):
    """A prepared transactional message: invisible to consumers until committed."""

    transaction_id = models.UUIDField(unique=True, default=uuid.uuid4)
    # No index of its own: half_group_state_idx leads with it (see decision 0030).
    producer_group = models.ForeignKey(ProducerGroup, on_delete=models.PROTECT, db_index=False)
    topic = models.ForeignKey(Topic, on_delete=models.PROTECT)
    state = models.CharField(
        max_length=16, choices=TransactionState.choices, default=TransactionState.PREPARED
    )
    check_times = models.PositiveIntegerField(default=0)
    check_immunity_seconds = models.PositiveIntegerField(null=True, blank=True)
    next_check_at = models.DateTimeField(null=True, blank=True)
    # A lease while a check-back call is in flight: a dead worker's expires, a later scan claims.
    checking_until = models.DateTimeField(null=True, blank=True)
    # Consecutive checks that could not reach the producer: they back off and use no budget.
    unreachable_checks = models.PositiveIntegerField(default=0)
    # Applied from the commit on (CONTRACT section 3): seconds after commit, or an instant.
    delay_seconds = models.PositiveIntegerField(null=True, blank=True)
    deliver_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=16, choices=Resolver.choices, blank=True)

    class Meta:
        indexes = [
            # The check-back claim: each group's unresolved checks by when they are due, so a
            # group's backlog is not read to reach another group's (checkback.CLAIM_SQL).
            models.Index(
                fields=["producer_group", "next_check_at"],
                name="half_group_due_check_idx",
                condition=Q(state="PREPARED"),
            ),
            # The scan's per-group count of checks in flight (leases): small whatever the backlog.
            models.Index(
                fields=["checking_until"],
                name="half_checking_idx",
                condition=Q(state="PREPARED", checking_until__isnull=False),
            ),
            models.Index(
                fields=["producer_group", "state", "born_at"], name="half_group_state_idx"
            ),
            models.Index(fields=["state", "born_at"], name="half_state_born_idx"),
            # The console's resolutions-per-minute chart (an index-only scan, hence the INCLUDE)
            # and the retention sweep.
            models.Index(
                fields=["resolved_at"],
                name="half_resolved_idx",
                include=["state", "resolved_by"],
                condition=Q(resolved_at__isnull=False),
            ),
            # The console list's sorts; born_at never changes, check_times only when checked.
            models.Index(fields=["born_at", "id"], name="half_born_idx"),
            models.Index(fields=["check_times", "id"], name="half_check_times_idx"),
        ]

    def __str__(self) -> str:
        return str(self.transaction_id)


class OpKind(models.TextChoices):
    PREPARE = "PREPARE"
    CHECK = "CHECK"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    PARK = "PARK"
    RESUME = "RESUME"


FINAL_OPS = (OpKind.COMMIT, OpKind.ROLLBACK)


class OpRecord(models.Model):
    """Append-only: one event in a half message's life, with who decided and why."""

    # No index of its own: op_half_idx leads with it (see decision 0030).
    half = models.ForeignKey(
        HalfMessage, on_delete=models.CASCADE, related_name="ops", db_index=False
    )
    op = models.CharField(max_length=16, choices=OpKind.choices)
    source = models.CharField(max_length=16, choices=Resolver.choices)
    actor = models.CharField(max_length=150, blank=True)
    reason = models.TextField(blank=True)
    detail = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Belt and braces for CONTRACT invariant 2: the row lock decides, this proves it.
            models.UniqueConstraint(
                fields=["half"],
                condition=Q(op__in=["COMMIT", "ROLLBACK"]),
                name="one_final_op_per_transaction",
            )
        ]
        indexes = [
            models.Index(fields=["half", "id"], name="op_half_idx"),
            # The console's check-back success rate over the last hour.
            models.Index(fields=["op", "at"], name="op_kind_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.op} {self.half_id}"


class CommitLogEntry(MessageFields):
    """A visible message. `offset` is global; (topic, queue_id, queue_offset) is dense per queue."""

    offset = models.BigAutoField(primary_key=True)
    # No index of its own: commit_log_position_unique leads with it. A topic-only index was what
    # the planner took for a new topic's reads (decision 0030).
    topic = models.ForeignKey(Topic, on_delete=models.PROTECT, db_index=False)
    queue_offset = models.BigIntegerField()
    producer_group = models.CharField(max_length=127)
    # Unique: a committed transaction appears in the commit log exactly once (invariant 3).
    transaction_id = models.UUIDField(null=True, blank=True, unique=True)
    stored_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["topic", "queue_id", "queue_offset"], name="commit_log_position_unique"
            )
        ]
        indexes = [
            # The nightly reconciliation reads a day of the log. BRIN: a few pages for the whole
            # append-only table (stored_at grows with the offset), next to nothing per insert.
            BrinIndex(fields=["stored_at"], name="log_stored_brin"),
        ]

    def __str__(self) -> str:
        return f"{self.topic_id}:{self.queue_id}:{self.queue_offset}"


class ConsumerCursor(models.Model):
    """Next queue offset a consumer group has not yet taken from one queue."""

    # No indexes of their own: consumer_cursor_unique serves every read (decision 0030).
    group = models.ForeignKey(
        ConsumerGroup, on_delete=models.CASCADE, related_name="cursors", db_index=False
    )
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, db_index=False)
    queue_id = models.PositiveSmallIntegerField()
    next_offset = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["group", "topic", "queue_id"], name="consumer_cursor_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.group_id}@{self.topic_id}:{self.queue_id}={self.next_offset}"


class DeliveryState(models.TextChoices):
    INFLIGHT = "INFLIGHT"  # received, or waiting to be received again once invisible_until passes
    ACKED = "ACKED"
    DLQ = "DLQ"
    # A FIFO group's message read in its message group's order, behind an earlier one that is not
    # yet acked or dead-lettered: handed out when that one is (docs/decisions/0054).
    HELD = "HELD"


class Delivery(models.Model):
    """One committed message as seen by one consumer group."""

    # No indexes of their own: those led by the group are partial (in flight, held, dead-lettered)
    # and delivery_unique leads with the message. An index of every delivery a group ever had was
    # what the planner took for a new group's acks, and read it all (decision 0030); deleting a
    # group reads the table once instead (decision 0088). A topic with deliveries has log rows,
    # which PROTECT it from deletion, so no cascade needs a topic index.
    group = models.ForeignKey(
        ConsumerGroup, on_delete=models.CASCADE, related_name="deliveries", db_index=False
    )
    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, db_index=False)
    # No index of its own: delivery_unique leads with it (the retention sweep's cascade).
    message = models.ForeignKey(
        CommitLogEntry, on_delete=models.CASCADE, related_name="deliveries", db_index=False
    )
    state = models.CharField(
        max_length=8, choices=DeliveryState.choices, default=DeliveryState.INFLIGHT
    )
    attempts = models.PositiveIntegerField(default=0)
    invisible_until = models.DateTimeField()
    # Changes on every receive, so a handle from an earlier attempt no longer acks.
    handle_token = models.CharField(max_length=32)
    first_received_at = models.DateTimeField(null=True, blank=True)
    last_received_at = models.DateTimeField(null=True, blank=True)
    acked_at = models.DateTimeField(null=True, blank=True)
    dlq_at = models.DateTimeField(null=True, blank=True)
    # The message's group, in a FIFO consumer group only ("" otherwise; decision 0054).
    message_group = models.CharField(max_length=128, blank=True, default="", db_default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["message", "group"], name="delivery_unique")]
        indexes = [
            models.Index(
                fields=["group", "topic", "invisible_until"],
                name="delivery_inflight_idx",
                condition=Q(state="INFLIGHT"),
            ),
            models.Index(
                fields=["group", "dlq_at"], name="delivery_dlq_idx", condition=Q(state="DLQ")
            ),
            # A FIFO group's message groups: the held messages in order, and the heads.
            models.Index(
                fields=["group", "topic", "message_group", "message"],
                name="delivery_held_idx",
                condition=Q(state="HELD"),
            ),
            models.Index(
                fields=["group", "topic", "message_group"],
                name="delivery_fifo_head_idx",
                condition=Q(state="INFLIGHT") & ~Q(message_group=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.group_id}:{self.message_id} {self.state}"


class DelayedMessage(MessageFields):
    """A message waiting for its delivery time; moved into the commit log once, when due."""

    topic = models.ForeignKey(Topic, on_delete=models.PROTECT)
    producer_group = models.CharField(max_length=127)
    transaction_id = models.UUIDField(null=True, blank=True, unique=True)
    deliver_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["deliver_at"], name="delayed_due_idx")]

    def __str__(self) -> str:
        return f"{self.msg_id} at {self.deliver_at}"


class RecalledMessage(MessageFields):
    """A delayed message recalled, moved here from broker_delayedmessage (decision 0055)."""

    topic = models.ForeignKey(Topic, on_delete=models.PROTECT, related_name="+")
    producer_group = models.CharField(max_length=127)
    transaction_id = models.UUIDField(null=True, blank=True, unique=True)
    deliver_at = models.DateTimeField()  # when it would have been delivered
    recalled_at = models.DateTimeField(default=timezone.now, db_index=True)  # retention sweeps
    recalled_by = models.CharField(max_length=150)  # the token's name
    door = models.CharField(max_length=16)  # "rest" or "grpc"

    def __str__(self) -> str:
        return f"{self.msg_id} recalled at {self.recalled_at}"


class IdempotencyKey(models.Model):
    """The first answer to a request sent with an `Idempotency-Key` (Stripe's convention): a retry
    with the same key and the same request within TXHUB_IDEMPOTENCY_TTL answers it again and
    stores nothing. Written in the same database transaction as what the request stored."""

    producer_group = models.ForeignKey(ProducerGroup, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    # sha256 of the method, the path and the request's JSON: "the same request".
    fingerprint = models.CharField(max_length=64)
    status = models.PositiveSmallIntegerField()
    response = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["producer_group", "key"], name="idempotency_key_unique")
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created_idx")]

    def __str__(self) -> str:
        return f"{self.producer_group_id}:{self.key}"


class AuditAction(models.TextChoices):
    TOKEN_CREATE = "token_create"  # noqa: S105 - a name, not a secret
    TOKEN_REVOKE = "token_revoke"  # noqa: S105 - a name, not a secret
    CHECK_URL_CHANGE = "check_url_change", "Check URL change"
    SECRET_ROTATE = "secret_rotate"  # noqa: S105 - a name, not a secret
    TOPIC_BINDINGS_CHANGE = "topic_bindings_change"
    DLQ_RESEND = "dlq_resend", "DLQ resend"
    CONSUMER_GROUP_DELETE = "consumer_group_delete"


class ActorKind(models.TextChoices):
    TOKEN = "token"  # noqa: S105 - a name, not a secret
    OPERATOR = "operator"  # a Django user: the console or the admin
    CLI = "cli", "CLI"
    SYSTEM = "system"  # a call from code with no door: services/audit.SYSTEM


class Door(models.TextChoices):
    REST = "rest", "REST"
    CONSOLE = "console"
    ADMIN = "admin"
    CLI = "cli", "CLI"
    SYSTEM = "system"


class AuditRecord(models.Model):
    """Append-only: who changed access or configuration, when, what and from where; written in
    the same database transaction as the change (docs/decisions/0039). Never a token or secret."""

    at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=150)  # a token's name or a Django user name
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    action = models.CharField(max_length=32, choices=AuditAction.choices)
    target = models.CharField(max_length=127)  # a group's or a token's name
    detail = models.JSONField(default=dict, blank=True)
    address = models.CharField(max_length=64, blank=True)  # REMOTE_ADDR, or "cli"
    door = models.CharField(max_length=16, choices=Door.choices)

    class Meta:
        indexes = [models.Index(fields=["-at"], name="audit_record_at_idx")]

    def __str__(self) -> str:
        return f"{self.action} {self.target} by {self.actor}"


# Defined apart to keep this module small; part of the broker app all the same.
from apps.broker import models_storage as models_storage  # noqa: E402
from apps.broker.models_reconciliation import (  # noqa: E402
    ReconciliationFinding as ReconciliationFinding,
)
from apps.broker.models_reconciliation import (  # noqa: E402
    ReconciliationRun as ReconciliationRun,
)
from apps.broker.models_reconciliation import RunStatus as RunStatus  # noqa: E402

"""Consumer RPCs: SimpleConsumer (receive, ack, change invisible duration) and PushConsumer
(assignments, then the same receive/ack; a failure is a nack through ChangeInvisibleDuration with
the backoff the Telemetry settings announce; the dead-letter queue). Each calls one
`services.consuming` function, the REST door's."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.broker import access, limits, waiting
from apps.broker.grpc.calls import db, log, unary, wait_more
from apps.broker.grpc.protocol import (
    Code,
    Refusal,
    duration_seconds,
    message_of,
    pb,
    refusal_of,
    rpc,
    status,
    timestamp,
    unavailable_refusal,
)
from apps.broker.grpc.resources import (
    ACCEPTED_TYPES,
    as_caller,
    authenticate,
    broker_of,
    consumed_topic_of,
    consumer_group_of,
    route_topic,
    topic_of,
)
from apps.broker.services import consuming, dead_letters
from apps.broker.services.errors import BrokerError

# A nack's retry delay may be shorter than a receive's minimum; below 1 s it waits 1 s (the Node
# client 1.0.8 nacks with 0 s when the server's backoff is a customized one, which it ignores).
MIN_RETRY_DELAY = 1
# A message a receive reserved but could not write, its client gone, is given back as RocketMQ's
# proxy gives it back (ReceiveMessageResponseStreamWriter): a change of its invisible time to its
# NACK_INVISIBLE_TIME, 1 s. The reservation still counts as an attempt, as RocketMQ's revive
# counts it (docs/decisions/0115).
UNWRITTEN_INVISIBLE_SECONDS = 1


class ConsumerRpcs:
    @unary(rpc.QueryAssignmentResponse, not_found=Code.CONSUMER_GROUP_NOT_FOUND)
    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        """A PushConsumer's queues. As RocketMQ's proxy does for non-FIFO groups: one assignment
        per broker, queue id -1 (every queue of the topic), so each client instance runs one long
        poll and the server hands out messages from any queue, exactly once at a time."""
        caller = await authenticate(context)
        _, topic = await db(consumed_topic_of, caller, request.group.name, request.topic.name)
        queue = pb.MessageQueue(
            topic=route_topic(topic, request.topic),
            id=-1,
            permission=pb.READ_WRITE,
            broker=broker_of(request.endpoints),
            accept_message_types=ACCEPTED_TYPES,
        )
        return rpc.QueryAssignmentResponse(
            status=status(), assignments=[pb.Assignment(message_queue=queue)]
        )

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        remaining = context.time_remaining()
        since = asyncio.get_running_loop().time()
        try:
            group, topic, seconds, received, plan = await _first_try_kept(
                context, request, remaining
            )
            if plan is not None:
                received = await wait_more(plan, since=since)
        except Exception as error:
            refused = _refusal_of_receive_failure(error)
            yield rpc.ReceiveMessageResponse(status=status(refused.code, refused.message))
            return
        if not received:
            yield rpc.ReceiveMessageResponse(
                status=status(Code.MESSAGE_NOT_FOUND, "No new message.")
            )
            return
        unwritten = list(received)
        try:
            for answer in answers_of(received, topic=topic.name, invisible_seconds=seconds):
                yield answer
                if answer.HasField("message"):
                    del unwritten[0]
        except GeneratorExit:  # closed at a write that did not happen: the client left
            if unwritten:
                await _given_back(group, unwritten)
            raise

    @unary(rpc.AckMessageResponse, not_found=Code.CONSUMER_GROUP_NOT_FOUND)
    async def AckMessage(self, request: Any, context: Any) -> Any:
        return await as_caller(context, self._ack, request)

    @staticmethod
    def _ack(caller: Any, request: Any) -> Any:
        group = consumer_group_of(caller, request.group.name)
        if not 1 <= len(request.entries) <= limits.MAX_ACK_HANDLES:
            raise Refusal(
                Code.BAD_REQUEST, f"Ack 1 to {limits.MAX_ACK_HANDLES} messages per request."
            )
        handles = [entry.receipt_handle for entry in request.entries]
        acked, _ = consuming.message_ack(group=group, receipt_handles=handles)
        done = set(acked)
        entries = []
        for entry in request.entries:
            ok = entry.receipt_handle in done
            entries.append(
                rpc.AckMessageResultEntry(
                    message_id=entry.message_id,
                    receipt_handle=entry.receipt_handle,
                    status=status()
                    if ok
                    else status(
                        Code.INVALID_RECEIPT_HANDLE, "The receipt handle is expired or unknown."
                    ),
                )
            )
        codes = {entry.status.code for entry in entries}
        overall = (
            entries[0].status if len(codes) == 1 else status(Code.MULTIPLE_RESULTS, "See entries.")
        )
        return rpc.AckMessageResponse(status=overall, entries=entries)

    @unary(rpc.ChangeInvisibleDurationResponse, not_found=Code.CONSUMER_GROUP_NOT_FOUND)
    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        """Also a PushConsumer's nack: the client asks for its backoff's next delay."""
        caller = await authenticate(context)
        group = await db(consumer_group_of, caller, request.group.name)
        seconds = duration_seconds(request.invisible_duration, code=Code.ILLEGAL_INVISIBLE_TIME)
        if not 0 <= seconds <= limits.MAX_INVISIBLE_SECONDS:
            raise Refusal(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"The invisible duration must be 0..{limits.MAX_INVISIBLE_SECONDS} s.",
            )
        try:
            received = await db(
                consuming.message_change_invisible,
                group=group,
                receipt_handle=request.receipt_handle,
                invisible_seconds=max(MIN_RETRY_DELAY, round(seconds)),
            )
        except BrokerError as error:
            raise Refusal(Code.INVALID_RECEIPT_HANDLE, error.message) from None
        return rpc.ChangeInvisibleDurationResponse(
            status=status(), receipt_handle=received.receipt_handle
        )

    @unary(rpc.ForwardMessageToDeadLetterQueueResponse, not_found=Code.CONSUMER_GROUP_NOT_FOUND)
    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        """The client gives up on a message it holds (RocketMQ clients do so for FIFO groups):
        into the group's dead-letter queue now, the one REST and the console list and resend."""
        caller = await authenticate(context)
        if request.HasField("lite_topic") and request.lite_topic:
            raise Refusal(Code.UNSUPPORTED, "Lite topics are not supported.")
        group, topic = await db(consumed_topic_of, caller, request.group.name, request.topic.name)
        try:
            await db(
                dead_letters.message_dead_letter,
                group=group,
                topic=topic,
                receipt_handle=request.receipt_handle,
            )
        except BrokerError as error:
            raise Refusal(Code.INVALID_RECEIPT_HANDLE, error.message) from None
        return rpc.ForwardMessageToDeadLetterQueueResponse(status=status())


def answers_of(
    received: list[consuming.Received], *, topic: str, invisible_seconds: int
) -> Iterator[Any]:
    """A receive's stream once something was received: OK, each message, then the delivery
    timestamp."""
    yield rpc.ReceiveMessageResponse(status=status())
    for item in received:
        message = message_of(
            item.message,
            topic=topic,
            receipt_handle=item.receipt_handle,
            delivery_attempt=item.delivery.attempts,
            invisible_seconds=invisible_seconds,
        )
        yield rpc.ReceiveMessageResponse(message=message)
    yield rpc.ReceiveMessageResponse(delivery_timestamp=timestamp(timezone.now()))


# The give-backs under way: a task the loop holds only weakly is kept until it is done.
_giving_back: set[asyncio.Task[None]] = set()


async def _given_back(group: Any, unwritten: list[consuming.Received]) -> None:
    """The messages a receive's client never got, visible again soon (UNWRITTEN_INVISIBLE_SECONDS)
    through the one change of invisible time. Shielded: grpc cancels the RPC's task when it sees
    the client gone, which may be while this runs. A failure only leaves them reserved until
    their own invisible time, as before: it is logged, and the stream ends as it was ending."""
    giving = _giving_back_started(group, unwritten)
    with contextlib.suppress(Exception):  # logged by _given_back_done
        await asyncio.shield(giving)


def _giving_back_started(group: Any, unwritten: list[consuming.Received]) -> asyncio.Task[None]:
    handles = [each.receipt_handle for each in unwritten]
    giving = asyncio.ensure_future(db(_change_invisible_each, group, handles))
    _giving_back.add(giving)
    giving.add_done_callback(_given_back_done)
    return giving


def _given_back_done(giving: asyncio.Task[None]) -> None:
    _giving_back.discard(giving)
    if not giving.cancelled() and giving.exception() is not None:
        log.error("gRPC ReceiveMessage: messages not given back", exc_info=giving.exception())


def _change_invisible_each(group: Any, receipt_handles: list[str]) -> None:
    for handle in receipt_handles:
        try:
            consuming.message_change_invisible(
                group=group, receipt_handle=handle, invisible_seconds=UNWRITTEN_INVISIBLE_SECONDS
            )
        except BrokerError:
            continue  # no longer live (its invisible time ran out meanwhile): nothing to give


def _refusal_of_receive_failure(error: Exception) -> Refusal:
    """What a receive that failed answers; an error of the server's own is logged here, once."""
    if isinstance(error, Refusal):
        return error
    if isinstance(error, BrokerError):
        # Not found here is the group, deleted since it was read (decision 0088): the topic's
        # and an unknown group's refusals were made before, as Refusals.
        return refusal_of(error, not_found=Code.CONSUMER_GROUP_NOT_FOUND)
    down = unavailable_refusal(error)
    if down is None:
        log.error("gRPC ReceiveMessage failed", exc_info=error)
        down = Refusal(Code.INTERNAL_ERROR, "Internal error.")
    return down


# A receive's first try: the group, the topic, the invisible seconds, what was found, and the
# plan to wait on if nothing was.
FirstTry = tuple[Any, Any, int, list[consuming.Received], consuming.WaitPlan | None]


async def _first_try_kept(context: Any, request: Any, remaining: float | None) -> FirstTry:
    """`_first_try` in the RPC's one thread hop, shielded from the RPC's cancellation: the thread
    goes on when grpc cancels the RPC's task (the client left), and what it then reserves is
    given back as a receive's unwritten messages are (docs/decisions/0115, its follow-up)."""
    trying = asyncio.ensure_future(as_caller(context, _first_try, request, remaining))
    try:
        return await asyncio.shield(trying)
    except asyncio.CancelledError:
        trying.add_done_callback(_first_try_left)
        raise


def _first_try_left(trying: asyncio.Future[FirstTry]) -> None:
    """A first try whose client left while it ran: what it reserved given back, a failure of the
    server's own logged as if answered; one that found nothing gives back nothing."""
    if trying.cancelled():
        return
    error = trying.exception()
    if isinstance(error, Exception):
        _refusal_of_receive_failure(error)  # logged there if the server's own; nobody to answer
        return
    if error is not None:
        log.error("gRPC ReceiveMessage failed", exc_info=error)
        return
    group, _, _, received, _ = trying.result()
    if received:
        _giving_back_started(group, received)


def _first_try(caller: Any, request: Any, remaining: float | None) -> FirstTry:
    """A receive up to its first try (waiting.first_try), in the RPC's one thread hop: the group,
    the topic, the invisible seconds, what was found, and the plan to wait on if nothing was."""
    group, topic, tags = _receive_target(caller, request)
    invisible: float = limits.DEFAULT_INVISIBLE_SECONDS
    low, high = limits.MIN_INVISIBLE_SECONDS, limits.MAX_INVISIBLE_SECONDS
    if request.HasField("invisible_duration"):
        invisible = duration_seconds(request.invisible_duration, code=Code.ILLEGAL_INVISIBLE_TIME)
        if not low <= invisible <= high:
            raise Refusal(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"The invisible duration must be {low}..{high} s.",
            )
    # proto3 cannot tell a batch size of 0 from none: 0 is unset, the most (as before);
    # anything else outside 1..32 is refused, never clamped (CONTRACT section 3).
    try:
        batch = limits.check_receive_count(request.batch_size or limits.MAX_RECEIVE_MESSAGES)
    except limits.LimitError as error:
        raise Refusal(Code.BAD_REQUEST, str(error)) from None
    wait = 0.0
    if request.HasField("long_polling_timeout"):
        # Clamped, as RocketMQ's proxy clamps it: a client asks for its own long poll.
        wait = min(
            duration_seconds(request.long_polling_timeout, code=Code.ILLEGAL_POLLING_TIME),
            settings.TXHUB_GRPC_LONG_POLL_MAX,
        )
    if remaining is not None:  # answer before the client's own deadline
        wait = max(0.0, min(wait, remaining - 1.0))
    seconds = int(invisible)
    asked = consuming.WaitPlan(
        group=group,
        topic=topic,
        max_messages=batch,
        invisible_seconds=seconds,
        wait_seconds=wait,
        tags=tags,
        token_id=caller.principal.token_id,
    )
    received, plan = waiting.first_try(asked)
    return group, topic, seconds, received, plan


def _receive_target(caller: Any, request: Any) -> tuple[Any, Any, Any]:
    group = consumer_group_of(caller, request.group.name)
    expression = request.filter_expression
    if expression.type == pb.SQL:
        raise Refusal(Code.UNSUPPORTED, "SQL92 filters are not supported: use tags.")
    try:
        tags = limits.check_tag_expression(expression.expression or "*")
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_FILTER_EXPRESSION, str(error)) from None
    topic_name = request.message_queue.topic.name
    epoch = caller.principal.config_epoch
    access.topic_allowed(kind="consume", group=group.name, topic=topic_name, epoch=epoch)
    return group, topic_of(topic_name, epoch), tags

"""Telemetry streams: settings both ways, and check-back commands to producers.

Each gRPC process keeps the streams it holds in `OPEN` ((token, client id) -> outbox: one id
under two tokens is two clients, decision 0100). Who the client is (type, group, topics) is kept
in Postgres by token and client id (services/clients.py), because the Python client reopens a
broken stream without re-sending its settings for up to 5 minutes."""

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from apps.broker import limits, slots, wakeups
from apps.broker.grpc.auth import Caller
from apps.broker.grpc.calls import db, log
from apps.broker.grpc.protocol import (
    Code,
    Refusal,
    client_refusal,
    duration,
    enum_name,
    pb,
    refusal_of,
    rpc,
    status,
    unavailable_refusal,
)
from apps.broker.grpc.resources import consumer_group_of, count_call
from apps.broker.services import clients
from apps.broker.services.errors import BrokerError


@dataclass(eq=False)
class Stream:
    """A stream this process holds: the token that opened it (a check is sent on it only while
    that token may receive it: clients.stream_may_check) and what waits to be written to it, at
    most TXHUB_GRPC_STREAM_OUTBOX commands: a client that does not read is disconnected, never
    buffered without bound (docs/decisions/0034)."""

    token_id: int
    task: "asyncio.Task[Any] | None"
    outbox: "asyncio.Queue[Any]" = field(
        default_factory=lambda: asyncio.Queue(maxsize=settings.TXHUB_GRPC_STREAM_OUTBOX)
    )
    # The last command the stream writes when it is closed, saying why.
    ending: Any = None
    # True while a write is under way: one that does not finish (a client that does not read)
    # is ended by cancelling the stream's task.
    writing: bool = False

    def offer(self, command: Any) -> bool:
        """Queues `command`; a full outbox ends the stream (False)."""
        try:
            self.outbox.put_nowait(command)
            return True
        except asyncio.QueueFull:
            self.close(
                Code.TOO_MANY_REQUESTS,
                "Closed: more commands waited for this stream than TXHUB_GRPC_STREAM_OUTBOX "
                "(the client does not read).",
            )
            return False

    def close(self, code: int | None, why: str) -> None:
        """Ends the stream: what waits in the outbox is dropped, `why` is written last (unless
        `code` is None). A write that is stuck (the client does not read) is cancelled with the
        stream's task."""
        log.info("telemetry stream of token %s: %s", self.token_id, why)
        if code is not None:
            self.ending = rpc.TelemetryCommand(status=status(code, why))
        while not self.outbox.empty():
            self.outbox.get_nowait()
        self.outbox.put_nowait(None)
        if self.writing and self.task is not None and not self.task.done():
            self.task.cancel()


# Streams held by this process: (token id, client id) -> its stream (decision 0100).
OPEN: dict[tuple[int, str], Stream] = {}

# What the server announces: the limits it enforces (apps/broker/limits.py, settings).
MAX_BODY_BYTES = settings.TXHUB_MAX_BODY_BYTES
RECEIVE_BATCH = limits.MAX_RECEIVE_MESSAGES
PRODUCER_ATTEMPTS = 3


async def serve(*, caller: Caller, requests: Any, process: str) -> AsyncIterator[Any]:
    """One client's stream: replies to its settings, and whatever check-back queues for it.
    It holds one of its token's stream slots while open: past the cap it is refused
    (TOO_MANY_REQUESTS) before anything is stored (slots.py, docs/decisions/0084)."""
    try:
        slot = slots.held(caller.principal.token_id, slots.Kind.STREAM)
    except BrokerError as error:
        refused = refusal_of(error)
        yield rpc.TelemetryCommand(status=status(refused.code, refused.message))
        return
    # Closed with the stream (aclosing): its own clean-up runs before the slot is given back.
    with slot:
        async with contextlib.aclosing(
            _serve(caller=caller, requests=requests, process=process)
        ) as commands:
            async for command in commands:
                yield command


async def _serve(*, caller: Caller, requests: Any, process: str) -> AsyncGenerator[Any, None]:
    client_id, token_id = caller.client_id, caller.principal.token_id
    key = (token_id, client_id)
    try:
        # The client id must be given and this token's (clients.client_claim): else refused
        # (CLIENT_ID_REQUIRED when there is none), nothing held.
        await db(
            clients.client_stream_opened,
            client_id=client_id,
            token_id=token_id,
            process=process,
        )
    except limits.LimitError as error:
        refused = client_refusal(error)
        yield rpc.TelemetryCommand(status=status(refused.code, refused.message))
        return
    except BrokerError as error:
        refused = refusal_of(error)
        yield rpc.TelemetryCommand(status=status(refused.code, refused.message))
        return
    stream = Stream(token_id=token_id, task=asyncio.current_task())
    previous = OPEN.get(key)
    OPEN[key] = stream
    if previous is not None:
        previous.close(None, "the client opened a new stream")
    outbox = stream.outbox

    def on_revoked() -> None:
        stream.close(Code.UNAUTHORIZED, "Closed: the access key was revoked.")

    # Revoking the token ends the stream, in whichever process holds it (wakeups.py).
    wakeups.hub().watch_token(stream.token_id, on_revoked)

    async def read() -> None:
        try:
            async for command in requests:
                if not command.HasField("settings"):
                    continue
                if not stream.offer(await _on_settings(caller, command.settings)):
                    return
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a broken stream: the client reopens it
            log.info("telemetry stream of %s ended: %s", client_id, error)
        if not stream.offer(None):
            return

    reader = asyncio.create_task(read())
    try:
        while True:
            command = await outbox.get()
            if command is None:
                if stream.ending is not None:
                    yield stream.ending
                return
            stream.writing = True
            yield command
            stream.writing = False
    finally:
        reader.cancel()
        wakeups.hub().unwatch_token(stream.token_id, on_revoked)
        if OPEN.get(key) is stream:
            del OPEN[key]
            with contextlib.suppress(Exception):  # shutting down: the row is refreshed later
                await db(
                    clients.client_stream_closed,
                    client_id=client_id,
                    token_id=token_id,
                    process=process,
                )


async def _on_settings(caller: Caller, received: Any) -> Any:
    """Remembers who the client is and answers the server's settings (the Node client does not
    finish starting without this reply). Settings refused are answered with a status on the
    stream, which stays open, and nothing of them is stored."""
    refused: Refusal
    try:
        return await db(_settings_reply, caller, received)
    except Refusal as refusal:
        refused = refusal
    except limits.LimitError as error:
        refused = client_refusal(error)
    except BrokerError as error:
        refused = refusal_of(error)
    except Exception as error:
        down = unavailable_refusal(error)
        if down is None:
            log.exception("telemetry settings of %s failed", caller.client_id)
            down = Refusal(Code.INTERNAL_ERROR, "Internal error.")
        refused = down
    return rpc.TelemetryCommand(status=status(refused.code, refused.message))


def _settings_reply(caller: Caller, received: Any) -> Any:
    count_call(caller)  # a settings command is a call like any other (TXHUB_THROTTLE_RATE)
    reply = pb.Settings()
    reply.CopyFrom(received)
    client_type = received.client_type
    agent = received.user_agent
    language = caller.language
    if agent.language:
        language = enum_name(pb.Language, agent.language, code=Code.BAD_REQUEST, what="language")
    common = {
        "client_id": caller.client_id,
        "token_id": caller.principal.token_id,
        "client_type": enum_name(
            pb.ClientType, client_type, code=Code.UNRECOGNIZED_CLIENT_TYPE, what="client type"
        ),
        "language": language,
        "version": agent.version or caller.version,
        "hostname": agent.hostname,
    }
    if client_type == pb.PRODUCER:
        group = caller.principal.only_group("produce")
        topics = [topic.name for topic in received.publishing.topics]
        clients.client_seen(**common, group=group, topics=topics)
        reply.backoff_policy.CopyFrom(
            pb.RetryPolicy(
                max_attempts=PRODUCER_ATTEMPTS,
                exponential_backoff=pb.ExponentialBackoff(
                    initial=duration(0.01), max=duration(1), multiplier=2
                ),
            )
        )
        reply.publishing.max_body_size = MAX_BODY_BYTES
        reply.publishing.validate_message_type = True
    else:
        subscription = received.subscription
        group_name = subscription.group.name
        consumer_group = consumer_group_of(caller, group_name)
        topics = [entry.topic.name for entry in subscription.subscriptions]
        limits.check_client_topics(topics)  # how many before each filter is read
        for entry in subscription.subscriptions:
            _check_filter(entry.expression)
        clients.client_seen(**common, group=group_name, topics=topics)
        reply.backoff_policy.CopyFrom(
            pb.RetryPolicy(
                max_attempts=consumer_group.max_delivery_attempts,
                customized_backoff=pb.CustomizedBackoff(
                    next=[duration(seconds) for seconds in settings.TXHUB_GRPC_CONSUMER_BACKOFF]
                ),
            )
        )
        # A FIFO group's PushConsumers consume each message group serially, retry in place and
        # forward to the dead-letter queue after their last attempt (docs/decisions/0056).
        reply.subscription.fifo = consumer_group.fifo
        reply.subscription.receive_batch_size = RECEIVE_BATCH
        asked = subscription.long_polling_timeout.seconds or settings.TXHUB_GRPC_LONG_POLL_MAX
        clamped = min(
            max(asked, settings.TXHUB_GRPC_LONG_POLL_MIN), settings.TXHUB_GRPC_LONG_POLL_MAX
        )
        reply.subscription.long_polling_timeout.CopyFrom(duration(clamped))
    reply.metric.on = False
    return rpc.TelemetryCommand(status=status(), settings=reply)


def _check_filter(expression: Any) -> None:
    """A subscription's tag filter, as a receive checks it (limits.check_tag_expression); SQL92
    filters are refused when a receive uses one (consumers.py)."""
    if expression.type == pb.SQL:
        return
    try:
        limits.check_tag_expression(expression.expression or "*")
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_FILTER_EXPRESSION, str(error)) from None


def stream_of(*, token_id: int, client_id: str) -> Stream | None:
    return OPEN.get((token_id, client_id))

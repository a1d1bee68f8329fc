"""What every RPC checks first: the signed caller, and the topic or consumer group it names, in
the protocol's codes (shared by the producer and consumer RPCs)."""

from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings

from apps.broker import access, limits, selectors
from apps.broker.api import throttling
from apps.broker.grpc.auth import Caller, caller_of, metadata_of
from apps.broker.grpc.calls import db
from apps.broker.grpc.protocol import Code, Refusal, enum_name, pb, refusal_of
from apps.broker.services.errors import BrokerError

T = TypeVar("T")


async def authenticate(context: Any) -> Caller:
    """The signed caller, counted against its token's rate limit (every RPC and every stream
    opened counts once, as every REST request does)."""
    return await db(counted_caller, metadata_of(context))


async def as_caller(context: Any, fn: Callable[..., T], /, *args: Any) -> T:
    """`fn(caller, *args)` for the signed, counted caller, both in one thread hop: a hot RPC's
    whole synchronous part (docs/decisions/0052)."""
    return await db(_as_caller, metadata_of(context), fn, args)


def _as_caller(metadata: dict[str, str], fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    return fn(counted_caller(metadata), *args)


def counted_caller(metadata: dict[str, str]) -> Caller:
    caller, counted = caller_of(metadata)
    count_call(caller, counted)
    return caller


def count_call(caller: Caller, counted: throttling.Counted | None = None) -> None:
    """One call against the token's rate limit (`counted`: made already, with the caller's
    epoch), or TOO_MANY_REQUESTS. The REST door's budget and counter (one per token, in the
    shared cache): not a second limit."""
    wait = throttling.token_call_throttled(caller.principal.token_id, counted)
    if wait is not None:
        raise Refusal(
            Code.TOO_MANY_REQUESTS,
            f"Rate limit exceeded ({settings.TXHUB_THROTTLE_RATE} per token): "
            f"retry in {int(wait)} s.",
        )


def topic_of(name: str, epoch: str | None = None) -> Any:
    """The topic, kept per process under the caller's configuration epoch (`epoch`, its
    principal's) as the REST door's lookups (docs/decisions/0026)."""
    try:
        limits.check_name(name, what="The topic")
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_TOPIC, str(error)) from None
    try:
        return selectors.topic_get(name=name, epoch=epoch)
    except BrokerError as error:
        raise refusal_of(error, not_found=Code.TOPIC_NOT_FOUND) from None


def consumer_group_of(caller: Caller, name: str) -> Any:
    try:
        limits.check_name(name, what="The consumer group")
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_CONSUMER_GROUP, str(error)) from None
    caller.principal.require("consume", name)
    try:
        return selectors.consumer_group_get(name=name, epoch=caller.principal.config_epoch)
    except BrokerError as error:
        raise refusal_of(error, not_found=Code.CONSUMER_GROUP_NOT_FOUND) from None


def consumed_topic_of(caller: Caller, group_name: str, topic_name: str) -> tuple[Any, Any]:
    """The consumer group and the topic it reads, with the group's topic binding checked."""
    group = consumer_group_of(caller, group_name)
    epoch = caller.principal.config_epoch
    access.topic_allowed(kind="consume", group=group.name, topic=topic_name, epoch=epoch)
    return group, topic_of(topic_name, epoch)


# Every message type is accepted on every queue (txhub topics have no type): the server, not the
# client, refuses what it refuses, with a sentence (docs/decisions/0021).
ACCEPTED_TYPES = [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION]


# txhub is one broker to the clients (routes, assignments, recall handles).
BROKER_NAME = "txhub"


def broker_of(endpoints: Any) -> Any:
    """txhub as one broker: the access point the client dialled (every gRPC process serves every
    queue), or the configured one if the client named none. The client's is echoed for every
    queue of a route, so it is checked first: a known scheme and limits.check_access_point, else
    ILLEGAL_ACCESS_POINT (docs/decisions/0091)."""
    if not endpoints.addresses:
        address = pb.Address(host=settings.TXHUB_GRPC_HOST, port=settings.TXHUB_GRPC_PORT)
        endpoints = pb.Endpoints(scheme=pb.IPv4, addresses=[address])
    enum_name(
        pb.AddressScheme, endpoints.scheme, code=Code.ILLEGAL_ACCESS_POINT, what="address scheme"
    )
    try:
        limits.check_access_point([(each.host, each.port) for each in endpoints.addresses])
    except limits.LimitError as error:
        raise Refusal(Code.ILLEGAL_ACCESS_POINT, str(error)) from None
    return pb.Broker(name=BROKER_NAME, id=0, endpoints=endpoints)


def route_topic(topic: Any, resource: Any) -> Any:
    """A topic as a route names it: with the namespace the client asked in, echoed as RocketMQ's
    proxy echoes it (txhub has no namespaces and keeps none). Empty, or a name as a topic's
    (the proxy checks the namespaced name as a topic): else ILLEGAL_TOPIC, never a text of any
    length copied into every queue of the answer (docs/decisions/0091)."""
    namespace = resource.resource_namespace
    if namespace:
        try:
            limits.check_name(namespace, what="A namespace")
        except limits.LimitError as error:
            raise Refusal(Code.ILLEGAL_TOPIC, str(error)) from None
    return pb.Resource(name=topic.name, resource_namespace=namespace)

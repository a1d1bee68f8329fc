"""The MessagingService's handlers, built from the protocol's service descriptor in place of the
generated `add_MessagingServiceServicer_to_server`, for one rule: a request whose bytes are not
its RPC's message (cut off, corrupt, a string field of invalid UTF-8) is answered in the
protocol's terms, the RPC's response with status BAD_REQUEST, before the caller is checked and
with nothing stored; never grpcio's bare UNKNOWN naming a Python class (docs/decisions/0097)."""

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from apps.broker.grpc.protocol import Code, rpc, status

SERVICE = rpc.DESCRIPTOR.services_by_name["MessagingService"]
log = logging.getLogger("txhub.grpc")
# grpc.aio's server logs what its own code meets while it serves an RPC here.
GRPC_SERVER_LOG = logging.getLogger("grpc._cython.cygrpc")

# The RPC, by its method path, whose handler has finished: grpc itself writes what is left of
# its call (a unary RPC's answer and status, a stream's status). Per RPC: each runs in a task of
# its own, whose context this is set in.
_finished_handler: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "finished_handler", default=None
)


class ClientLeftBeforeTheLastWrite(logging.Filter):
    """grpc writes a unary RPC's answer, and every RPC's status, after the handler returns; a
    client that cancels then (its deadline, a shutdown) makes the core refuse that write, and
    grpc logs an ERROR with a traceback unless it has already seen the cancel. That is a client
    leaving, as `_write` finds during a stream: one DEBUG line, grpc's own for a cancelled RPC.
    Only a refused write (ExecuteBatchError) of an RPC whose handler has finished is told so;
    a handler's failure is logged where it happens (decision 0115)."""

    def filter(self, record: logging.LogRecord) -> bool:
        method = _finished_handler.get()
        failure = record.exc_info[0] if record.exc_info else None
        # grpc.aio's InternalError: its ExecuteBatchError, a write the core refused.
        refused = failure is not None and issubclass(failure, grpc.aio.InternalError)
        if method is not None and refused and record.levelno >= logging.ERROR:
            record.msg, record.args = "RPC cancelled for servicer method [%s]", (method,)
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            record.exc_info, record.exc_text = None, None
        return True


_CLIENT_LEFT = ClientLeftBeforeTheLastWrite()


class _Undecodable:
    """What a request's deserializer gives for bytes that are not the request's message."""


UNDECODABLE = _Undecodable()


def undecodable_message(method: MethodDescriptor) -> str:
    return f"The request is not a valid {method.input_type.name} message."


def _deserializer(request_type: Any) -> Callable[[bytes], Any]:
    parse = request_type.FromString

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            return UNDECODABLE

    return deserialize


def _unary_unary(
    behaviour: Callable[..., Awaitable[Any]], refused: Callable[[], Any], path: str
) -> Any:
    async def handle(request: Any, context: Any) -> Any:
        answer = refused() if request is UNDECODABLE else await behaviour(request, context)
        _finished_handler.set(path)  # grpc writes the answer from here (decision 0115)
        return answer

    return handle


async def _write(context: Any, answer: Any) -> None:
    """Writes one answer of a streaming RPC, the only place they are written. A write the core
    refuses (grpc.aio's InternalError, its ExecuteBatchError) means the call is over: the client
    cancelled, its deadline passed or its connection went. That is a client leaving, not an
    error: the RPC ends as one grpc sees cancelled ends, one DEBUG line, nothing more written
    (grpc logged the refused write at ERROR with a traceback when it had not seen the cancel
    yet). Any other failure, the answers' own included, is logged as an error (decision 0104)."""
    try:
        await context.write(answer)
    except grpc.aio.InternalError:
        raise asyncio.CancelledError from None


@contextlib.asynccontextmanager
async def _failures_told_plainly(context: Any, name: str) -> AsyncIterator[None]:
    """A stream that fails after its first answer cannot carry the failure in an answer's
    status any more: it ends with gRPC's INTERNAL and the words every unary RPC's failure gets,
    never grpcio's UNKNOWN naming a Python class (as decision 0097 for requests). The failure is
    logged with its traceback here (decision 0104)."""
    try:
        yield
    except grpc.aio.AbortError:
        raise  # an RPC ended on purpose, with its own status
    except Exception:
        log.exception("gRPC %s failed", name)
        await context.abort(grpc.StatusCode.INTERNAL, "Internal error.")


def _unary_stream(
    behaviour: Callable[..., AsyncGenerator[Any, None]], refused: Callable[[], Any], name: str
) -> Any:
    # The stream's first and only answer carries the status, as every other refusal of a
    # ReceiveMessage (the clients read a receive's status from its answers). The servicer's
    # stream is closed when this handler ends, however it ends (aclosing).
    async def handle(request: Any, context: Any) -> None:
        if request is UNDECODABLE:
            await _write(context, refused())
        else:
            async with (
                _failures_told_plainly(context, name),
                contextlib.aclosing(behaviour(request, context)) as answers,
            ):
                async for answer in answers:
                    await _write(context, answer)
        _finished_handler.set(_path(name))  # grpc writes the status from here (decision 0115)

    return handle


def _stream_stream(
    behaviour: Callable[..., AsyncGenerator[Any, None]], refused: Callable[[], Any], name: str
) -> Any:
    # The client's requests end at the one that is not a message, as if it had half-closed:
    # the stream answers what it had queued, then the status, and ends (the client reopens it).
    # The servicer's stream is closed when this handler ends, however it ends (aclosing).
    async def handle(requests: AsyncIterator[Any], context: Any) -> None:
        undecodable_met = False

        async def decoded() -> AsyncIterator[Any]:
            nonlocal undecodable_met
            async for request in requests:
                if request is UNDECODABLE:
                    undecodable_met = True
                    return
                yield request

        async with (
            _failures_told_plainly(context, name),
            contextlib.aclosing(behaviour(decoded(), context)) as answers,
        ):
            async for answer in answers:
                await _write(context, answer)
        if undecodable_met:
            await _write(context, refused())
        _finished_handler.set(_path(name))  # grpc writes the status from here (decision 0115)

    return handle


def _path(name: str) -> str:
    return f"/{SERVICE.full_name}/{name}"


def _handler(servicer: Any, method: MethodDescriptor) -> grpc.RpcMethodHandler:
    request_type = GetMessageClass(method.input_type)
    response_type = GetMessageClass(method.output_type)
    message = undecodable_message(method)

    def refused() -> Any:
        return response_type(status=status(Code.BAD_REQUEST, message))

    behaviour = getattr(servicer, method.name)
    arguments = {
        "request_deserializer": _deserializer(request_type),
        "response_serializer": response_type.SerializeToString,
    }
    if method.client_streaming and method.server_streaming:
        return grpc.stream_stream_rpc_method_handler(
            _stream_stream(behaviour, refused, method.name), **arguments
        )
    if method.client_streaming:
        raise NotImplementedError(f"{method.name}: no client-streaming RPC is served")
    if method.server_streaming:
        return grpc.unary_stream_rpc_method_handler(
            _unary_stream(behaviour, refused, method.name), **arguments
        )
    return grpc.unary_unary_rpc_method_handler(
        _unary_unary(behaviour, refused, _path(method.name)), **arguments
    )


def add_to_server(servicer: Any, server: Any) -> None:
    """Registers every RPC of the service with `servicer`'s method of its name, and tells a
    client leaving before grpc's last write of a call as one DEBUG line (decision 0115)."""
    if _CLIENT_LEFT not in GRPC_SERVER_LOG.filters:
        GRPC_SERVER_LOG.addFilter(_CLIENT_LEFT)
    handlers = {method.name: _handler(servicer, method) for method in SERVICE.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),)
    )

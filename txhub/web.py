"""txhub's ASGI handler (docs/decisions/0024): the event loop reads requests, a bounded pool of
threads runs Django.

- The whole body is read on the event loop before any thread is involved, so a client that
  trickles its request in holds a socket and a coroutine, never a thread or a connection. It is
  read into memory and cut at its limit while it arrives, never spooled to disk; a chunked or
  large API body is read only for a valid token (docs/decisions/0032).
- Then Django's ordinary sync stack (middleware, DRF view, ORM) runs for the request in one hop to
  a thread of this process's pool (TXHUB_WEB_THREADS; the lean door's hot calls:
  TXHUB_WEB_HOT_THREADS; receives: TXHUB_WEB_RECEIVE_THREADS), which gives its database
  connection back to psycopg's pool when the request is done. Same code, same answers as under
  gthread; one thread hop per request instead of one per middleware (Django's own ASGIHandler in
  sync mode).
- A receive with `wait_seconds` that found nothing waits on the event loop afterwards
  (apps/broker/api/long_poll.py), holding no thread and no connection.
"""

import asyncio
import io
import json
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import DatabaseError, InterfaceError, connections
from django.http import HttpRequest, HttpResponse
from django.urls import set_script_prefix
from rest_framework import exceptions

from apps.broker import wakeups
from apps.broker.api import auth, lean, long_poll, views
from apps.broker.api.errors import (
    error_body,
    internal_error_body,
    rendered_error,
    retry_after_seconds,
)
from apps.broker.services.registry import hash_token

logger = logging.getLogger(__name__)


_RECEIVE = re.compile(r"/api/v1/consumer-groups/[^/]+/receive")


class BodyTooLarge(Exception):
    pass


class BodyLeftUnread(Exception):
    """The request is answered without its body: the connection closes after the answer, so
    the rest of the body is never read (uvicorn would otherwise read it to its end)."""


class TxhubASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        base.BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.executor = ThreadPoolExecutor(
            max_workers=settings.TXHUB_WEB_THREADS, thread_name_prefix="txhub-web"
        )
        # Receives run in threads of their own: a storm of consumers (500 reconnecting at once,
        # each making its first try) queues behind itself, never in front of a producer's send.
        self.receive_executor = ThreadPoolExecutor(
            max_workers=settings.TXHUB_WEB_RECEIVE_THREADS, thread_name_prefix="txhub-receive"
        )

        # The hot calls the lean door takes (except receives) run in a small pool of their own
        # (docs/decisions/0031): a few threads keep the cores busy for calls that each hold the
        # GIL for a fraction of a millisecond between their waits on Redis and Postgres; more
        # only take turns at the GIL and the queue rows' locks; and a slow page of Django's (the
        # console, an export) can never hold the threads the producers need.
        self.hot_executor = ThreadPoolExecutor(
            max_workers=settings.TXHUB_WEB_HOT_THREADS, thread_name_prefix="txhub-hot"
        )

        # The hot calls' door without Django's request cycle (apps/broker/api/lean.py).
        self.lean = lean.enabled()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise ValueError(f"txhub serves HTTP only, not {scope['type']}")
        await self.handle(scope, receive, send)

    async def send_response(self, response: Any, send: Any) -> None:
        """Django's, with a Content-Length on every whole answer: the answers made on the event
        loop (early refusals, a woken long poll's) run no middleware that would set it, and
        without it uvicorn sends the body chunked, unlike every other answer."""
        if not response.streaming and not response.has_header("Content-Length"):
            response["Content-Length"] = str(len(response.content))
        await super().send_response(response, send)

    async def in_thread(self, function: Any) -> Any:
        return await sync_to_async(function, thread_sensitive=False, executor=self.executor)()

    async def in_receive_thread(self, function: Any) -> Any:
        return await sync_to_async(
            function, thread_sensitive=False, executor=self.receive_executor
        )()

    async def in_plain_thread(self, function: Any, executor: ThreadPoolExecutor) -> Any:
        """For the lean door: no context to carry over (it reads no script prefix, no Local
        set on the loop), so the executor directly, without asgiref's bookkeeping around it."""
        return await asyncio.get_running_loop().run_in_executor(executor, function)

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        arrived = asyncio.get_running_loop().time()  # a long poll's wait counts from here
        refusal = _junk_refused(scope) or await self.refuse_before_the_body(scope)
        if refusal is not None:
            await self.send_response(_closing(refusal), send)
            return
        try:
            body_file, unread = await self.read_body_bounded(scope, receive)
        except RequestAborted:
            return
        except BodyTooLarge:
            await self.send_response(_closing(_too_large()), send)
            return
        scope = _with_length(scope, body_file)
        try:
            if (
                self.lean
                and not unread
                and await self._lean(scope, body_file, receive, send, arrived)
            ):
                return
            set_script_prefix(get_script_prefix(scope))
            request, error_response = self.create_request(scope, body_file)
            response: Any
            if request is None:
                response = error_response
            else:
                request.META[long_poll.WAIT_OUTSIDE] = True
                run = self.in_receive_thread if _RECEIVE.fullmatch(request.path) else self.in_thread
                response = await run(lambda: self._respond(request))
                plan = long_poll.plan_of(response)
                if plan is not None:
                    response = await self._wait(plan, response, receive, arrived)
                    if response is None:
                        return  # the client left while waiting
            try:
                await self.send_response(_closing(response) if unread else response, send)
            finally:
                await self.in_thread(response.close)
        finally:
            body_file.close()

    async def _lean(
        self, scope: Any, body_file: Any, receive: Any, send: Any, arrived: float
    ) -> bool:
        """The lean door (apps/broker/api/lean.py) answers the hot calls it takes; False: it did
        not take this one (nothing done), Django answers."""
        size = body_file.seek(0, 2)
        body_file.seek(0)
        if size > views.LARGE_BODY_BYTES:
            return False
        body = body_file.read()
        body_file.seek(0)
        call = lean.take(scope, body)
        if call is None:
            return False
        receiving = call.route.view is views.ReceiveView
        executor = self.receive_executor if receiving else self.hot_executor
        answer: lean.Answer = await self.in_plain_thread(lambda: lean.answer(call), executor)
        if answer.plan is not None:
            response = HttpResponse(answer.body, status=answer.status)
            for name, value in answer.headers:
                response[name.decode("latin-1")] = value.decode("latin-1")
            waited = await self._wait(answer.plan, response, receive, arrived)
            if waited is not None:
                await self.send_response(waited, send)
            return True
        await send(
            {"type": "http.response.start", "status": answer.status, "headers": answer.headers}
        )
        await send({"type": "http.response.body", "body": answer.body})
        return True

    def _respond(self, request: HttpRequest) -> HttpResponse:
        """Django's sync request cycle in this thread, as the WSGI handler runs it; the database
        connection goes back to the pool at the end (response.close() may run in another
        thread, and this thread serves other requests next)."""
        signals.request_started.send(sender=self.__class__, scope=request.scope)  # type: ignore[attr-defined]
        try:
            response: HttpResponse = self.get_response(request)  # type: ignore[assignment]
            return response
        finally:
            connections.close_all()

    async def _wait(
        self, plan: Any, response: HttpResponse, receive: Any, arrived: float
    ) -> HttpResponse | None:
        """The long poll, given up as soon as the client disconnects. Each try after a wake-up
        is a plain executor hop to a receive thread, as the lean door's calls are: the try
        (long_poll._try_again) reads no context of the request's, so asgiref's copying of it
        around the hop is work on the commit -> waiting consumer path for nothing (decision
        0029)."""

        async def run(function: Any) -> Any:
            return await self.in_plain_thread(function, self.receive_executor)

        waiting = asyncio.ensure_future(long_poll.wait(plan, response, run, arrived))
        leaving = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait([waiting, leaving], return_when=asyncio.FIRST_COMPLETED)
        finally:
            leaving.cancel()
            if not waiting.done():
                waiting.cancel()
        if waiting.cancelled() or not waiting.done():
            return None
        answer: HttpResponse = waiting.result()
        return answer

    async def refuse_before_the_body(self, scope: Any) -> HttpResponse | None:
        """401 for an API request whose body is chunked or above views.LARGE_BODY_BYTES and
        whose bearer token is missing or not valid, before a byte of the body is read: such a
        body costs something to read, and only a caller who could send one may make us read it
        (docs/decisions/0032). Smaller bodies keep the documented order 401 -> 400 -> 403."""
        if not scope["path"].startswith("/api/") or not _large_or_unbounded(scope):
            return None
        authorization = _header(scope, b"authorization")
        address = auth.client_address(scope)

        def check() -> HttpResponse | None:
            try:
                auth.bearer_user(authorization, address)
                return None
            except exceptions.Throttled as error:
                return _throttled(error)
            except (exceptions.NotAuthenticated, exceptions.AuthenticationFailed) as error:
                return _unauthenticated(error)
            except (DatabaseError, InterfaceError) as error:
                # Asked here, in the thread whose query failed, before its connection is given
                # back: an unreachable database is 503 `unavailable` (docs/decisions/0078, 0086).
                return _database_failed(error)
            finally:
                connections.close_all()

        refusal: HttpResponse | None = await self.in_thread(check)
        return refusal

    async def read_body_bounded(self, scope: Any, receive: Any) -> tuple[io.BytesIO, bool]:
        """The body, read on the event loop into memory (never a file), and whether it was left
        unread. One declared larger than Django would ever accept is not read at all (the view
        refuses it from its Content-Length: 403 or 413, as under gthread, and the connection
        closes after); one that grows beyond the limit while it arrives (chunked) is cut there:
        BodyTooLarge after at most the limit plus one read buffer."""
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return io.BytesIO(), True
        body = io.BytesIO()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestAborted()
            body.write(message.get("body", b""))
            if body.tell() > limit:
                raise BodyTooLarge
            if not message.get("more_body", False):
                break
        body.seek(0)
        return body, False

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await wakeups.hub().stop()
                self.executor.shutdown(wait=False)
                self.receive_executor.shutdown(wait=False)
                self.hot_executor.shutdown(wait=False)
                await send({"type": "lifespan.shutdown.complete"})
                return


def _content_length(scope: Any) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _junk_refused(scope: Any) -> HttpResponse | None:
    """An API request whose token is one found bad recently (401), or from an address past its
    failed authentications with a token this process does not know as good (429), answered on
    the event loop: no thread, no Redis, no Postgres (docs/decisions/0038)."""
    if not scope["path"].startswith("/api/"):
        return None
    try:
        raw = auth.bearer_of(_header(scope, b"authorization"))
        if raw is None:
            return None
        auth.refuse_early(hash_token(raw), auth.client_address(scope))
    except exceptions.Throttled as error:
        return _throttled(error)
    except exceptions.AuthenticationFailed as error:
        return _unauthenticated(error)
    return None


def _throttled(error: exceptions.Throttled) -> HttpResponse:
    wait = retry_after_seconds(getattr(error, "wait", None))
    answer = HttpResponse(
        json.dumps(error_body("throttled", str(error.detail), {"retry_after": wait})),
        status=429,
        content_type="application/json",
    )
    answer["Retry-After"] = str(wait)
    return answer


def _unauthenticated(error: exceptions.APIException) -> HttpResponse:
    answer = HttpResponse(
        json.dumps(error_body("unauthenticated", str(error.detail))),
        status=401,
        content_type="application/json",
    )
    answer["WWW-Authenticate"] = 'Bearer realm="txhub"'
    return answer


def _header(scope: Any, name: bytes) -> bytes:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value)
    return b""


def _large_or_unbounded(scope: Any) -> bool:
    """A body sent in chunks (no length known before it is read) or declared larger than the
    lean door's bodies (views.LARGE_BODY_BYTES)."""
    if b"chunked" in _header(scope, b"transfer-encoding").lower():
        return True
    declared = _content_length(scope)
    return declared is not None and declared > views.LARGE_BODY_BYTES


def _with_length(scope: Any, body_file: io.BytesIO) -> Any:
    """A chunked body, once read, with the length it turned out to have: Django reads as much
    of the body as CONTENT_LENGTH says (none, without it), as under a WSGI server that
    de-chunks. The scope itself is left as uvicorn made it."""
    if _content_length(scope) is not None or not _header(scope, b"transfer-encoding"):
        return scope
    headers = [
        (name, value)
        for name, value in scope.get("headers", [])
        if name.lower() not in (b"transfer-encoding", b"content-length")
    ]
    headers.append((b"content-length", str(body_file.getbuffer().nbytes).encode()))
    return {**scope, "headers": headers}


def _closing(response: HttpResponse) -> HttpResponse:
    """The answer, and the connection closes after it: what is left of the body is not read."""
    response["Connection"] = "close"
    return response


def _database_failed(error: Exception) -> HttpResponse:
    """A database error met before DRF's request cycle, answered by the API's one exception
    handler (apps/broker/api/errors.py): 503 `unavailable` with Retry-After when the database
    could not be reached, else the contract's 500 `internal_error` (it logs either)."""
    rendered = rendered_error(error)
    if rendered is None:
        body = json.dumps(internal_error_body())
        return HttpResponse(body, status=500, content_type="application/json")
    status, body_bytes, headers = rendered
    answer = HttpResponse(body_bytes, status=status, content_type="application/json")
    for name, value in headers.items():
        answer[name] = value
    return answer


def _too_large() -> HttpResponse:
    body = error_body(
        "payload_too_large", "The request body is too large: a message body has at most 4 MiB."
    )
    return HttpResponse(json.dumps(body), status=413, content_type="application/json")

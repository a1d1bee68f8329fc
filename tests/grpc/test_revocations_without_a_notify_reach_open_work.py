"""A revocation no NOTIFY announces (one made behind txhub's back, or one whose time has come)
still ends what the token holds open: the wake-up hub's fallback check asks which watched tokens
are revoked by now (docs/decisions/0034, 0108). A revocation scheduled for later is not one yet:
its token's stream stays open through the same checks. Over the real gRPC server."""

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub

from apps.broker.models import ApiToken
from tests.grpc.conftest import GrpcServer
from tests.support.grpc import Telemetry, signed

pytestmark = pytest.mark.e2e


def test_a_past_revocation_closes_its_stream_and_a_scheduled_one_does_not_yet(
    grpc_server: GrpcServer, rocketmq_setup: Any, stub: MessagingServiceStub
) -> None:
    past, scheduled = rocketmq_setup("-past"), rocketmq_setup("-scheduled")
    past_stream = Telemetry(stub, signed(grpc_server, past, "past-host@1@0@producer"))
    scheduled_stream = Telemetry(
        stub, signed(grpc_server, scheduled, "scheduled-host@1@0@producer")
    )
    try:
        assert past_stream.settings(past.topic).status.code == pb.Code.OK
        assert scheduled_stream.settings(scheduled.topic).status.code == pb.Code.OK
        # No NOTIFY and no new configuration epoch: only the hub's check sees these. The
        # scheduled one first, so every check that sees the past one sees it too.
        now = timezone.now()
        ApiToken.objects.filter(pk=scheduled.token_id).update(revoked_at=now + timedelta(hours=1))
        ApiToken.objects.filter(pk=past.token_id).update(revoked_at=now - timedelta(seconds=1))
        last = past_stream.next()  # within WAIT: many fallback periods
        assert last is not None, "the revoked token's stream ended without saying why"
        assert last.status.code == pb.Code.UNAUTHORIZED, last
        assert past_stream.next() is None, "the revoked token's stream is still open"
        # The check that closed it ran after both revocations were written, and passed over the
        # one scheduled for later: that stream still answers.
        assert scheduled_stream.settings(scheduled.topic).status.code == pb.Code.OK
    finally:
        past_stream.close()
        scheduled_stream.close()

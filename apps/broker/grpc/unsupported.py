"""RPCs txhub does not serve: the protocol's UNSUPPORTED code with a sentence saying what to use
instead, never gRPC's bare UNIMPLEMENTED (which the clients report as a transport failure)."""

from collections.abc import AsyncIterator
from typing import Any

from apps.broker.grpc.protocol import Code, rpc, status

OFFSETS = "Offsets are not supported: txhub keeps consumer offsets itself."
UNSUPPORTED = {
    "PullMessage": "PullMessage (offsets) is not supported: txhub keeps consumer offsets itself; "
    "use a SimpleConsumer or PushConsumer.",
    "UpdateOffset": OFFSETS,
    "GetOffset": OFFSETS,
    "QueryOffset": OFFSETS,
    "SyncLiteSubscription": "Lite topics are not supported by txhub.",
}


class UnsupportedRpcs:
    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield rpc.PullMessageResponse(status=status(Code.UNSUPPORTED, UNSUPPORTED["PullMessage"]))

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        return rpc.UpdateOffsetResponse(
            status=status(Code.UNSUPPORTED, UNSUPPORTED["UpdateOffset"])
        )

    async def GetOffset(self, request: Any, context: Any) -> Any:
        return rpc.GetOffsetResponse(status=status(Code.UNSUPPORTED, UNSUPPORTED["GetOffset"]))

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        return rpc.QueryOffsetResponse(status=status(Code.UNSUPPORTED, UNSUPPORTED["QueryOffset"]))

    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        return rpc.SyncLiteSubscriptionResponse(
            status=status(Code.UNSUPPORTED, UNSUPPORTED["SyncLiteSubscription"])
        )

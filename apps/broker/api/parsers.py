from typing import Any

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class LimitedJSONParser(JSONParser):
    """JSON, refusing before reading a body that cannot hold a valid message.

    A 4 MiB body in base64 plus 16 KiB of metadata fits in 6 MiB of JSON; DRF reads the request
    stream itself, so Django's DATA_UPLOAD_MAX_MEMORY_SIZE would not stop it.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        request = (parser_context or {}).get("request")
        if request is not None:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
            if length > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
                raise PayloadTooLarge(
                    f"The request body is {length} bytes; a message body has at most "
                    f"{settings.TXHUB_MAX_BODY_BYTES} bytes."
                )
        return super().parse(stream, media_type, parser_context)

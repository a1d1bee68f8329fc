from typing import Any

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def content_length(request: Any) -> int:
    """The request's declared body size (0 when absent or not a number)."""
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except (TypeError, ValueError):
        return 0


class LimitedJSONParser(JSONParser):
    """JSON, refusing before reading a body that cannot hold a valid message.

    A 4 MiB body in base64 plus 16 KiB of metadata fits in 6 MiB of JSON; DRF reads the request
    stream itself, so Django's DATA_UPLOAD_MAX_MEMORY_SIZE would not stop it.

    Every API body is a JSON object: a list, a number or null is a 400 here, once, rather than
    in each view. Nesting too deep for Python's parser (RecursionError: `[[[[...` 100,000 deep)
    is a 400 too; nothing the API takes is nested more than two levels, so no valid body is
    anywhere near that depth.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        request = (parser_context or {}).get("request")
        if request is not None:
            length = content_length(request)
            if length > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
                raise PayloadTooLarge(
                    f"The request body is {length} bytes; a message body has at most "
                    f"{settings.TXHUB_MAX_BODY_BYTES} bytes."
                )
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError(
                "The body is not valid JSON: it is nested too deeply."
            ) from None
        except exceptions.ParseError as error:
            raise exceptions.ParseError(f"The body is not valid JSON: {error.detail}") from None
        if not isinstance(data, dict):
            raise exceptions.ParseError("The body must be a JSON object ({...}).")
        return data

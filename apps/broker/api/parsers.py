import json
from typing import Any

from django.conf import settings
from django.http import QueryDict
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser
from rest_framework.utils.json import strict_constant

from apps.broker.services.errors import BrokerError, invalid


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
    anywhere near that depth. A key given twice in one object is a 400 naming it (_object).
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
            data = self._load(stream, parser_context)
        except RecursionError:
            raise exceptions.ParseError(
                "The body is not valid JSON: it is nested too deeply."
            ) from None
        except exceptions.ParseError as error:
            raise exceptions.ParseError(f"The body is not valid JSON: {error.detail}") from None
        if not isinstance(data, dict):
            raise exceptions.ParseError("The body must be a JSON object ({...}).")
        return data

    def _load(self, stream: Any, parser_context: Any) -> Any:
        """DRF's JSONParser.parse (strict: no NaN), with every object built by _object."""
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return _decoder.decode(stream.read().decode(encoding))
        except LookupError:  # a charset that is not a text encoding (bz2_codec, rot13)
            raise exceptions.ParseError("The body's charset is not a text encoding.") from None
        except ValueError as error:  # UnicodeDecodeError included, as in DRF's
            raise exceptions.ParseError(f"JSON parse error - {error}") from None


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice: JSON's own loaders keep the last one, so
    {"producer_group": "a", "producer_group": "b"} would be read as "b" where another reader
    (a proxy, an audit) sees "a". Decision 0004: input is strict."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise repeated(key, "The JSON body")
            seen.add(key)
    return data


def repeated(key: str, where: str) -> BrokerError:
    return invalid(key, f"{where} gives {key!r} more than once.")


def single_valued(query: QueryDict) -> dict[str, str]:
    """A request's query parameters, each given at most once (400 naming the first repeated
    one): as for a JSON key, a repeated parameter is refused rather than read as its last
    value (decision 0004)."""
    single: dict[str, str] = {}
    for key, values in query.lists():
        if len(values) > 1:
            raise repeated(key, "The query")
        single[key] = values[0]
    return single


# Built once: json.loads with any keyword builds a new decoder per call.
_decoder = json.JSONDecoder(parse_constant=strict_constant, object_pairs_hook=_object)

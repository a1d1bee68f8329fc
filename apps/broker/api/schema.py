"""drf-spectacular, taught txhub's ways: the bearer token scheme, the error envelope on every
error answer, and fields that are present only sometimes (exactly one of body / body_base64).

Precise on purpose: the fuzz test (tests/test_fuzz_api.py) checks every answer against it."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from drf_spectacular.utils import OpenApiResponse

ERROR_DESCRIPTIONS = {
    400: "invalid_request: the input breaks a rule; details name the field",
    401: "unauthenticated: no token, or an unknown or revoked one",
    403: "forbidden: the token has no scope for this group",
    404: "not_found: no such topic, group or id (or another group's)",
    409: "conflict / transaction_resolved",
    413: "payload_too_large",
    429: "throttled",
    503: "unavailable: the database (or, for a configuration change, Redis) is unreachable; "
    "nothing was changed; try again",
}


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.broker.api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> Any:
        return build_bearer_security_scheme_object(
            header_name="Authorization",
            token_prefix="Bearer",  # noqa: S106 - not a secret
        )


class AutoSchema(SpectacularAutoSchema):
    def _error_codes(self) -> set[int]:
        codes = {401, 403, 404, 429, 503}
        # Every POST/PATCH declares its body (request=None: none); GET has none to guess.
        if self.method in {"POST", "PATCH"} and self.get_request_serializer() is not None:
            codes |= {400, 413}
        if self.method == "GET" and self._get_paginator() is not None:
            codes.add(400)
        return codes

    def _get_response_bodies(self, direction: Any = "response") -> Any:
        from apps.broker.api.output import ErrorOut

        responses = super()._get_response_bodies(direction)
        declared = {int(code) for code in responses if code.isdigit() and int(code) >= 400}
        for code in sorted(declared | self._error_codes()):
            error = OpenApiResponse(ErrorOut, description=ERROR_DESCRIPTIONS.get(code, ""))
            responses[str(code)] = self._get_response_for_code(error, str(code), None, direction)
        return responses

    def _map_basic_serializer(self, serializer: Any, direction: Any) -> Any:
        from apps.broker.api.serializers import StrictSerializer

        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False  # unknown fields are a 400
        optional = set(getattr(serializer, "optional_fields", ()))
        if optional and "required" in schema:
            schema["required"] = [name for name in schema["required"] if name not in optional]
        return schema

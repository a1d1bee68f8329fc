"""drf-spectacular, taught txhub's ways: the bearer token scheme, the error envelope on every
error answer, fields that are present only sometimes (exactly one of body / body_base64), and
every limit an input field checks (apps/broker/limits.py; docs/decisions/0045).

Precise on purpose: the fuzz tests (tests/test_fuzz_api.py)
check every answer against it, and that the API takes every request it describes."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.plumbing import build_bearer_security_scheme_object, force_instance
from drf_spectacular.utils import OpenApiResponse

ERROR_DESCRIPTIONS = {
    400: "invalid_request: the input breaks a rule; details name the field",
    401: "unauthenticated: no token, or an unknown or revoked one",
    403: "forbidden: the token has no scope for this group; quota_exceeded: a send or prepare "
    "of a producer group that keeps its storage quota's worth of messages",
    404: "not_found: no such topic, group or id (or another group's)",
    409: "conflict / transaction_resolved",
    413: "payload_too_large",
    429: "throttled",
    500: "internal_error: a bug, or a query of this request that failed (a statement timeout, a "
    "deadlock), not an outage; it is logged",
    503: "unavailable: the database (or, for a configuration change, Redis) is unreachable; "
    "nothing was changed; try again after its Retry-After (seconds)",
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
        codes = {401, 403, 404, 429, 500, 503}
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

    def _map_serializer_field(
        self, field: Any, direction: Any, bypass_extensions: bool = False
    ) -> Any:
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        extra = getattr(field, "schema_extra", None)
        if extra:  # what an input field checks beyond DRF's kwargs (api/fields.Stated)
            schema = {**schema, **extra}
            schema = {key: value for key, value in schema.items() if value is not None}
        return schema

    def _insert_field_validators(self, field: Any, schema: Any) -> None:
        super()._insert_field_validators(field, schema)
        extra = getattr(field, "schema_extra", None)
        if extra is None:
            return
        if "oneOf" in schema:
            # drf-spectacular offers "" beside a pattern when DRF allows blank; a stated field's
            # pattern and minLength already say whether "" is taken (a blank body is not).
            schema.update(schema.pop("oneOf")[0])
        for key in [key for key, value in extra.items() if value is None]:
            schema.pop(key, None)  # e.g. URLValidator's `format: uri`, wider than the pattern

    def _get_request_for_media_type(self, serializer: Any, direction: Any = "request") -> Any:
        from apps.broker.api.serializers import StrictSerializer

        if self.method != "PATCH" or not isinstance(force_instance(serializer), StrictSerializer):
            return super()._get_request_for_media_type(serializer, direction)
        # Our PATCH validates its body whole (views.validated), not as DRF's partial update:
        # the schema requires what the serializer requires.
        self.method = "PUT"
        try:
            return super()._get_request_for_media_type(serializer, direction)
        finally:
            self.method = "PATCH"

    def _map_basic_serializer(self, serializer: Any, direction: Any) -> Any:
        from apps.broker.api.serializers import StrictSerializer

        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False  # unknown fields are a 400
            schema.update(getattr(serializer, "schema_rules", {}))  # rules across fields
        optional = set(getattr(serializer, "optional_fields", ()))
        if optional and "required" in schema:
            schema["required"] = [name for name in schema["required"] if name not in optional]
        return schema

"""The API's input fields: strict JSON types, checked by apps/broker/limits.py, and stating in
the OpenAPI schema what they check (docs/decisions/0045)."""

from typing import Any

from django.core.validators import URLValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.broker import limits


def _strict_text(value: str) -> str:
    try:
        return limits.check_text(value)
    except limits.LimitError as error:
        raise serializers.ValidationError(str(error)) from None


class Stated:
    """A field that states more of its rule in the OpenAPI schema than DRF's own kwargs say:
    `schema_extra` is merged into its schema (api/schema.py; a None value removes the key).
    The values come from apps/broker/limits.py, as the checks do (docs/decisions/0045)."""

    schema_extra: dict[str, Any]

    def _stated(self, schema: dict[str, Any] | None, **extra: Any) -> None:
        self.schema_extra = {**{k: v for k, v in extra.items() if v is not None}, **(schema or {})}


class StrictCharField(Stated, serializers.CharField):
    """A JSON string only (DRF's CharField would turn 12 into "12"); never a character Postgres
    cannot store (NUL, a lone surrogate): limits.check_text, the one check for every string.
    `pattern` is what the schema states (by default: no NUL)."""

    def __init__(
        self,
        *,
        pattern: str | None = limits.TEXT_SCHEMA_PATTERN,
        schema: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._stated(schema, pattern=pattern)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(_strict_text(data)))


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only: no "4", no 4.5, no true; never above limits.MAX_INT."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_value", limits.MAX_INT)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictListField(Stated, serializers.ListField):
    """A JSON list, its length checked before any element (OWASP API4: a 1,000,000-element list
    costs nothing to refuse), and refused at its first bad element (DRF's ListField validates
    every element and reports each one)."""

    def __init__(
        self, *, max_length: int, schema: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self._stated(schema, minItems=None if kwargs.get("allow_empty", True) else 1)
        super().__init__(max_length=max_length, **kwargs)

    def to_internal_value(self, data: Any) -> list[Any]:
        if not isinstance(data, list):
            self.fail("not_a_list", input_type=type(data).__name__)
        if not self.allow_empty and not data:
            self.fail("empty")
        if self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        result = []
        for index, item in enumerate(data):
            try:
                result.append(self.child.run_validation(item))
            except serializers.ValidationError as error:
                raise serializers.ValidationError({str(index): error.detail}) from None
        return result


class StrictDictField(Stated, serializers.DictField):
    """A JSON object of strings: its size checked first, every key through the same string check
    as every value (DRF's DictField checks values only), refused at the first bad entry."""

    def __init__(
        self, *, max_size: int, schema: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self.max_size = max_size
        self._stated(schema)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.fail("not_a_dict", input_type=type(data).__name__)
        if len(data) > self.max_size:
            raise serializers.ValidationError(f"At most {self.max_size} entries are accepted.")
        result = {}
        for key, value in data.items():
            try:
                limits.check_text(key)
            except limits.LimitError as error:
                raise serializers.ValidationError(f"A name: {error}") from None
            try:
                result[key] = self.child.run_validation(value)
            except serializers.ValidationError as error:
                raise serializers.ValidationError({key: error.detail}) from None
        return result


class UrlField(StrictCharField):
    """A URL txhub can call: Django's URLValidator and limits.check_url (port, host)."""

    def __init__(self, **kwargs: Any) -> None:
        # The schema states a pattern, not URLValidator's `format: uri` (a wider set).
        super().__init__(
            max_length=limits.MAX_URL_CHARS,
            pattern=limits.CHECK_URL_SCHEMA_PATTERN,
            schema={"format": None},
            **kwargs,
        )
        self.validators.append(URLValidator(schemes=["http", "https"]))

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        try:
            return limits.check_url(value)
        except limits.LimitError as error:
            raise serializers.ValidationError(str(error)) from None


@extend_schema_field(
    {
        "type": "string",
        "pattern": f"^{limits.NAME_PATTERN}$",
        "minLength": 1,
        "maxLength": limits.MAX_NAME_CHARS,
        "not": {"pattern": limits.RESERVED_SCHEMA_PATTERN},
    }
)
class NameField(StrictCharField):
    def __init__(self, what: str, **kwargs: Any) -> None:
        self.what = what
        super().__init__(trim_whitespace=False, pattern=None, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        try:
            return limits.check_name(value, what=self.what)
        except limits.LimitError as error:
            raise serializers.ValidationError(str(error)) from None


class StrictBooleanField(serializers.BooleanField):
    """A JSON true or false only (DRF's BooleanField would also take "yes", 1 and "on")."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictUUIDField(serializers.UUIDField):
    """A UUID written as a JSON string (DRF's UUIDField would also take an integer)."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid", value="(not a string)")
        return super().to_internal_value(_strict_text(data))


class QueryIntegerField(serializers.IntegerField):
    """A query-string integer: ASCII digits only (int() also takes "１" and "1_000"), at most
    limits.MAX_INT, so a 20-digit value is a 400 and not an overflow in a query."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_value", limits.MAX_INT)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if not isinstance(data, str) or not data.isascii() or not data.isdigit():
            self.fail("invalid")
        if len(data) > 12:
            self.fail("max_value", max_value=self.max_value)
        return int(super().to_internal_value(data))

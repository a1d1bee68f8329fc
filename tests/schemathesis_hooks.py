"""Schemathesis hooks: the rules no OpenAPI schema can state (docs/decisions/0045).

Every limit the API checks on the shape of a request is in the schema (apps/broker/limits.py),
and `positive_data_acceptance` holds it to that: a request the schema allows must not be a 400.
A few 400s depend on something other than the request itself, and only those are set aside here,
each recognised by the API's own message:

- `deliver_at` more than TXHUB_MAX_DELAY ahead (or behind), or outside the years a UTC time can
  have: relative to the database clock at the time of the call;
- a `check_url` whose host does not resolve, or resolves to an address that is not allowed:
  known only when the name is looked up (services/callbacks.callback_url_check);
- a receipt handle that is expired or unknown (change-invisible): the state of a delivery;
- keys, tags and properties over TXHUB_MAX_META_BYTES in all: a sum of UTF-8 lengths across
  fields (each field's own bound is in the schema);
- an integer written as `1.0`: JSON Schema 2020-12 (OpenAPI 3.1) counts it as an integer, the
  API takes JSON integers only (api/fields.StrictIntegerField), and no keyword tells them apart.

A case whose body is not in fact schema-valid (Schemathesis's stateful phase fills bodies from
earlier answers, e.g. an error envelope into a PATCH body) is not a positive case either.

One workaround for Schemathesis itself (pinned): its coverage phase folds a string's length bounds
into its pattern without the check its schema converter makes, that the validator's regex engine
can compile the result. The message body's bound folds into a repetition that engine refuses,
slowly, for every schema that holds it. `_fold_lengths` keeps such a pattern and its bounds as
they are, as the converter does (docs/decisions/0065).

Used by tests/test_fuzz_api.py, and by hand:
`SCHEMATHESIS_HOOKS=tests.schemathesis_hooks schemathesis run ... --checks all`."""

from typing import Any

import schemathesis
from schemathesis.core.jsonschema.patterns import is_valid_jsonschema_rs_regex, update_quantifier
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.coverage import _operation as coverage_operation

NOT_STATABLE = (
    "TXHUB_MAX_DELAY",
    "The time is out of range.",
    "does not resolve",
    "which is not an allowed address",
    "The receipt handle is expired or unknown.",
    "Keys, tags and properties take",
    "A valid integer is required.",  # on a schema-valid body: only an integral float
)


def _fold_lengths(pattern: str, min_length: int | None, max_length: int | None) -> str:
    """The coverage phase's length folding, kept only when the validator can compile it."""
    folded = update_quantifier(pattern, min_length, max_length)
    return folded if folded == pattern or is_valid_jsonschema_rs_regex(folded) else pattern


# The workaround replaces the name the coverage phase reads; if an upgrade renames or moves it,
# importing the hooks fails instead of leaving the workaround unused (docs/decisions/0065).
_COVERAGE = vars(coverage_operation)
if _COVERAGE.get("update_quantifier") is not update_quantifier:
    raise RuntimeError("Schemathesis moved the coverage phase's update_quantifier: see 0065.")
_COVERAGE["update_quantifier"] = _fold_lengths


def _not_statable(message: str) -> bool:
    return any(phrase in message for phrase in NOT_STATABLE)


def _sentences(details: Any) -> list[str]:
    """Every sentence of an error's details (a truncated "..." is no sentence)."""
    if isinstance(details, dict):
        return [text for value in details.values() for text in _sentences(value)]
    if isinstance(details, list):
        return [text for value in details for text in _sentences(value)]
    return [] if details == "..." else [str(details)]


def _schema_valid_body(case: Any) -> bool:
    if case.body is None or not case.operation.body:
        return True
    body = case.operation.get_body_for_media_type(case.media_type or "application/json")
    return body is None or bool(body.is_valid(case.body))


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """False sets a failure aside: only a schema-valid request refused for a rule the schema
    cannot state (above)."""
    if not isinstance(failure, RejectedPositiveData):
        return True
    if not _schema_valid_body(case):
        return False
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return True
    sentences = [str(error.get("message", "")), *_sentences(error.get("details"))]
    return not all(_not_statable(sentence) for sentence in sentences)

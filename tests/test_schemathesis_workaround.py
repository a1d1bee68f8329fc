"""The one workaround tests/schemathesis_hooks.py makes for Schemathesis itself (decision 0065):
the coverage phase still folds a string's length bounds into its pattern wherever the validator
can compile the result, and leaves the pattern alone where it cannot (the message body's).

Importing the hooks registers their `filter_failure` in this test process too. It sets aside only
`positive_data_acceptance` failures, a check the in-process fuzz tests (tests/test_fuzz_api.py)
do not run, so a worker that runs both files tests the same."""

from django.conf import settings
from schemathesis.core.jsonschema.patterns import is_valid_jsonschema_rs_regex, update_quantifier
from schemathesis.specs.openapi.coverage import _operation as coverage_operation

from apps.broker.limits import TEXT_SCHEMA_PATTERN
from apps.broker.models import ApiToken
from tests import schemathesis_hooks


def test_the_coverage_phase_folds_through_the_workaround() -> None:
    assert vars(coverage_operation)["update_quantifier"] is schemathesis_hooks._fold_lengths


def test_a_fold_the_validator_can_compile_is_kept() -> None:
    name_chars = ApiToken._meta.get_field("name").max_length  # a token's name: a text field
    folded = schemathesis_hooks._fold_lengths(TEXT_SCHEMA_PATTERN, 1, name_chars)
    assert folded != TEXT_SCHEMA_PATTERN
    assert folded == update_quantifier(TEXT_SCHEMA_PATTERN, 1, name_chars)


def test_the_bodys_bounds_stay_beside_its_pattern() -> None:
    body_chars = settings.TXHUB_MAX_BODY_BYTES
    # What Schemathesis would use without the workaround: a pattern its validator refuses. This
    # fails if an upgrade folds it differently; it does not see a fix in the coverage phase itself,
    # so an upgrade of the pin reads that code again (docs/decisions/0065).
    unguarded = update_quantifier(TEXT_SCHEMA_PATTERN, 1, body_chars)
    assert unguarded != TEXT_SCHEMA_PATTERN
    assert not is_valid_jsonschema_rs_regex(unguarded)
    assert schemathesis_hooks._fold_lengths(TEXT_SCHEMA_PATTERN, 1, body_chars) == (
        TEXT_SCHEMA_PATTERN
    )

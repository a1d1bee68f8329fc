"""A console URL that matches no page (an upper-case or dash-less id where a transaction id goes, a
typo) answers the console's own not-found page, HTML and 404, while an unmatched API URL keeps the
contract's JSON error (docs/decisions/0092)."""

import json

import pytest

from apps.broker.models import HalfMessage
from tests.support.console import login


@pytest.mark.parametrize(
    "path",
    [
        "/console/transactions/{upper}/",
        "/console/transactions/{bare}/",
        "/console/transactoins/",
        "/console/tokens/abc/revoke/",
    ],
)
def test_an_unmatched_console_url_is_the_consoles_not_found_page(
    half: HalfMessage, path: str
) -> None:
    otto = login("txhub-operators", "otto")
    url = path.format(upper=str(half.transaction_id).upper(), bare=half.transaction_id.hex.upper())
    response = otto.get(url)
    assert response.status_code == 404, url
    assert response["Content-Type"].startswith("text/html"), url
    page = response.content.decode()
    assert "There is no such" in page, url
    assert 'href="/console/transactions/"' in page, url  # the console's navigation
    # The positive control: the same transaction at its own URL.
    assert otto.get(f"/console/transactions/{half.transaction_id}/").status_code == 200


def test_an_unmatched_api_url_keeps_the_contracts_json_error(half: HalfMessage) -> None:
    otto = login("txhub-operators", "otto")
    response = otto.get(f"/api/v1/transactoins/{half.transaction_id}")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert json.loads(response.content)["error"]["code"] == "not_found"

"""The console's navigation lists only pages the signed-in user may open: none for a user in no
txhub group, who still sees who is signed in and may sign out, on the refusal (403) and
not-found (404) pages alike; every reading page for a viewer, and the audit record for an
operator (docs/decisions/0103 and 0114)."""

from django.test import Client
from django.urls import reverse

from tests.support.console import login

READING_PAGES = [
    "overview",
    "transactions",
    "delayed",
    "topics",
    "producer-groups",
    "consumer-groups",
    "tokens",
    "reconciliations",
]


def header_of(client: Client, path: str, status: int) -> str:
    response = client.get(path)
    assert response.status_code == status, (path, response.status_code)
    page: str = response.content.decode()
    return page.split("<header>", 1)[1].split("</header>", 1)[0]


def links_in(header: str) -> set[str]:
    every = {name: reverse(f"console:{name}") for name in [*READING_PAGES, "audit"]}
    return {name for name, url in every.items() if f'href="{url}"' in header}


def test_a_user_in_no_txhub_group_sees_no_page_to_open_on_a_refusal_or_a_not_found(
    db: None,
) -> None:
    nobody = login(None, "nobody")
    for path, status in [("/console/transactions/", 403), ("/console/no-such-page/", 404)]:
        header = header_of(nobody, path, status)
        assert links_in(header) == set(), path
        assert "nobody" in header, path  # who is signed in
        assert reverse("console:logout") in header, path  # and a way out


def test_a_viewer_sees_the_reading_pages_and_an_operator_the_audit_record_too(db: None) -> None:
    viewer, operator = login("txhub-viewers", "vera"), login("txhub-operators", "otto")
    for path, status in [("/console/audit/", 403), ("/console/no-such-page/", 404)]:
        assert links_in(header_of(viewer, path, status)) == set(READING_PAGES), path
    for path, status in [("/console/", 200), ("/console/no-such-page/", 404)]:
        assert links_in(header_of(operator, path, status)) == {*READING_PAGES, "audit"}, path

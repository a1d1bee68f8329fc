"""A form page shown again with its errors has a "Back" that works without JavaScript: a real link
to the page the form was on (its own URL takes POST only), computed on the server
(docs/decisions/0103)."""

import re

import pytest

from apps.broker.models import HalfMessage
from apps.broker.services import registry
from tests.support.console import login


@pytest.mark.parametrize(
    ("path", "data", "back"),
    [
        ("/console/topics/new/", {"name": "bad name!", "queues": "1"}, "/console/topics/"),
        (
            "/console/producer-groups/new/",
            {"name": "bad name!"},
            "/console/producer-groups/",
        ),
        (
            "/console/consumer-groups/billing/edit/",
            {"max_delivery_attempts": "0"},
            "/console/consumer-groups/billing/",
        ),
        ("/console/tokens/new/", {"name": "", "scopes": "nonsense"}, "/console/tokens/"),
    ],
)
def test_back_on_a_form_page_links_to_the_page_the_form_was_on(
    half: HalfMessage, path: str, data: dict[str, str], back: str
) -> None:
    registry.consumer_group_create(name="billing", max_delivery_attempts=3, consume_from="last")
    otto = login("txhub-operators", "otto")
    page = otto.post(path, data)
    assert page.status_code == 200, path
    html = page.content.decode()
    assert 'class="errorlist' in html, path  # the form again, with its errors
    links = re.findall(r'<a href="([^"]*)"[^>]*>Back</a>', html)
    assert links == [back], (path, links)
    assert "data-back" not in html, path
    # Followed without any script: the page the form was on.
    assert otto.get(links[0]).status_code == 200, path
    # What the old empty link did: ask this page's own URL again, which takes POST only.
    assert otto.get(path).status_code == 405, path

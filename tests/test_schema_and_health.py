"""The OpenAPI schema documents the API; the docs page works offline; health probes answer."""

import re
from typing import Any

import yaml
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver


def api_paths() -> set[str]:
    resolver = get_resolver()
    paths: set[str] = set()

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith("api/v1/"):
                paths.add("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route))

    walk(resolver.url_patterns, "")
    return paths


def test_the_schema_documents_every_api_path(db: None) -> None:
    response = Client().get("/api/schema/")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    assert schema["openapi"].startswith("3.")
    assert set(schema["paths"]) == api_paths()
    assert schema["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


def test_the_docs_page_loads_nothing_from_the_internet(db: None) -> None:
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    external = re.findall(r"""(?:src|href)=["'](https?://[^"']+)""", html)
    assert external == []
    assert "swagger-ui" in html
    static = re.findall(r"""(?:src|href)=["'](/static/[^"']+)""", html)
    assert static, html
    for path in static:
        assert Client().get(path).status_code == 200, path


def test_healthz_and_readyz_answer_json(db: None) -> None:
    assert Client().get("/healthz").json() == {"status": "ok"}
    ready = Client().get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"postgres": "ok", "redis": "ok"}


def test_the_committed_schema_is_up_to_date(db: None) -> None:
    """docs/openapi.yaml moves with the code: regenerate it with `make schema`."""
    from pathlib import Path

    committed = yaml.safe_load((Path(__file__).parent.parent / "docs" / "openapi.yaml").read_text())
    served = yaml.safe_load(Client().get("/api/schema/").content)
    assert committed == served

"""The "Production" settings of docs/operations.md, for running behind a TLS proxy (cookies, HSTS,
redirect and the proxy's header), as environment variables."""

BEHIND_A_TLS_PROXY = {
    "TXHUB_SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    "TXHUB_SECURE_COOKIES": "1",
    "TXHUB_SSL_REDIRECT": "1",
    "TXHUB_HSTS_SECONDS": "31536000",
    "TXHUB_HSTS_INCLUDE_SUBDOMAINS": "1",
    "TXHUB_HSTS_PRELOAD": "1",
}

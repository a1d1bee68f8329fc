"""A self-signed certificate for a TLS server of the test's own, made by the openssl command."""

import ipaddress
import subprocess
from pathlib import Path


def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) in `folder`, naming `name` (a host name or an IP address) in its
    subject and its subjectAltName; valid for a day, vouched for by no CA."""
    try:
        ipaddress.ip_address(name)
        alt_name = f"IP:{name}"
    except ValueError:
        alt_name = f"DNS:{name}"
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", f"/CN={name}", "-addext", f"subjectAltName={alt_name}",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key

"""TLS credentials and bearer tokens from the `services:` section.

Tokens come from a file or an environment variable, never from the YAML in clear, and are
compared in constant time. Loopback without TLS or auth stays the zero-config default.
"""

from __future__ import annotations

import hmac
import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

from services.common.config.services import AuthConfig, TLSConfig
from services.common.errors import ConfigError


def load_token(auth: AuthConfig) -> str | None:
    """The bearer token, or None when auth is off."""
    if auth.token_file:
        try:
            token = Path(auth.token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read token file: {exc}", field="services.auth.token_file") from exc
        if not token:
            raise ConfigError("token file is empty", field="services.auth.token_file")
        return token
    if auth.token_env:
        token = os.environ.get(auth.token_env, "").strip()
        if not token:
            raise ConfigError(
                f"environment variable {auth.token_env} is unset or empty", field="services.auth.token_env"
            )
        return token
    return None


def tokens_match(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _read(path: str | None, field: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}", field=f"services.tls.{field}") from exc


def server_credentials(tls: TLSConfig) -> grpc.ServerCredentials | None:
    """Server TLS (or mTLS when require_client_cert) credentials, or None for plaintext."""
    if tls.cert_file is None:
        return None
    import grpc

    cert, key = _read(tls.cert_file, "cert_file"), _read(tls.key_file, "key_file")
    if key is None or cert is None:
        raise ConfigError("key_file is required with cert_file", field="services.tls.key_file")
    ca = _read(tls.ca_file, "ca_file")
    if tls.require_client_cert and ca is None:
        raise ConfigError("require_client_cert needs ca_file to verify clients", field="services.tls.ca_file")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=tls.require_client_cert
    )


def channel_credentials(tls: TLSConfig) -> grpc.ChannelCredentials | None:
    """Client credentials verifying the server with ca_file (and presenting a client cert under mTLS)."""
    if not tls.enabled:
        return None
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file, "ca_file"),
        private_key=_read(tls.client_key_file, "client_key_file"),
        certificate_chain=_read(tls.client_cert_file, "client_cert_file"),
    )


def http_ssl_context(tls: TLSConfig) -> ssl.SSLContext | None:
    """Server TLS for an HTTP endpoint (the serve-mode proxy) from the same settings as gRPC's:
    cert_file + key_file turn it on; require_client_cert verifies clients against ca_file (mTLS)."""
    if tls.cert_file is None:
        return None
    if tls.key_file is None:
        raise ConfigError("key_file is required with cert_file", field="services.tls.key_file")
    if tls.require_client_cert and tls.ca_file is None:
        raise ConfigError("require_client_cert needs ca_file to verify clients", field="services.tls.ca_file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.require_client_cert:
            context.load_verify_locations(cafile=tls.ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS files: {exc}", field="services.tls.cert_file") from exc
    return context

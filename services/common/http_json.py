"""One JSON request to an OpenAI-compatible HTTP server (standard library only), its failures as the
project's errors naming the config key or flag that pointed there: an HTTP error answer is
FailedPrecondition with the server's own words, an unreachable server Unavailable."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from services.common.errors import FailedPrecondition, Unavailable


def call_json(
    base_url: str,
    path: str,
    body: dict[str, Any] | None,
    *,
    api_key: str,
    timeout: float,
    field: str,
) -> dict[str, Any]:
    """POST `body` (GET when None) to `base_url + path` and return the decoded JSON answer; a key
    other than "" or "EMPTY" goes as a bearer token."""
    headers = {"Content-Type": "application/json"}
    if api_key not in ("", "EMPTY"):
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base_url}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload: dict[str, Any] = json.loads(response.read())
            return payload
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise FailedPrecondition(f"{base_url}{path} answered HTTP {exc.code}: {detail}", field=field) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise Unavailable(f"cannot reach {base_url}{path}: {exc}", field=field) from exc

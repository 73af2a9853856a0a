"""`explorer.serve:` — limits of the OpenAI-compatible proxy of `mode: serve` (not in Trinity).

Trinity's own serve keys (proxy_port, listen_address, service_status_check_interval,
min_running_model_num, db_url) sit directly under `explorer:`, as in Trinity; these are the
proxy's guards and the session lifetime, which Trinity does not configure.
"""

from __future__ import annotations

from pydantic import Field

from services.common.config.base import Section


class ServeConfig(Section):
    session_ttl_s: float = Field(1800.0, gt=0)
    """Seconds a session may stay without a commit after its last request: then it is dropped
    (counted in the proxy's `sessions_expired`), and a committed group still waiting for its
    other sessions (algorithm.repeat_times per task id) is written with the sessions it has."""
    max_request_bytes: int = Field(4 << 20, ge=1024)
    """Largest request body, in bytes; a bigger one gets HTTP 413 and changes nothing."""
    max_concurrent_requests: int = Field(64, ge=1)
    """Completions generating at once; one more gets HTTP 429 (retryable) and changes nothing."""
    max_n: int = Field(16, ge=1)
    """Largest `n` (choices per request) a completion request may ask for."""

"""Routes of `trinity view`: a request's path and headers in, a Response out (no sockets here).

Bad input gets a page naming what was wrong and a 4xx status, never a traceback: an unknown
stage, group or id (404), a query value that is not a number (400), a file that is not a
readable SQLite database (500 naming the file). When the server needs a token (bound beyond
loopback), a request carries it as `Authorization: Bearer T`, or once as `?token=T`, which sets
a cookie and redirects to the same page without it.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from importlib import resources
from typing import Any

from services.common.errors import InvalidArgument, NotFound, TrinityError
from services.common.security import tokens_match
from services.view import pages_evals, pages_rows, pages_run, query
from services.view.html import error_page
from services.view.viewer import Viewer

COOKIE = "trinity_view_token"
STATIC = {"view.css": "text/css; charset=utf-8", "view.js": "text/javascript; charset=utf-8"}


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


def html_response(text: str, status: int = 200) -> Response:
    return Response(status, text.encode())


def json_response(data: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(data, default=str).encode(), "application/json")


Params = Mapping[str, str]


class App:
    def __init__(self, viewer: Viewer, token: str | None = None) -> None:
        self.viewer = viewer
        self.token = token
        self.routes: dict[str, Callable[[Params], Response]] = {
            "/": self.overview,
            "/steps": self.steps,
            "/experiences": self.experiences,
            "/group": self.group,
            "/experience": self.experience,
            "/evals": self.evals,
            "/api/overview": self.api_overview,
            "/api/steps": self.api_steps,
            "/api/new": self.api_new,
            "/api/experiences": self.api_experiences,
        }

    def handle(self, target: str, headers: Mapping[str, str]) -> Response:
        parts = urllib.parse.urlsplit(target)
        params = {k: v[-1] for k, v in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items()}
        denied = self._check_token(parts, params, headers)
        if denied is not None:
            return denied
        api = parts.path.startswith("/api/")
        try:
            if parts.path.startswith("/static/"):
                return self.static(parts.path.removeprefix("/static/"))
            route = self.routes.get(parts.path)
            if route is None:
                raise NotFound(f"no page {parts.path}")
            return route(params)
        except InvalidArgument as exc:
            return self._error(400, str(exc), api)
        except NotFound as exc:
            return self._error(404, str(exc), api)
        except sqlite3.DatabaseError as exc:
            return self._error(500, f"cannot read the index {self.viewer.index.path}: {exc}", api)
        except TrinityError as exc:
            return self._error(500, str(exc), api)

    def _error(self, status: int, message: str, api: bool) -> Response:
        if api:
            return json_response({"error": message}, status)
        return html_response(error_page(status, message), status)

    # ---- token --------------------------------------------------------------------------------
    def _check_token(
        self, parts: urllib.parse.SplitResult, params: Params, headers: Mapping[str, str]
    ) -> Response | None:
        if self.token is None:
            return None
        given = params.get("token")
        if given is not None:
            if not tokens_match(given, self.token):
                return html_response(error_page(403, "wrong token"), 403)
            rest = urllib.parse.urlencode({k: v for k, v in params.items() if k != "token"})
            set_cookie = f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"
            location = parts.path + (f"?{rest}" if rest else "")
            return Response(303, b"", headers={"Location": location, "Set-Cookie": set_cookie})
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = auth.removeprefix("Bearer ").strip()
        else:
            jar = SimpleCookie(headers.get("Cookie", ""))
            given = jar[COOKIE].value if COOKIE in jar else None
        if given is None:
            msg = "this viewer needs its token: open the URL `trinity view` printed (it ends in ?token=...)"
            return html_response(error_page(401, msg), 401)
        if not tokens_match(given, self.token):
            return html_response(error_page(403, "wrong token"), 403)
        return None

    # ---- pages --------------------------------------------------------------------------------
    def _stage(self, params: Params) -> Any:
        name = params.get("stage", "").strip() or self.viewer.default_stage()
        return self.viewer.run.stage(name)

    def static(self, name: str) -> Response:
        if name not in STATIC:
            raise NotFound(f"no static file {name}")
        data = (resources.files("services.view") / "static" / name).read_bytes()
        return Response(200, data, STATIC[name], {"Cache-Control": "max-age=300"})

    def overview(self, params: Params) -> Response:
        return html_response(pages_run.overview(self.viewer, self._stage(params)))

    def steps(self, params: Params) -> Response:
        return html_response(pages_run.steps_page(self.viewer, self._stage(params)))

    def evals(self, params: Params) -> Response:
        return html_response(pages_evals.evals_page(self.viewer, self._stage(params), params))

    def _filters(self, params: Params) -> tuple[Any, query.Filters]:
        stage = self._stage(params)
        return stage, query.Filters.parse(params, stage.name)

    def experiences(self, params: Params) -> Response:
        stage, filters = self._filters(params)
        return html_response(pages_rows.experiences_page(self.viewer, stage, filters))

    def group(self, params: Params) -> Response:
        group_id = params.get("id", "")
        if not group_id:
            raise InvalidArgument("give the group as ?id=GROUP_ID", field="id")
        return html_response(pages_rows.group_page(self.viewer, self._stage(params), group_id))

    def experience(self, params: Params) -> Response:
        value = params.get("id", "")
        if not value.strip().isdigit():
            raise InvalidArgument(f"id must be a whole number, got {value!r}", field="id")
        return html_response(pages_rows.experience_page(self.viewer, int(value)))

    # ---- JSON ---------------------------------------------------------------------------------
    def api_overview(self, params: Params) -> Response:
        stage = self._stage(params)
        progress = self.viewer.progress(stage)
        return json_response(
            {
                "stage": stage.name,
                "fragments": pages_run.overview_fragments(self.viewer, stage),
                "progress": progress.__dict__ | {"version_lag": progress.version_lag},
                "last_sync": self.viewer.last_sync,
            }
        )

    def api_steps(self, params: Params) -> Response:
        return json_response(
            {"fragments": {"steps": pages_run.steps_fragment(self.viewer, self._stage(params))}}
        )

    def api_new(self, params: Params) -> Response:
        _, filters = self._filters(params)
        raw = params.get("seen", "0")
        if not raw.isdigit():
            raise InvalidArgument(f"seen must be a whole number, got {raw!r}", field="seen")
        return json_response(
            {"fragments": {"new": pages_rows.new_rows_fragment(self.viewer, filters, int(raw))}}
        )

    def api_experiences(self, params: Params) -> Response:
        _, filters = self._filters(params)
        with self.viewer.reader() as conn:
            page = query.fetch_page(conn, filters)
        return json_response(
            {"total": page.total, "page": filters.page, "pages": page.pages, "rows": page.rows}
        )

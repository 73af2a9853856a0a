"""The Enron email database the email search agent searches (read-only SQLite with FTS5).

The database is the one Trinity-RFT's email_searcher/prepare_data.py builds from the
corbt/enron-emails data set (after OpenPipe's ART-E): tables
`emails(id, message_id, subject, from_address, date 'YYYY-MM-DD HH:MM:SS', body, file_name)`,
`recipients(email_id, recipient_address, recipient_type 'to'|'cc'|'bcc')` and the full-text index
`emails_fts(subject, body)` over emails (rowid = emails.id).
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from typing import Any

MAX_RESULTS = 10


@dataclass(frozen=True)
class SearchResult:
    message_id: str
    snippet: str


class EmailDatabase:
    """Read-only access to one database file; the connection opens on first use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _cursor(self) -> sqlite3.Cursor:
        with self._lock:
            if self._conn is None:
                self._conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            return self._conn.cursor()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def search(
        self,
        inbox: str,
        keywords: list[str],
        *,
        from_addr: str | None = None,
        to_addr: str | None = None,
        sent_after: str | None = None,
        sent_before: str | None = None,
        max_results: int = MAX_RESULTS,
    ) -> list[SearchResult]:
        """Emails of `inbox` (sender or any recipient) containing every keyword, newest first.

        Dates are 'YYYY-MM-DD': sent_after is inclusive, sent_before exclusive (start of the day).
        """
        if not keywords:
            raise ValueError("No keywords provided for search.")
        if max_results > MAX_RESULTS:
            raise ValueError(f"max_results must be less than or equal to {MAX_RESULTS}.")
        # FTS5 ANDs space-separated terms; each keyword is quoted as one phrase
        phrase = " ".join('"' + keyword.replace('"', '""') + '"' for keyword in keywords)
        where = [
            "emails_fts MATCH ?",
            "(e.from_address = ? OR EXISTS (SELECT 1 FROM recipients r "
            "WHERE r.recipient_address = ? AND r.email_id = e.id))",
        ]
        params: list[Any] = [phrase, inbox, inbox]
        if from_addr:
            where.append("e.from_address = ?")
            params.append(from_addr)
        if to_addr:
            where.append(
                "EXISTS (SELECT 1 FROM recipients t WHERE t.recipient_address = ? AND t.email_id = e.id)"
            )
            params.append(to_addr)
        if sent_after:
            where.append("e.date >= ?")
            params.append(f"{sent_after} 00:00:00")
        if sent_before:
            where.append("e.date < ?")
            params.append(f"{sent_before} 00:00:00")
        sql = (
            "SELECT e.message_id, snippet(emails_fts, -1, '<b>', '</b>', ' ... ', 15) "
            "FROM emails e JOIN emails_fts ON e.id = emails_fts.rowid "
            f"WHERE {' AND '.join(where)} ORDER BY e.date DESC LIMIT ?"
        )
        rows = self._cursor().execute(sql, [*params, max_results]).fetchall()
        return [SearchResult(message_id=row[0], snippet=row[1]) for row in rows]

    def read(self, message_id: str) -> dict[str, Any] | None:
        """One email with its to / cc / bcc addresses, or None when no email has that id."""
        cursor = self._cursor()
        row = cursor.execute(
            "SELECT id, message_id, date, subject, from_address, body, file_name FROM emails "
            "WHERE message_id = ?",
            (message_id,),
        ).fetchone()
        if row is None:
            return None
        key, msg_id, date, subject, sender, body, file_name = row
        addresses: dict[str, list[str]] = {"to": [], "cc": [], "bcc": []}
        for address, kind in cursor.execute(
            "SELECT recipient_address, recipient_type FROM recipients WHERE email_id = ?", (key,)
        ):
            addresses.setdefault(str(kind).lower(), []).append(address)
        return {
            "message_id": msg_id,
            "date": date,
            "subject": subject,
            "from_address": sender,
            "to_addresses": addresses["to"],
            "cc_addresses": addresses["cc"],
            "bcc_addresses": addresses["bcc"],
            "body": body,
            "file_name": file_name,
        }

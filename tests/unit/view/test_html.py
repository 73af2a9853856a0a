"""HTML helpers: numbers for cells, escaping, tokens as spans by kind."""

from __future__ import annotations

from services.view.detail import Token
from services.view.html import error_page, num, tokens_html


def test_num_formats_cells() -> None:
    assert num(None) == "—"
    assert num(3) == "3"
    assert num(0.123456) == "0.1235"
    assert num(29712.4) == "29,712"
    assert num(True) == "yes"
    assert num("<b>") == "&lt;b&gt;"


def test_tokens_are_spans_by_kind_with_id_and_logprob() -> None:
    out = tokens_html(
        [Token(5, "a<", "p"), Token(6, "b", "t", -0.5), Token(2, "<eos>", "u", -1.25)], has_text=True
    )
    assert '<span class="tok p" title="id 5">a&lt;</span>' in out
    assert '<span class="tok t" title="id 6 · logprob -0.500">b</span>' in out
    assert '<span class="tok u" title="id 2 · logprob -1.250">&lt;eos&gt;</span>' in out
    assert tokens_html([], has_text=False) == '<div class="tokens ids"></div>'


def test_error_page_escapes_the_message() -> None:
    page = error_page(400, "step must be a whole number, got '<x>'")
    assert "400: bad request" in page and "&lt;x&gt;" in page

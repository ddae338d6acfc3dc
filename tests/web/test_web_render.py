"""Markdown → HTML for the review page: the model's output is untrusted, so anything but
Markdown and the table tags it writes is shown as text; ammonia cleans the rest."""

from __future__ import annotations

from ocrd.web.render import split_pages, to_html
from ocrd.web.views import review_pages


def test_script_and_event_handlers_are_text() -> None:
    html = to_html("Hi <script>document.title='pwned'</script>\n\n<img src=x onerror=alert(1)>")
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_tables_stay_tables_without_their_attributes() -> None:
    html = to_html('<table><tr><td colspan="2" onclick="x()" style="color:red">a</td>'
                   "</tr></table>")
    assert '<td colspan="2">a</td>' in html
    assert "onclick" not in html and "style" not in html


def test_links_and_images() -> None:
    html = to_html("[a](javascript:alert(1)) [b](https://example.org/x) "
                   "![](http://tracker.example/p.png) ![](doc.assets/p0001-1.png) "
                   "![](doc.assets/../../etc/passwd)", "doc.assets", "/files/7/assets")
    assert "javascript:" not in html.replace("[a](javascript:alert(1))", "")
    assert 'href="https://example.org/x"' in html and "nofollow" in html
    assert "tracker.example" not in html  # never loaded
    assert '<img class="figure" src="/files/7/assets/p0001-1.png"' in html
    assert html.count("<img") == 1


def test_raw_html_blocks_in_any_form_are_text() -> None:
    for attack in ('<svg onload="alert(1)">', "<iframe src=//evil>", '<a href="javascript:x">',
                   "<style>body{display:none}</style>", '<div style="x" onclick="y">z</div>',
                   "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>",
                   "<<script>script>alert(1)<</script>/script>"):
        html = to_html(attack)
        for bad in ("<svg", "<iframe", "<a ", "<style", "<div", "<img", "<math",
                    "<script"):
            assert bad not in html, (attack, html)


def test_pages_split_on_markers() -> None:
    text = ("<!-- page 1 -->\n\nOne\n\n<!-- page 2 (blank) -->\n\n"
            "<!-- page 3 (degraded: length) -->\n\nThree\n")
    pages = split_pages(text)
    assert [(p.page, p.note, p.markdown) for p in pages] == [
        (1, "", "One"), (2, "blank", ""), (3, "degraded: length", "Three")]


def test_review_order_puts_degraded_and_blank_first() -> None:
    text = ("<!-- page 1 -->\n\nOne\n\n<!-- page 2 (blank) -->\n\n"
            "<!-- page 3 (degraded: length) -->\n\nThree\n")
    meta = {"pages": [{"page": 1, "status": "ok"}, {"page": 2, "status": "blank"},
                      {"page": 3, "status": "degraded", "degraded": "length",
                       "malformed_output": True}]}
    pages = review_pages(text, meta, 1)
    assert [p.page for p in pages] == [3, 2, 1]
    assert pages[0].why.startswith("degraded: length") and "cut or broken" in pages[0].why
    assert pages[1].why.startswith("blank")

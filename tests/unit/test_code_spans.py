"""Backtick spans in our help text render as <code>; everything else stays escaped text."""

import pytest

from controlplane.html import code_spans


@pytest.mark.parametrize(
    ("text", "html"),
    [
        ("use `manage.py source add`", "use <code>manage.py source add</code>"),
        ("`a` and `b`", "<code>a</code> and <code>b</code>"),
        ("no spans", "no spans"),
        ("an odd ` backtick", "an odd ` backtick"),
        ("`<script>alert(1)</script>`", "<code>&lt;script&gt;alert(1)&lt;/script&gt;</code>"),
        ("<b>`x`</b>", "&lt;b&gt;<code>x</code>&lt;/b&gt;"),
        ("`\"q\" & 's'`", "<code>&quot;q&quot; &amp; &#x27;s&#x27;</code>"),
        ("`spans\nno lines`", "`spans\nno lines`"),
        (None, ""),
    ],
)
def test_code_spans(text, html):
    assert code_spans(text) == html


@pytest.mark.django_db
def test_api_docs_show_code_not_backticks(viewer_client):
    html = viewer_client.get("/api/v1/docs").content.decode()
    assert "<code>outcome</code> filters (e.g. <code>failed</code>)" in html
    assert "`outcome`" not in html and "`failed`" not in html

"""What the History page's chain status says in each state (the template partial alone)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.template.loader import render_to_string

from controlplane.audit.chain_status import ChainStatus

AT = datetime(2026, 12, 6, 1, 2, 3, tzinfo=UTC)


def _say(status: ChainStatus) -> str:
    html = render_to_string("audit/history.html#chain-status", {"chain": status})
    return " ".join(html.split())


def test_verified_to_the_newest_entry():
    text = _say(ChainStatus("verified", 120, AT, 120))
    assert 'data-state="verified"' in text
    assert "Chain verified</strong> up to entry #120 (the newest), at" in text
    assert "2026-12-06 01:02:03 UTC" in text
    assert "not yet checked" not in text


def test_partial_says_how_many_are_left():
    status = ChainStatus("partial", 5000, AT, 12001)
    assert status.unchecked == 7001
    text = _say(status)
    assert "up to entry #5000, at" in text and "(the newest)" not in text
    assert "7001 newer entries not yet checked" in text
    assert "1 newer entry not yet checked" in _say(ChainStatus("partial", 9, AT, 10))


def test_broken_names_the_entry_and_what_still_stands():
    text = _say(
        ChainStatus("broken", 40, AT, 44, broken_at=41, problem="previous-hash link differs")
    )
    assert 'data-state="broken"' in text
    assert "Chain broken at entry #41:</strong> previous-hash link differs." in text
    assert "Verified good up to #40" in text
    assert "manage.py audit verify" in text
    # Nothing verified yet: no claim about a good prefix.
    assert "Verified good" not in _say(ChainStatus("broken", 0, None, 3, broken_at=1, problem="x"))


def test_empty_log():
    assert "No audit entries yet." in _say(ChainStatus("empty", 0, None, 0))

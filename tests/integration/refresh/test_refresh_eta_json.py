"""The estimated end the refresh page shows is in `refresh status --json` (and its text) and
in the refresh API's detail: the end, the seconds left and what it rests on, or null with the
reason when there is no estimate."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from controlplane.fleet.models import Source
from controlplane.refresh.eta import NO_HISTORY
from controlplane.refresh.models import RefreshState, StepRun
from tests.integration.refresh.cli import cli, cli_json
from tests.integration.refresh.test_refresh_page_timing import FULL, refresh_with_steps

pytestmark = pytest.mark.django_db

#: What is left of FULL once gate, resolve and pause are done and update has not begun.
LEFT = 60 + 4 + 5 + 20 + 2


@pytest.fixture
def source(db):
    return Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )


def running_after_pause(source):
    refresh = refresh_with_steps(
        source, RefreshState.UPDATING, {"gate": 1, "resolve": 2, "pause": 3}, start=timezone.now()
    )
    return refresh


def between(before: dt.datetime, text: str, after: dt.datetime) -> bool:
    end = dt.datetime.fromisoformat(text)
    return before + dt.timedelta(seconds=LEFT) <= end <= after + dt.timedelta(seconds=LEFT)


def test_status_and_the_api_give_the_pages_estimate(source, viewer_client):
    for update in (50, 60, 400):
        refresh_with_steps(source, RefreshState.SUCCEEDED, FULL | {"update": update})
    running = running_after_pause(source)

    before = timezone.now()
    code, status = cli_json("refresh", "status", str(running.pk))
    detail = viewer_client.get(f"/api/v1/refreshes/{running.pk}").json()
    after = timezone.now()

    assert code == 0
    for eta in (status["eta"], detail["eta"]):
        assert eta["remaining_seconds"] == LEFT
        assert eta["basis"] == "per-step medians of the last 3 successful refreshes of this source"
        assert eta["history"] == 3 and eta["reason"] is None
        assert between(before, eta["estimated_end"], after)

    page = viewer_client.get(f"/refreshes/{running.pk}/").content.decode()
    assert status["eta"]["basis"] in page

    _, text, _ = cli("refresh", "status", str(running.pk))
    assert f"about {float(LEFT)} s left; {status['eta']['basis']}" in text


def test_no_history_and_a_stopped_refresh_say_why(source, viewer_client):
    running = running_after_pause(source)
    _, status = cli_json("refresh", "status", str(running.pk))
    detail = viewer_client.get(f"/api/v1/refreshes/{running.pk}").json()
    none = {
        "estimated_end": None,
        "remaining_seconds": None,
        "basis": None,
        "history": 0,
        "reason": NO_HISTORY,
    }
    assert status["eta"] == detail["eta"] == none
    _, text, _ = cli("refresh", "status", str(running.pk))
    assert f"estimated end: unknown ({NO_HISTORY})" in text

    refresh_with_steps(source, RefreshState.SUCCEEDED, FULL)
    held = refresh_with_steps(source, RefreshState.HELD, {"gate": 1})
    StepRun.objects.filter(refresh=held).update(status="failed")
    _, status = cli_json("refresh", "status", str(held.pk))
    assert status["eta"]["estimated_end"] is None and status["eta"]["history"] is None
    assert status["eta"]["reason"] == "the refresh is held, not running its steps"
    assert viewer_client.get(f"/api/v1/refreshes/{held.pk}").json()["eta"] == status["eta"]

"""A web server that does not use the running demo's Redis or database says so on every page,
to the people who act (settings.RUNTIME_NOTICE, controlplane/runtime.py); viewers see nothing."""

import pytest

pytestmark = pytest.mark.django_db

NOTICE = "Not the running demo's runtime (pid 42): this process uses Redis redis://x:1/0"


def test_people_who_act_see_the_notice_on_every_page(settings, operator_client, approver_client):
    settings.RUNTIME_NOTICE = NOTICE
    for client in (operator_client, approver_client):
        for path in ("/", "/refreshes/", "/history/"):
            html = client.get(path).content.decode()
            assert 'id="runtime-notice"' in html and NOTICE.replace("'", "&#x27;") in html


def test_viewers_and_matching_runtimes_show_none(settings, viewer_client, operator_client):
    settings.RUNTIME_NOTICE = NOTICE
    assert 'id="runtime-notice"' not in viewer_client.get("/").content.decode()
    settings.RUNTIME_NOTICE = ""
    assert 'id="runtime-notice"' not in operator_client.get("/").content.decode()

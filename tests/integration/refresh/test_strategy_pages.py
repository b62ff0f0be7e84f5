"""Strategy on the pages without a browser: who may change a source's default, the webhook
endpoint's default strategy and override switch, and the canary's review on the refresh page
(hostile metrics from a trainer shown as text)."""

from __future__ import annotations

import pytest

from controlplane.fleet.models import Source
from controlplane.intake.models import WebhookEndpoint
from controlplane.refresh.models import PolicyRefresh, RefreshState

pytestmark = pytest.mark.django_db


@pytest.fixture
def source(db):
    return Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )


def test_only_who_manages_sources_changes_a_default_strategy(source, operator_client):
    url = f"/refreshes/sources/{source.pk}/strategy/"
    assert operator_client.get(url).status_code == 403
    answer = operator_client.post(url, {"strategy_kind": "waves", "max_unavailable": "1"})
    assert answer.status_code == 403
    source.refresh_from_db()
    assert source.default_strategy == {}


def test_a_bad_default_strategy_is_refused_next_to_its_field(source, admin_client):
    url = f"/refreshes/sources/{source.pk}/strategy/"
    answer = admin_client.post(url, {"strategy_kind": "canary", "canary_size": "0"})
    assert answer.status_code == 200
    assert b"canary.size: must be at least 1" in answer.content
    source.refresh_from_db()
    assert source.default_strategy == {}


def endpoint_form(source, **extra):
    return {
        "name": "trainer-a",
        "source": source.pk,
        "policy": "auto_start",
        "pause_mode": "auto",
        "enabled": "on",
        **extra,
    }


def test_a_webhook_endpoint_gets_a_default_strategy_and_an_override_switch(source, admin_client):
    bad = admin_client.post(
        "/admin-tools/webhooks/new/",
        endpoint_form(source, default_strategy='{"kind": "waves"}'),
    )
    assert bad.status_code == 400
    assert b"waves need max_unavailable" in bad.content
    assert not WebhookEndpoint.objects.exists()

    good = admin_client.post(
        "/admin-tools/webhooks/new/",
        endpoint_form(
            source,
            default_strategy='{"kind": "canary", "canary": {"size": 1, "evaluation": "trainer"}}',
            allow_strategy_override="on",
        ),
    )
    assert good.status_code in (200, 302), good.content[:500]
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.default_strategy["canary"]["evaluation"] == "trainer"
    assert endpoint.allow_strategy_override is True
    page = admin_client.get(f"/admin-tools/webhooks/{endpoint.pk}/")
    assert b"judged by the trainer" in page.content
    assert b"a webhook may choose its own" in page.content


def test_the_refresh_page_shows_the_canary_review_and_metrics_as_text(source, viewer_client):
    refresh = PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a"],
        target={"weight_version": "v5", "method": "disk", "model_path": "/m"},
        state=RefreshState.CANARY_REVIEW,
        strategy={"kind": "canary", "canary": {"size": 1, "evaluation": "trainer"}},
        waves=2,
        progress={
            "canary": {
                "state": "passed",
                "evaluation": "trainer",
                "instances": {"rl-a": ["17"]},
                "by": "webhook:trainer-a",
                "metrics": {"<b>reward</b>": "<script>x</script>", "items": 3},
            }
        },
    )
    page = viewer_client.get(f"/refreshes/{refresh.pk}/")
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="refresh-strategy"' in body and "judged by the trainer" in body
    assert 'data-canary-state="passed"' in body and "webhook:trainer-a" in body
    assert "&lt;b&gt;reward&lt;/b&gt;" in body and "<script>x</script>" not in body
    assert "<dt>items</dt><dd>3</dd>" in body

"""Requests in flight are a decision: a pause mode that keeps them (vLLM `keep`) runs only when
the plan declares they may straddle the update, on every way a plan is asked for (form, API,
CLI, webhook endpoint); the serving ledger then marks the window it verifies as mixed.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from controlplane.audit.recorder import Actor
from controlplane.fleet.models import DiscoveryRun
from controlplane.intake.services.endpoints import create_webhook_endpoint
from controlplane.refresh import intents
from controlplane.refresh.models import PolicyRefresh, RefreshState, ServingInterval
from controlplane.refresh.targets import straddling_modes
from tests.integration.refresh.helpers import fleet_config, make_source, run_inline

pytestmark = pytest.mark.django_db(transaction=True)

DISK = {"weight_version": "v2", "method": "disk", "model_path": "/ckpt/v2"}


@pytest.fixture
def source(simfleet_factory):
    return make_source(simfleet_factory(fleet_config(4)))


def test_keep_without_the_declaration_is_refused_by_field_before_anything_runs(source, operator):
    runs = DiscoveryRun.objects.filter(source=source).count()
    with pytest.raises(ValidationError) as refused:
        intents.plan_policy_refresh(
            source=source, actor=Actor.for_user(operator), target=DISK, pause_mode="keep"
        )
    errors = refused.value.message_dict
    assert list(errors) == ["inflight_may_straddle"]
    assert "pause mode keep keeps the requests in flight" in errors["inflight_may_straddle"][0]
    with pytest.raises(ValidationError, match="vllm-sidecar: keep"):
        intents.plan_policy_refresh(
            source=source,
            actor=Actor.for_user(operator),
            target=DISK,
            pause_modes={"vllm-sidecar": "keep"},
        )
    # Nothing was planned, nothing discovered, nothing paused.
    assert not PolicyRefresh.objects.filter(source=source).exists()
    assert DiscoveryRun.objects.filter(source=source).count() == runs


def test_which_modes_need_the_declaration():
    assert straddling_modes("auto", None, "disk") == []
    assert straddling_modes("wait", {"sglang": "abort"}, "disk") == []
    assert straddling_modes("keep", None, "disk") == ["keep"]
    # SGLang's disk update sends abort_all_requests: true, which drops what was retracted...
    assert straddling_modes("auto", {"sglang": "retract"}, "disk") == []
    # ...any other method lets it continue on the new weights.
    assert straddling_modes("auto", {"sglang": "in_place"}, "distributed") == ["sglang: in_place"]


def test_api_refuses_keep_with_a_field_error_and_takes_the_declaration(source, operator_client):
    body = {"source": source.name, "target": DISK, "pause_mode": "keep"}
    refused = operator_client.post("/api/v1/refreshes", body, content_type="application/json")
    assert refused.status_code == 422, refused.content
    assert "inflight_may_straddle" in refused.json()["error"]["details"]
    assert not PolicyRefresh.objects.exists()
    planned = operator_client.post(
        "/api/v1/refreshes",
        {**body, "inflight_may_straddle": True},
        content_type="application/json",
    )
    assert planned.status_code == 201, planned.content
    assert planned.json()["inflight_may_straddle"] is True
    assert PolicyRefresh.objects.get().inflight_may_straddle is True


def test_plan_form_shows_the_refusal_on_the_declaration_field(source, operator_client):
    from tests.integration.refresh.test_refresh_pages import plan_form

    form = plan_form(source)
    del form["inflight_may_straddle"]
    page = operator_client.post(reverse("refresh:plan"), form)
    assert page.status_code in (200, 400)
    text = page.content.decode()
    assert "Requests in flight may straddle the update" in text
    assert "keeps the requests in flight across the update" in text
    assert not PolicyRefresh.objects.exists()
    page = operator_client.post(reverse("refresh:plan"), plan_form(source))
    assert page.status_code == 302
    assert PolicyRefresh.objects.get().inflight_may_straddle is True


def test_cli_refuses_keep_without_the_flag_and_takes_it(source, operator):
    from controlplane.accounts.management.commands._cli import Exit
    from tests.integration.refresh.cli import cli

    args = ("policy_refresh", source.name, "--weight-version", "v2", "--model-path", "/ckpt/v2")
    args += ("--pause-mode", "keep", "--as", operator.username, "--yes")
    code, _, err = cli(*args)
    assert code == Exit.USAGE, err
    assert "keeps the requests in flight" in err
    assert not PolicyRefresh.objects.exists()
    code, _, err = cli(*args, "--inflight-may-straddle")
    assert code == Exit.OK, err
    assert PolicyRefresh.objects.get().inflight_may_straddle is True


def test_webhook_endpoint_with_keep_needs_the_declaration(source, operator):
    with pytest.raises(ValidationError) as refused:
        create_webhook_endpoint(
            actor=Actor.for_user(operator), name="t1", source=source, pause_mode="keep"
        )
    assert "inflight_may_straddle" in refused.value.message_dict
    endpoint, _ = create_webhook_endpoint(
        actor=Actor.for_user(operator),
        name="t1",
        source=source,
        pause_mode="keep",
        inflight_may_straddle=True,
    )
    assert endpoint.inflight_may_straddle


def test_a_keep_refresh_marks_the_window_it_verifies_as_mixed(source, operator):
    refresh = run_inline(source, operator, pause_mode="keep", inflight_may_straddle=True)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    verified = ServingInterval.objects.filter(refresh=refresh)
    assert verified.count() == 4
    for row in verified:
        assert row.evidence_detail["mixed"] is True
        assert row.evidence_detail["in_flight"] == "kept"
        assert row.evidence_detail["pause_mode"] == "keep"
        assert row.evidence_detail["readback"] is True  # the verification's own detail stays

    # A refresh that drains (`wait`, the default) verifies a clean window.
    again = run_inline(source, operator, "v3")
    assert again.state == RefreshState.SUCCEEDED, again.held_reason
    clean = ServingInterval.objects.filter(refresh=again)
    assert clean.count() == 4
    assert not any("mixed" in row.evidence_detail for row in clean)

"""Every way in for a trainer fingerprint or an agreement rule: good input is stored and shown,
bad input gets a clear error and changes nothing.

The source's listener is a closed port: planning fails its fresh discovery (a stored blocker)
without any worker being called, which is all these tests need.
"""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from controlplane.accounts.management.commands._cli import Exit
from controlplane.fleet.models import Source
from controlplane.intake.models import ReceivedWebhook
from controlplane.intake.webhooks.trainer.process import process_delivery
from controlplane.refresh.models import PolicyRefresh
from tests.api.conftest import bearer
from tests.integration.intake.conftest import SECRET, post_webhook
from tests.integration.refresh.cli import cli

pytestmark = pytest.mark.django_db

GOOD = {"completion_token_ids": [11, 12, 13], "logprobs": [-0.5, -0.25], "logprob_tolerance": 0.1}
BAD = [
    ({"completion_token_ids": list(range(257))}, "256"),
    ({"completion_token_ids": [1, -2]}, "completion_token_ids"),
    ({"completion_token_ids": [True]}, "completion_token_ids"),
    ({"logprobs": [0.5]}, "logprobs"),
    ({"logprobs": [-0.5], "logprob_tolerance": 0}, "logprob_tolerance"),
    ({"logprob_tolerance": 0.1}, "completion_token_ids and/or logprobs"),
    ({"completion_token_ids": [1], "extra": 1}, "extra"),
]


@pytest.fixture
def source(db):
    return Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )


@pytest.fixture
def endpoint(source):
    from controlplane.intake.models import WebhookEndpoint

    return WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=[SECRET])


@pytest.fixture
def operator_token(operator):
    from controlplane.accounts.tokens import create_token
    from controlplane.audit.recorder import Actor

    _, secret = create_token(user=operator, label="t", actor=Actor.system(), sources=())
    return secret


def api_plan(client, token, fingerprint):
    body = {
        "source": "src-a",
        "target": {"weight_version": "v2", "model_path": "/ckpt/v2"},
        "fingerprint": fingerprint,
    }
    return client.post(
        "/api/v1/refreshes", json.dumps(body), content_type="application/json", **bearer(token)
    )


# -- JSON API --------------------------------------------------------------------------------------


def test_api_plan_stores_the_fingerprint_and_serves_it(client, source, operator_token):
    response = api_plan(client, operator_token, GOOD)
    assert response.status_code == 201, response.content
    refresh = PolicyRefresh.objects.get()
    assert refresh.fingerprint == GOOD
    assert response.json()["fingerprint"] == GOOD


@pytest.mark.parametrize(("fingerprint", "word"), BAD)
def test_api_plan_refuses_a_bad_fingerprint(client, source, operator_token, fingerprint, word):
    response = api_plan(client, operator_token, fingerprint)
    assert response.status_code == 422, response.content
    assert word in response.content.decode()
    assert not PolicyRefresh.objects.exists()


def test_api_plan_refuses_non_finite_logprobs(client, source, operator_token):
    raw = (
        '{"source": "src-a", "target": {"weight_version": "v2", "model_path": "/c"},'
        ' "fingerprint": {"logprobs": [-Infinity]}}'
    )
    response = client.post(
        "/api/v1/refreshes", raw, content_type="application/json", **bearer(operator_token)
    )
    assert 400 <= response.status_code < 500
    assert not PolicyRefresh.objects.exists()


# -- trainer webhook -------------------------------------------------------------------------------


def checkpoint(fingerprint) -> bytes:
    data = {"weight_version": "step-9", "model_path": "/ckpt/9", "fingerprint": fingerprint}
    return json.dumps({"type": "checkpoint.ready", "data": data}).encode()


def test_webhook_passes_the_fingerprint_to_the_refresh(client, endpoint):
    response = post_webhook(client, checkpoint(GOOD))
    assert response.status_code == 202, response.content
    # Intake only stores the delivery; the task plans it (run here in-process).
    process_delivery(ReceivedWebhook.objects.get().pk)
    refresh = PolicyRefresh.objects.get()
    assert refresh.fingerprint == GOOD


@pytest.mark.parametrize(("fingerprint", "word"), BAD)
def test_webhook_refuses_a_bad_fingerprint(client, endpoint, fingerprint, word):
    response = post_webhook(client, checkpoint(fingerprint))
    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] == "invalid_event"
    assert word in response.content.decode()
    assert not PolicyRefresh.objects.exists()
    assert not ReceivedWebhook.objects.exists()


# -- plan form and page ----------------------------------------------------------------------------


def plan_form(**fingerprint):
    return {
        "source": "src-a",
        "weight_version": "v2",
        "method": "disk",
        "model_path": "/ckpt/v2",
        "pause_mode": "keep",
        "inflight_may_straddle": "on",
        "flush_policy": "auto",
        "version_readback": "on",
        "liveness": "on",
        "generation": "on",
        "prompt_token_ids": "5, 6, 7, 8",
        "max_tokens": "4",
        **fingerprint,
    }


def test_plan_form_stores_the_fingerprint_and_the_plan_shows_it(operator_client, source):
    form = plan_form(expect_tokens="11, 12, 13", expect_logprobs="-0.5,-0.25")
    response = operator_client.post("/refreshes/new/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    refresh = PolicyRefresh.objects.get()
    assert refresh.fingerprint == {
        "completion_token_ids": [11, 12, 13],
        "logprobs": [-0.5, -0.25],
        "logprob_tolerance": 0.05,
    }
    page = operator_client.get(response["Location"]).content.decode()
    assert "3 expected ids, 2 reference logprobs (± 0.05): expected ids [11, 12, 13]" in page
    assert "exact agreement on the first 8 tokens" in page


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"expect_tokens": "1, two"}, "expect_tokens", "expected tokens must be integers"),
        ({"expect_tokens": "-1"}, "expect_tokens", "completion_token_ids[0]"),
        ({"expect_logprobs": "nan"}, "expect_logprobs", "finite number"),
        ({"expect_logprobs": "0.3"}, "expect_logprobs", "at most 0"),
        ({"expect_tokens": "1", "logprob_tolerance": "0"}, "logprob_tolerance", "tolerance"),
        ({"expect_tokens": ",".join(["7"] * 300)}, "expect_tokens", "at most 256"),
    ],
)
def test_plan_form_refuses_a_bad_fingerprint(operator_client, source, fields, field, message):
    response = operator_client.post("/refreshes/new/", plan_form(**fields))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert field in errors and message in " ".join(errors[field])
    assert not PolicyRefresh.objects.exists()


# -- policy_refresh command ------------------------------------------------------------------------


def run_command(*args):
    """(exit code, stdout, stderr) of `policy_refresh` as the operator persona."""
    return cli(
        "policy_refresh",
        "src-a",
        "--weight-version",
        "v2",
        "--model-path",
        "/c",
        "--as",
        "operator-1",
        *args,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("--expect-tokens", "1,x"),
        ("--expect-tokens", ",".join(["1"] * 257)),
        ("--expect-logprobs", "inf"),
        ("--expect-tokens", "1", "--logprob-tolerance", "-1"),
    ],
)
def test_policy_refresh_command_refuses_a_bad_fingerprint(source, operator, args):
    code, _, err = run_command(*args)
    assert code == Exit.USAGE and err
    assert not PolicyRefresh.objects.exists()


def test_policy_refresh_command_reads_a_fingerprint_file(source, operator, tmp_path):
    path = tmp_path / "fp.json"
    path.write_text(json.dumps(GOOD))
    # The plan is blocked (nobody listens), but it was stored with the file's fingerprint.
    code, out, err = run_command("--fingerprint-file", str(path))
    assert code == Exit.FAILED and "refused at plan time" in err
    assert PolicyRefresh.objects.get().fingerprint == GOOD
    assert "trainer fingerprint: 3 expected ids" in out


def test_policy_refresh_command_refuses_a_bad_fingerprint_file(source, operator, tmp_path):
    path = tmp_path / "fp.json"
    path.write_text("[" * 10_000)  # deeper than the JSON decoder recurses
    code, _, err = run_command("--fingerprint-file", str(path))
    assert code == Exit.USAGE and "cannot read fingerprint file" in err
    path.write_text("[" * 100_000)
    code, _, err = run_command("--fingerprint-file", str(path))
    assert code == Exit.USAGE and "is larger than 65536 bytes" in err
    path.write_text(json.dumps({"completion_token_ids": [1.5]}))
    assert run_command("--fingerprint-file", str(path))[0] == Exit.USAGE
    assert not PolicyRefresh.objects.exists()


# -- the source's agreement rule -------------------------------------------------------------------


def test_source_add_command_sets_the_agreement_rule(db):
    call_command(
        "source",
        "add",
        "sim",
        "--listener-url",
        "http://127.0.0.1:9/",
        "--admin-network",
        "127.0.0.0/8",
        "--agreement-rule",
        "logprob",
        "--agreement-tokens",
        "6",
        "--agreement-epsilon",
        "0.02",
    )
    source = Source.objects.get(name="sim")
    assert (source.agreement_rule, source.agreement_tokens, source.agreement_epsilon) == (
        "logprob",
        6,
        0.02,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--agreement-tokens", "0"), "agreement_tokens"),
        (("--agreement-tokens", "300"), "agreement_tokens"),
        (("--agreement-epsilon", "nan"), "agreement_epsilon"),
        (("--agreement-epsilon", "0"), "agreement_epsilon"),
    ],
)
def test_source_add_command_refuses_a_bad_agreement_rule(db, args, message):
    with pytest.raises(CommandError, match=message):
        call_command(
            "source",
            "add",
            "sim",
            "--listener-url",
            "http://127.0.0.1:9/",
            "--admin-network",
            "127.0.0.0/8",
            *args,
        )
    assert not Source.objects.exists()


def test_source_api_sets_and_refuses_agreement_rules(client, admin_user):
    from controlplane.accounts.tokens import create_token
    from controlplane.audit.recorder import Actor

    _, token = create_token(user=admin_user, label="a", actor=Actor.system(), sources=())
    body = {
        "name": "sim",
        "listener_url": "http://127.0.0.1:9/",
        "allowed_networks": ["127.0.0.0/8"],
        "agreement_rule": "logprob",
        "agreement_epsilon": 0.01,
    }
    created = client.post(
        "/api/v1/sources", json.dumps(body), content_type="application/json", **bearer(token)
    )
    assert created.status_code == 201, created.content
    assert created.json()["agreement_rule"] == "logprob"
    assert created.json()["agreement_tokens"] == 8
    for bad in ({"agreement_rule": "fuzzy"}, {"agreement_tokens": 0}, {"agreement_epsilon": -1}):
        response = client.patch(
            "/api/v1/sources/sim", json.dumps(bad), content_type="application/json", **bearer(token)
        )
        assert response.status_code == 422, (bad, response.content)
    source = Source.objects.get(name="sim")
    assert (source.agreement_rule, source.agreement_tokens, source.agreement_epsilon) == (
        "logprob",
        8,
        0.01,
    )


def test_source_form_refuses_a_bad_epsilon(admin_client, db):
    form = {
        "name": "sim",
        "listener_url": "http://127.0.0.1:9/",
        "allowed_networks": "127.0.0.0/8",
        "discovery_interval_seconds": "10",
        "enabled": "on",
        "agreement_rule": "logprob",
        "agreement_tokens": "8",
        "agreement_epsilon": "0",
    }
    response = admin_client.post("/sources/new/", form)
    assert response.status_code == 400
    assert "agreement_epsilon" in response.context["form"].errors
    assert not Source.objects.exists()

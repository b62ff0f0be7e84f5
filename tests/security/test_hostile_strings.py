"""Hostile strings through every input channel; no page, partial or websocket frame shows one
as markup.

Each channel below stores (or tries to store) tagged hostile values the way an outsider would
reach it: the simulated fleet's discovery payloads and worker replies, forms, the JSON API,
signed trainer webhooks, the command line. Then every named GET route (enumerated from the URL
configuration, so a new page cannot be skipped silently), its htmx partial and each websocket
stream are read as an admin and parsed like a browser would. Add a channel by appending a
function to CHANNELS; add a page by giving its route name URLs in `_route_urls`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from controlplane.accounts.models import ApiToken
from controlplane.audit.recorder import Actor
from controlplane.fleet import discovery
from controlplane.fleet.models import DiscoveryTrigger, Source, Worker
from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint
from controlplane.intake.webhooks.trainer.process import process_delivery
from controlplane.notify.models import NotificationDestination
from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import (
    Gate,
    GateState,
    JournalEntry,
    PolicyRefresh,
    Quarantine,
    RefreshState,
)
from controlplane.simfleet import Fault, FleetConfig, WorkerSpec
from tests.integration.intake.conftest import SECRET, post_webhook
from tests.security.hostile import PAYLOAD, Hostile, csp_problems, unescaped

pytestmark = [pytest.mark.django_db(transaction=True)]

SETUP = Actor.system("hostile-input suite")


@dataclass
class World:
    """What the channels stored, for building URLs and stream paths."""

    hostile: Hostile
    admin: object
    client: Client
    fleet_factory: Callable | None = None
    fleet: object = None
    by_ns: dict[str, list[str]] = field(default_factory=dict)
    sim: Source | None = None
    planned: PolicyRefresh | None = None
    sources: list[Source] = field(default_factory=list)
    refreshes: list[PolicyRefresh] = field(default_factory=list)
    #: Responses to refused form posts: the form comes back with the hostile value in it.
    refusals: list[tuple[str, str]] = field(default_factory=list)


# -- channels -------------------------------------------------------------------------------


def discovery_payloads(w: World) -> None:
    """What a Dynamo deployment advertises: names, models, routes, URLs, probe errors."""
    h = w.hostile
    # rl-a, rl-b and rl-c stay plannable (the refreshes below run there); rl-d collects the
    # workers whose discovery entries are themselves hostile.
    specs = [
        WorkerSpec(namespace="rl-a", component=h("discovery component"), model=h("model name")),
        WorkerSpec(namespace="rl-a", model="m"),
        WorkerSpec(namespace="rl-a", model="m"),
        WorkerSpec(namespace="rl-b", model="m"),
        WorkerSpec(namespace="rl-b", model="m"),
        WorkerSpec(namespace="rl-c", model="m"),
        WorkerSpec(namespace="rl-c", model="m"),
        WorkerSpec(namespace="rl-d", model="m"),
        WorkerSpec(namespace="rl-d", model="m"),
        WorkerSpec(namespace="rl-d", model="m"),
        WorkerSpec(namespace="rl-d", model="m"),
        # Two healthy workers of their own for the canary channel.
        WorkerSpec(namespace="rl-e", model="m"),
        WorkerSpec(namespace="rl-e", model="m"),
        WorkerSpec(namespace=f"rl-{h('discovery namespace')}", model="m"),
    ]
    config = FleetConfig(
        workers=specs,
        listener_env={"DYN_NAMESPACE_PREFIX": "rl", "DYN_RL_REQUEST_TIMEOUT_SECS": "2"},
        seed=99,
    )
    w.fleet = w.fleet_factory(config)
    for worker in w.fleet.workers():
        w.by_ns.setdefault(worker["namespace"], []).append(worker["key"])
    odd = w.by_ns["rl-d"]
    # Routes and system_url variants in a descriptor, and a probe that fails with a message.
    routes = [h("route name"), "update_weights_from_disk", "pause_generation"]
    w.fleet.inject(
        odd[1],
        "probe",
        Fault.reply({"status": "ok", "routes": routes, "system_url": h.url("system_url")}),
    )
    w.fleet.inject(
        odd[2],
        "probe",
        Fault.reply(
            {"status": "ok", "routes": routes, "system_url": "http://127.0.0.1:9/" + h("url")}
        ),
    )
    w.fleet.inject(odd[3], "probe", Fault.probe_error(h("probe error message")))
    # Liveness shows the status, never the body (errors carry reasons, not bodies).
    w.fleet.inject(odd[0], "health", Fault.http(503, h("health error body", shown=False)))
    # A version the worker reports about itself.
    w.fleet.set_version(w.by_ns["rl-c"][0], h("reported weight version"))
    w.sim = Source.objects.create(
        name="sim",
        listener_url=w.fleet.listener_url,
        frontend_url=w.fleet.frontend_url,
        expected_prefix="rl",
        allowed_networks=["127.0.0.0/8"],
    )
    _discover(w.sim)


def _discover(source: Source) -> None:
    discovery.run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=15)


def sources_via_forms_and_api(w: World) -> None:
    h = w.hostile
    # Refused: a hostile name comes back in the re-rendered form.
    refused = w.client.post(
        "/sources/new/",
        {
            "name": h("source name (form)"),
            "listener_url": h.url("listener url (form)"),
            "allowed_networks": h("allowed networks (form)"),
            "discovery_interval_seconds": "10",
            # Echoed in the refusal ("expected namespace=family, got ...").
            "declared_families": h("declared families (form)"),
        },
    )
    assert refused.status_code in (200, 400), refused.status_code
    w.refusals.append(("fleet:source_create (refused)", refused.content.decode()))
    # Accepted: URL paths and scope fields are free text.
    accepted = w.client.post(
        "/sources/new/",
        {
            "name": "hostile-form",
            "listener_url": "http://127.0.0.1:9/" + h("listener url path (form)"),
            "frontend_url": "http://127.0.0.1:9/" + h("frontend url path (form)"),
            "expected_prefix": h("expected prefix (form)"),
            "allowed_networks": "127.0.0.0/8",
            "discovery_interval_seconds": "3600",
            "enabled": "on",
        },
    )
    assert accepted.status_code == 302, accepted.content.decode()[:2000]
    api = w.client.post(
        "/api/v1/sources",
        json.dumps(
            {
                "name": "hostile-api",
                "listener_url": "http://127.0.0.1:9/" + h("listener url path (api)"),
                "expected_namespace": h("expected namespace (api)"),
                "allowed_networks": ["127.0.0.0/8"],
                "discovery_interval_seconds": 3600,
            }
        ),
        content_type="application/json",
    )
    assert api.status_code == 201, api.content
    refused_api = w.client.post(
        "/api/v1/sources",
        json.dumps({"name": h("source name (api)", shown=False), "listener_url": "x"}),
        content_type="application/json",
    )
    assert refused_api.status_code in (400, 422), refused_api.content
    w.sources = list(Source.objects.exclude(pk=w.sim.pk))
    for source in w.sources:
        _discover(source)  # fails (nothing listens): the error lands in the observation


def static_workers_via_form(w: World) -> None:
    h = w.hostile
    response = w.client.post(
        f"/sources/{w.sim.pk}/static-workers/new/",
        {
            "name": "static-1",
            "namespace": "rl-s",
            "component": h("static worker component"),
            "endpoint": h("static worker endpoint"),
            "system_url": "http://127.0.0.1:9/" + h("static worker url"),
            "family": "vllm",
            "allowed_routes": h("static worker route").replace(" ", ""),
            "model": h("static worker model"),
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    _discover(w.sim)


def webhook_endpoints_tokens_destinations(w: World) -> None:
    h = w.hostile
    refused = w.client.post(
        "/admin-tools/webhooks/new/",
        {"name": h("endpoint name"), "source": w.sim.pk, "policy": "require_approval"},
    )
    w.refusals.append(("intake:endpoint_create (refused)", refused.content.decode()))
    rules = [{"metric": h("endpoint rule metric"), "op": "lt", "value": 0.2}]
    created = w.client.post(
        "/admin-tools/webhooks/new/",
        {
            "name": "trainer-a",
            "source": w.sim.pk,
            "namespaces": "rl-b",
            "policy": "require_approval",
            "rules": json.dumps(rules),
            "pause_mode": "keep",
            "inflight_may_straddle": "on",
            "enabled": "on",
        },
    )
    assert created.status_code == 302 and WebhookEndpoint.objects.filter(name="trainer-a")
    shown = w.client.get(created["Location"])  # the one showing of its secret
    assert shown.status_code == 200
    w.refusals.append(("intake:endpoint_secret_shown (once)", shown.content.decode()))
    endpoint = WebhookEndpoint.objects.get(name="trainer-a")
    endpoint.secrets = [SECRET]
    endpoint.save(update_fields=["secrets"])
    # Tokens: the form refuses a hostile label; the command line takes any text.
    refused = w.client.post(
        "/admin-tools/tokens/new/", {"label": h("token label (form)"), "user": w.admin.pk}
    )
    w.refusals.append(("intake:token_create (refused)", refused.content.decode()))
    # The command line refuses one too (with a message that does not repeat it).
    with pytest.raises(CommandError):
        label = h("token label (cli)", shown=False)
        call_command("token", "create", "--user", w.admin.username, "--label", label)
    refused = w.client.post(
        "/admin-tools/notifications/new/",
        {
            "name": h("destination name"),
            "kind": "webhook",
            "url": h.url("destination url"),
            "allowed_networks": "127.0.0.0/8",
        },
    )
    w.refusals.append(("intake:destination_create (refused)", refused.content.decode()))
    created = w.client.post(
        "/admin-tools/notifications/new/",
        {
            "name": "hook-1",
            "kind": "webhook",
            "url": "http://127.0.0.1:9/" + h("destination url path"),
            "allowed_networks": "127.0.0.0/8",
            "enabled": "on",
        },
    )
    assert created.status_code == 302, created.status_code
    assert NotificationDestination.objects.filter(name="hook-1").exists()
    shown = w.client.get(created["Location"])  # the one showing of its secret
    w.refusals.append(("intake:destination_secret_shown (once)", shown.content.decode()))


def _checkpoint(h: Hostile, n: int, *, shown: bool = True) -> bytes:
    return json.dumps(
        {
            "type": "checkpoint.ready",
            "data": {
                "weight_version": h(f"webhook {n} weight_version", shown=shown),
                "model_path": "/ckpt/" + h(f"webhook {n} model_path", shown=shown),
                "step": 7,
                "metrics": {h(f"webhook {n} metrics key", shown=shown): 0.5},
                "checkpoint_digest": h(f"webhook {n} checkpoint digest", shown=shown),
            },
        }
    ).encode()


def trainer_webhooks(w: World) -> None:
    """Signed checkpoint events (and refused ones, which are audited with their details).

    The first delivery's refresh is rejected with a hostile reason; the second stays awaiting
    approval, so the approver's page shows it."""
    h = w.hostile
    for n in (1, 2):
        answer = post_webhook(Client(), _checkpoint(h, n), webhook_id=f"msg_{n:020d}")
        assert answer.status_code in (200, 202), answer.content
        # Intake stores the delivery; its task plans it (run here in-process).
        process_delivery(ReceivedWebhook.objects.get(webhook_id=f"msg_{n:020d}").pk)
        awaiting = PolicyRefresh.objects.filter(state=RefreshState.AWAITING_APPROVAL).first()
        assert awaiting is not None, answer.content
        if n == 1:
            w.client.post(f"/refreshes/{awaiting.pk}/reject/", {"reason": h("reject reason")})
            awaiting.refresh_from_db()
            assert awaiting.state != RefreshState.AWAITING_APPROVAL
    # Refused deliveries leave `webhook.rejected` audit rows carrying what was sent.
    unsigned = post_webhook(
        Client(),
        _checkpoint(h, 3, shown=False),  # an unsigned body is not stored
        headers={"webhook-id": h("webhook id header (unsigned)"), "webhook-timestamp": "1"},
    )
    assert 400 <= unsigned.status_code < 500, unsigned.content
    bad_type = post_webhook(
        Client(),
        json.dumps({"type": h("webhook event type"), "data": {}}).encode(),
        webhook_id="msg_" + "b" * 20,
    )
    assert 400 <= bad_type.status_code < 500, bad_type.content


def api_refresh_plan(w: World) -> None:
    """A planned refresh from the JSON API: its preview shows the exact call bodies."""
    h = w.hostile
    answer = w.client.post(
        "/api/v1/refreshes",
        json.dumps(
            {
                "source": "sim",
                "namespaces": ["rl-c"],
                "target": {
                    "weight_version": h("api weight_version"),
                    "method": "disk",
                    "model_path": "/c/" + h("api model_path"),
                },
            }
        ),
        content_type="application/json",
    )
    assert answer.status_code in (200, 201), answer.content
    w.planned = PolicyRefresh.objects.get(pk=answer.json()["id"])
    assert w.planned.state == RefreshState.PLANNED


def cli_policy_refresh_with_failing_workers(w: World) -> None:
    """`manage.py policy_refresh`, run to the end: one worker answers its update with a hostile
    error body and another with a hostile HTTP 500, so the refresh holds with their words in
    the step details, grid cells and journal; the others report the hostile version back."""
    h = w.hostile
    first, second = w.by_ns["rl-a"][:2]
    w.fleet.inject(first, "update_weights_from_disk", Fault.error(h("worker error body")))
    w.fleet.inject(second, "update_weights_from_disk", Fault.http(500, h("worker http 500")))
    with contextlib.suppress(CommandError, SystemExit):  # exit 1: held, as intended
        call_command(
            "policy_refresh",
            "sim",
            "--as",
            w.admin.username,
            "--weight-version",
            h("cli weight_version"),
            "--model-path",
            "/c/" + h("cli model_path"),
            "--namespace",
            "rl-a",
            "--yes",
        )
    held = PolicyRefresh.objects.filter(state=RefreshState.HELD).first()
    assert held is not None, list(
        PolicyRefresh.objects.values("state", "held_reason", "plan_blockers", "namespaces")
    )
    _discover(w.sim)  # the workers now report the hostile version they were given


def gate_force_reopen_reason(w: World) -> None:
    """Free text an approver types when forcing a gate open (audited)."""
    gate = Gate.objects.filter(source=w.sim, state=GateState.CLOSED).first()
    if gate is None:
        gate = Gate.objects.create(source=w.sim, namespace="rl-z", state=GateState.CLOSED)
    w.client.post(f"/refreshes/gates/{gate.pk}/force-reopen/", {"reason": w.hostile("reason")})


def quarantine_exits(w: World) -> None:
    """A drifted worker's quarantine (its key comes from discovery) and the exits a person
    takes on the worker page: a release reason (refused: it does not read back the target, so
    the reason is never stored) and a drop (refused while the worker is there)."""
    worker = Worker.objects.filter(source=w.sim).exclude(state="gone").order_by("pk").first()
    q = Quarantine.objects.create(
        source=w.sim,
        namespace=worker.namespace,
        instance_id=worker.instance_id,
        key=worker.key,
        worker=worker,
        kind="version",
        detail=w.hostile("quarantine detail"),
        state="failed",
        reason=w.hostile("quarantine reason"),
        paused=True,
        target={  # the gate's verified policy, as drift copies it
            "weight_version": w.hostile("quarantine target", shown=False),
            "method": "disk",
            "model_path": "/ckpt/v2",
        },
    )
    reason = w.hostile("quarantine release reason", shown=False)
    w.client.post(f"/refreshes/quarantines/{q.pk}/release/", {"reason": reason, "confirm": "1"})
    w.client.post(f"/refreshes/quarantines/{q.pk}/drop/", {"confirm": "1"})


def canary_verdict_from_the_trainer(w: World) -> None:
    """A canary in rl-e waiting for the trainer's verdict, answered over the API with hostile
    metric names, values and reason (the refresh page's canary panel and the audit history
    show them); the failed verdict rolls the canary back and holds the refresh."""
    h = w.hostile
    actor = Actor.for_user(w.admin)

    refresh = intents.plan_policy_refresh(
        source=w.sim,
        actor=actor,
        target={"weight_version": "canary-v", "method": "disk", "model_path": "/ckpt/canary"},
        namespaces=["rl-e"],
        strategy={"kind": "canary", "canary": {"size": 1, "evaluation": "trainer"}},
    )
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor, enqueue=False)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.CANARY_REVIEW, (refresh.state, refresh.held_reason)
    answer = w.client.post(
        f"/api/v1/refreshes/{refresh.pk}/canary_verdict",
        json.dumps(
            {
                "weight_version": "canary-v",
                "passed": False,
                "metrics": {h("canary metric name"): h("canary metric value")},
                "reason": h("canary verdict reason"),
            }
        ),
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.HELD, refresh.state
    w.refreshes.append(refresh)


def drill_records(w: World) -> None:
    """Rollback drills as the overview and the source page show them: the policies come from
    trainers (hostile versions), the reason and next step quote refreshes and workers."""
    from controlplane.refresh.models import DrillRun

    policy = {"weight_version": w.hostile("drill version"), "method": "disk", "model_path": "/c"}
    common = {
        "source": w.sim,
        "namespaces": [w.hostile("drill namespace")],
        "instances": [w.hostile("drill instance")],
        "current_policy": policy,
        "previous_policy": {**policy, "weight_version": w.hostile("drill previous version")},
        "requested_by_label": w.hostile("drill requester"),
    }
    DrillRun.objects.create(
        **common, outcome="succeeded", phase="done", forward_seconds=1.5, back_seconds=2.5
    )
    DrillRun.objects.create(
        **common,
        outcome="failed",
        reason=w.hostile("drill reason"),
        next_step=w.hostile("drill next step"),
    )


def policy_published_from_the_trainer(w: World) -> None:
    """A published policy (policy lag): its version is shown wherever lag is (the gates and
    source pages, the gate API); a hostile lineage is refused and audited."""
    h = w.hostile

    def published(n: int, **data) -> bytes:
        body = {"step": 8, "weight_version": h(f"published {n} weight_version", shown=False)}
        body |= {"checkpoint_digest": h(f"published {n} digest", shown=False), **data}
        return json.dumps({"type": "policy.published", "data": body}).encode()

    answer = post_webhook(Client(), published(1), webhook_id="msg_" + "p" * 20)
    assert answer.status_code == 200, answer.content
    refused = post_webhook(
        Client(), published(2, lineage=h("lineage", shown=False)), webhook_id="msg_" + "q" * 20
    )
    assert refused.status_code == 422, refused.content


def analysis_templates(w: World) -> None:
    """A source's analysis templates through the form, the API and the command line: notes are
    free text; a hostile name and a hostile field name are refused, the form showing them."""
    h = w.hostile
    prompts = [{"prompt": [i + 1, 2], "continuation": None} for i in range(20)]
    body = json.dumps({"prompts": prompts})
    saved = w.client.post(
        f"/sources/{w.sim.name}/analysis/",
        {"name": "held-out", "body": body, "note": h("analysis template note (form)")},
    )
    assert saved.status_code == 302, saved.content.decode()[:3000]
    for where, name, extra in (
        ("name", h("analysis template name (form)"), {}),
        ("body", "held-out", {h("analysis template field (form)"): 1}),
    ):
        refused = w.client.post(
            f"/sources/{w.sim.name}/analysis/",
            {
                "name": name,
                "body": json.dumps({"prompts": prompts, **extra}),
                "note": h(f"analysis template refused note ({where})"),
            },
        )
        assert refused.status_code == 400, refused.status_code
        w.refusals.append((f"analysis:templates (refused {where})", refused.content.decode()))
    api = w.client.put(
        f"/api/v1/sources/{w.sim.name}/analysis-templates/held-out",
        json.dumps(
            {
                "body": {"prompts": [*prompts[:-1], {"prompt": [9]}]},
                "note": h("analysis template note (api)"),
            }
        ),
        content_type="application/json",
    )
    assert api.status_code == 201, api.content
    refused_api = w.client.put(
        f"/api/v1/sources/{w.sim.name}/analysis-templates/held-out",
        json.dumps(
            {"body": {"prompts": prompts, h("analysis template field (api)", shown=False): 1}}
        ),
        content_type="application/json",
    )
    assert refused_api.status_code == 400, refused_api.content
    path = Path(tempfile.mkdtemp()) / "template.json"
    path.write_text(json.dumps({"prompts": prompts, "max_tokens": 8}))
    call_command(
        "analysis_template",
        "set",
        w.sim.name,
        "held-out",
        "--file",
        str(path),
        "--note",
        h("analysis template note (cli)"),
        stdout=io.StringIO(),
    )


def canary_analysis_reports(w: World) -> None:
    """A canary analysis report and a watch record of the canary refresh: the worker keys,
    the frontend's error texts and the replies in it are outside data (a worker or frontend
    answers them), shown on the analysis page and in the API."""
    from controlplane.analysis.models import AnalysisTemplate
    from controlplane.refresh.models import AnalysisPhase, CanaryAnalysis

    h = w.hostile
    refresh = next(r for r in w.refreshes if (r.progress or {}).get("canary"))
    template = AnalysisTemplate.objects.filter(source=w.sim).order_by("-version").first()
    assert template is not None
    metric = {
        "name": "ref_logprob",
        "group": "drift",
        "direction": "decrease",
        "allowed_effect": 0.1,
        "critical": True,
        "must_have_data": True,
        "verdict": "fail",
        "reason": h("analysis metric reason"),
        "n_baseline": 2,
        "n_canary": 2,
        "median_baseline": -0.5,
        "median_canary": -3.0,
        "u": 0.0,
        "p_value": 0.01,
        "method": "exact",
        "effect": -2.5,
    }
    CanaryAnalysis.objects.create(
        refresh=refresh,
        phase=AnalysisPhase.CANARY,
        template=template,
        state="done",
        outcome="fail",
        score=40.0,
        summary=h("analysis summary"),
        report={
            "judge": {"outcome": "fail", "score": 40.0, "summary": "", "metrics": [metric]},
            "cohorts": {"baseline": [h("analysis baseline key")], "canary": [h("canary key")]},
            "values": {
                "baseline": {"ref_logprob": [-0.5, -0.4]},
                "canary": {"ref_logprob": [-3, -2]},
            },
            "moved_most": [
                {
                    "prompt_index": 0,
                    "prompt_ids": [1, 2],
                    "ref_logprob_shift": -2.5,
                    "kl_estimate": 2.5,
                    "output_divergence": 1.0,
                    "baseline_ids": [3],
                    "canary_ids": [],
                    "baseline_finish": "length",
                    "canary_finish": None,
                    "baseline_error": None,
                    "canary_error": h("frontend error text"),
                }
            ],
            "prompts": 20,
        },
    )
    CanaryAnalysis.objects.create(
        refresh=refresh,
        phase=AnalysisPhase.BACKGROUND,
        template=template,
        report={
            "ticks": [
                {
                    "at": "2026-12-06T00:00:00+00:00",
                    "workers": 1,
                    "prompts": [0],
                    "breaches": [{"key": h("watch breach key"), "why": h("watch breach why")}],
                    "fleet_wide": False,
                }
            ],
            "breaches": [{"key": h("watch breach key (total)"), "why": "500"}],
        },
    )


CHANNELS: list[Callable[[World], None]] = [
    discovery_payloads,
    sources_via_forms_and_api,
    static_workers_via_form,
    webhook_endpoints_tokens_destinations,
    trainer_webhooks,
    policy_published_from_the_trainer,
    api_refresh_plan,
    cli_policy_refresh_with_failing_workers,
    gate_force_reopen_reason,
    quarantine_exits,
    canary_verdict_from_the_trainer,
    drill_records,
    analysis_templates,
    canary_analysis_reports,
]


# -- pages ----------------------------------------------------------------------------------

#: Named routes that are not pages: they only accept POST (checked to answer GET with 405).
POST_ONLY = {
    "fleet:run_discovery",
    "fleet:static_worker_delete",
    "refresh:start",
    "refresh:discard",
    "refresh:approve",
    "refresh:reject",
    "refresh:abort",
    "refresh:retry",
    "refresh:rollback",
    "refresh:force_reopen",
    "refresh:end",
    "refresh:resolve_membership",
    "refresh:reopen_verified",
    "refresh:force_reopen_namespace",
    "refresh:pause",
    "refresh:continue",
    "refresh:approve_canary",
    "refresh:reject_canary",
    "refresh:quarantine_retry",
    "refresh:quarantine_release",
    "refresh:quarantine_drop",
    "refresh:drill_start",
    "intake:token_revoke",
    "intake:endpoint_rotate",
    "intake:endpoint_remove_secret",
    "intake:endpoint_test",
    "intake:destination_secret",
    "intake:destination_test",
    "accounts:logout",
}
#: API operations that share a GET path with a listing, so GET reaches the listing instead.
API_WRITES = {
    "create_source",
    "update_source",
    "delete_source",
    "run_discovery_now",
    "plan_refresh",
    "start_refresh",
    "approve_refresh",
    "reject_refresh",
    "abort_refresh",
    "retry_refresh",
    "rollback_refresh",
    "force_reopen",
    "end_refresh",
    "resolve_refresh_membership",
    "reopen_verified_namespaces",
    "force_reopen_refresh_namespace",
    "trainer_webhook",
    "retry_quarantine",
    "release_quarantine",
    "drop_quarantine",
    "report_broadcast_done",  # POST only; its body is the trainer's, checked like any write
    "record_canary_verdict",  # POST only; the trainer's verdict, checked like any write
    "report_applied",  # POST only; the trainer's applied report, checked like any write
    "start_source_drill",
    "put_analysis_template",
}
#: Query parameters the pages read (filters, sort, pagination), each sent hostile too.
#: Query parameters some page shows back. `page` is not one: every pager parses it as a number
#: and links the page it shows, so a hostile `page` is never reflected (it still must not 500).
REFLECTED = ("namespace", "state", "version", "route", "sort", "actor", "target", "q")


def named_routes() -> dict[str, str]:
    """Every named URL pattern: name → pattern text."""

    def walk(patterns, prefix="", namespace=""):
        for p in patterns:
            if isinstance(p, URLResolver):
                ns = namespace + (f"{p.namespace}:" if p.namespace else "")
                yield from walk(p.url_patterns, prefix + str(p.pattern), ns)
            elif isinstance(p, URLPattern) and p.name:
                yield namespace + p.name, prefix + str(p.pattern)

    return dict(walk(get_resolver().url_patterns))


def _route_urls(w: World) -> dict[str, list[str]]:
    sim = w.sim
    refreshes = list(PolicyRefresh.objects.order_by("pk"))
    workers = list(Worker.objects.filter(source=sim))
    endpoint = WebhookEndpoint.objects.get(name="trainer-a")
    destination = NotificationDestination.objects.get(name="hook-1")
    all_sources = [sim, *w.sources]
    r = [p.pk for p in refreshes]
    # Every version a refresh named (hostile ones from webhooks and the API included).
    versions = sorted({str(p.weight_version) for p in refreshes})
    return {
        "provenance:version": [reverse("provenance:version", args=[v]) for v in versions],
        "intake:api-v1:get_provenance": [
            reverse("intake:api-v1:get_provenance", args=[v]) for v in versions
        ],
        # The serving ledger's answer for an instance (hostile keys and versions in it), and
        # hostile input itself.
        "intake:api-v1:get_instance_provenance": [
            *(
                "/api/v1/provenance?"
                + urlencode({"instance_id": x.instance_id, "from": "2020-01-01T00:00:00Z"})
                for x in workers[:3]
            ),
            "/api/v1/provenance?" + urlencode({"instance_id": PAYLOAD, "at": PAYLOAD}),
        ],
        # Global search echoes its query and lists hostile keys, namespaces and versions.
        "search:search": [
            "/search/",
            "/search/?" + urlencode({"q": PAYLOAD}),
            *("/search/?" + urlencode({"q": q}) for q in {x.namespace[:12] for x in workers}),
            *("/search/?" + urlencode({"q": x.key}) for x in workers[:3]),
            *("/search/?" + urlencode({"q": v}) for v in versions),
            *(f"/search/?q=%23{pk}" for pk in r),
        ],
        "fleet:overview": ["/"],
        "fleet:source_create": ["/sources/new/"],
        "fleet:source": [f"/sources/{s.pk}/" for s in all_sources],
        "fleet:source_map": [f"/sources/{s.pk}/map/" for s in all_sources],
        "fleet:source_map_data": [f"/sources/{s.pk}/map.json" for s in all_sources],
        "fleet:serving_health": [f"/sources/{s.pk}/serving-health/" for s in all_sources],
        "fleet:source_edit": [f"/sources/{s.pk}/edit/" for s in all_sources],
        "fleet:source_delete": [f"/sources/{s.pk}/delete/" for s in all_sources],
        "fleet:static_worker_create": [f"/sources/{sim.pk}/static-workers/new/"],
        "fleet:worker": [f"/workers/{x.pk}/" for x in workers],
        "fleet:metrics": ["/metrics"],
        "analysis:templates": [f"/sources/{s.name}/analysis/" for s in all_sources],
        "refresh:analysis": [f"/refreshes/{pk}/analysis/" for pk in r],
        "intake:api-v1:list_analyses": [f"/api/v1/refreshes/{pk}/analyses" for pk in r],
        "analysis:template": [
            f"/sources/{sim.name}/analysis/held-out/",
            *(f"/sources/{sim.name}/analysis/held-out/?version={v}" for v in (1, 2, 3)),
        ],
        "intake:api-v1:list_analysis_templates": [
            f"/api/v1/sources/{s.name}/analysis-templates" for s in all_sources
        ],
        "intake:api-v1:get_analysis_template": [
            f"/api/v1/sources/{sim.name}/analysis-templates/held-out",
            f"/api/v1/sources/{sim.name}/analysis-templates/held-out?version=1",
        ],
        "refresh:list": ["/refreshes/"],
        "refresh:inbox": ["/refreshes/inbox/"],
        "refresh:plan": ["/refreshes/new/"],
        "refresh:source_strategy": [f"/refreshes/sources/{s.pk}/strategy/" for s in all_sources],
        # The rollback form: the revision history (hostile versions) and each refresh's scope.
        "refresh:rollback_plan": [
            *(f"/refreshes/sources/{s.pk}/rollback/" for s in all_sources),
            *(f"/refreshes/sources/{sim.pk}/rollback/?of={pk}" for pk in r),
        ],
        "refresh:gates": ["/refreshes/gates/"],
        "refresh:gate_actions": [f"/refreshes/gates/{g.pk}/actions/" for g in Gate.objects.all()],
        "refresh:detail": [f"/refreshes/{pk}/" for pk in r],
        "refresh:actions": [f"/refreshes/{pk}/actions/" for pk in r],
        "refresh:drill": [f"/refreshes/drills/{pk}/" for pk in _drill_ids()],
        "refresh:worker_timeline": [f"/refreshes/{pk}/worker-timeline/" for pk in r],
        "intake:admin_index": ["/admin-tools/"],
        "intake:token_list": ["/admin-tools/tokens/"],
        "intake:token_create": ["/admin-tools/tokens/new/"],
        "intake:endpoint_list": ["/admin-tools/webhooks/"],
        "intake:endpoint_create": ["/admin-tools/webhooks/new/"],
        "intake:endpoint": [f"/admin-tools/webhooks/{endpoint.pk}/"],
        # Shown once, after the create (above): from then on a redirect with a message.
        "intake:endpoint_secret_shown": [f"/admin-tools/webhooks/{endpoint.pk}/new-secret/"],
        "intake:destination_secret_shown": [
            f"/admin-tools/notifications/{destination.pk}/new-secret/"
        ],
        "intake:token_created": [
            f"/admin-tools/tokens/{pk}/created/"
            for pk in ApiToken.objects.values_list("pk", flat=True)
        ]
        or ["/admin-tools/tokens/1/created/"],
        "intake:endpoint_edit": [f"/admin-tools/webhooks/{endpoint.pk}/edit/"],
        "intake:endpoint_delete": [f"/admin-tools/webhooks/{endpoint.pk}/delete/"],
        "intake:destination_list": ["/admin-tools/notifications/"],
        "intake:destination_create": ["/admin-tools/notifications/new/"],
        "intake:destination": [f"/admin-tools/notifications/{destination.pk}/"],
        "intake:destination_edit": [f"/admin-tools/notifications/{destination.pk}/edit/"],
        "intake:destination_delete": [f"/admin-tools/notifications/{destination.pk}/delete/"],
        "accounts:login": ["/accounts/login/"],
        # Single sign-on is off here, so these answer 404; SSO's own tests drive them.
        "accounts:sso_login": ["/accounts/sso/login/"],
        "accounts:sso_callback": ["/accounts/sso/callback/"],
        "audit:history": ["/history/", "/history/?page=2"],
        "audit:export": ["/history/export?format=jsonl", "/history/export?format=csv"],
        "intake:api-v1:openapi-json": ["/api/v1/openapi.json"],
        "intake:api-v1:api-root": ["/api/v1/"],
        "intake:api-v1:docs": ["/api/v1/docs"],
        "intake:api-v1:list_sources": ["/api/v1/sources"],
        "intake:api-v1:get_source": [f"/api/v1/sources/{s.name}" for s in all_sources],
        "intake:api-v1:list_workers": ["/api/v1/workers"],
        "intake:api-v1:get_worker": [f"/api/v1/workers/{x.pk}" for x in workers],
        "intake:api-v1:list_observations": ["/api/v1/observations"],
        "intake:api-v1:get_observation": [
            f"/api/v1/observations/{pk}"
            for pk in sim.discovery_runs.values_list("pk", flat=True)[:5]
        ],
        "intake:api-v1:list_gates": ["/api/v1/gates"],
        "intake:api-v1:get_gate": [
            f"/api/v1/gates/{g.source.name}/{g.namespace}" for g in Gate.objects.all()
        ],
        "intake:api-v1:list_quarantines": ["/api/v1/quarantines"],
        "intake:api-v1:get_quarantine": [
            f"/api/v1/quarantines/{pk}" for pk in Quarantine.objects.values_list("pk", flat=True)
        ],
        "intake:api-v1:list_source_drills": [
            f"/api/v1/sources/{s.name}/drills" for s in all_sources
        ],
        "intake:api-v1:get_drill": [f"/api/v1/drills/{pk}" for pk in _drill_ids()],
        "intake:api-v1:list_refreshes": ["/api/v1/refreshes"],
        "intake:api-v1:get_refresh": [f"/api/v1/refreshes/{pk}" for pk in r],
        "intake:api-v1:get_refresh_group": [f"/api/v1/refreshes/{pk}/group" for pk in r],
        "intake:api-v1:get_refresh_external": [f"/api/v1/refreshes/{pk}/external" for pk in r],
        "intake:api-v1:get_refresh_capacity": [f"/api/v1/refreshes/{pk}/capacity" for pk in r],
        "intake:api-v1:list_refresh_journal": [f"/api/v1/refreshes/{pk}/journal" for pk in r],
        "intake:api-v1:get_refresh_call": [
            f"/api/v1/refreshes/{refresh_id}/journal/{pk}"
            for pk, refresh_id in JournalEntry.objects.filter(refresh_id__in=r).values_list(
                "pk", "refresh_id"
            )[:20]
        ],
        "intake:api-v1:list_audit_events": ["/api/v1/audit/events"],
        "intake:api-v1:export_audit_events": ["/api/v1/audit/events/export"],
        "intake:api-v1:get_delivery": [
            f"/api/v1/webhooks/deliveries/{d.webhook_id}" for d in ReceivedWebhook.objects.all()
        ],
    }


def _drill_ids() -> list[int]:
    from controlplane.refresh.models import DrillRun

    return list(DrillRun.objects.values_list("pk", flat=True))


@dataclass
class Tally:
    checked: int = 0
    frames: int = 0
    problems: list[str] = field(default_factory=list)
    bodies: list[str] = field(default_factory=list)  # every checked body, for coverage

    def html(self, where: str, body: str) -> None:
        self.checked += 1
        self.bodies.append(body)
        self.problems += [f"{where}: {p}" for p in unescaped(body)]

    def response(self, where: str, response) -> None:
        self.problems += [f"{where}: {p}" for p in csp_problems(response)]
        content_type = response.get("Content-Type", "")
        body = b"".join(response.streaming_content) if response.streaming else response.content
        text = body.decode("utf-8", "replace")
        if "text/html" in content_type:
            self.html(where, text)
        else:
            # Not HTML: must say so (nosniff is on), so a browser never renders it as markup.
            self.checked += 1
            self.bodies.append(text)
            if not content_type or "html" in content_type:
                self.problems.append(f"{where}: served as {content_type!r}")


def _check_pages(w: World, tally: Tally) -> set[str]:
    """GET every named route (plain, as an htmx partial, with hostile query parameters)."""
    urls = _route_urls(w)
    routes = named_routes()
    missing = []
    for name in routes:
        short = name.rsplit(":", 1)[-1]
        if name in POST_ONLY or (name.startswith("intake:api-v1:") and short in API_WRITES):
            continue
        if not urls.get(name):
            missing.append(name)
    assert not missing, f"named GET routes with no coverage in this suite: {missing}"
    for name in POST_ONLY:
        pattern = routes[name]
        url = "/" + pattern.replace("<int:pk>", "1")
        status = w.client.get(url).status_code
        assert status in (405, 404), f"{name} answers GET with {status}: make it a covered page"
    hostile_query = "&".join(f"{p}={_quote(w.hostile('reflected ' + p))}" for p in REFLECTED)
    hostile_query += "&page=" + _quote("</a><script>x()</script>")  # parsed, never shown
    for name, url_list in urls.items():
        for url in url_list:
            response = w.client.get(url)
            assert response.status_code < 500, (url, response.status_code)
            tally.response(url, response)
            partial = w.client.get(url, HTTP_HX_REQUEST="true")
            tally.response(f"{url} (htmx)", partial)
            if name == "audit:export":
                continue  # reflected `format` is test_audit_export_reflects_format below
            sep = "&" if "?" in url else "?"
            reflected = w.client.get(f"{url}{sep}{hostile_query}")
            assert reflected.status_code < 500, (url, reflected.status_code)
            tally.response(f"{url} (hostile query)", reflected)
    for where, body in w.refusals:
        tally.html(where, body)
    return set(urls)


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


# -- websocket streams ----------------------------------------------------------------------


def _stream_paths(w: World) -> dict[str, list[str]]:
    return {
        "ws/fleet/": ["/ws/fleet/"],
        "ws/fleet/sources/<int:source_id>/": [
            f"/ws/fleet/sources/{s.pk}/" for s in [w.sim, *w.sources]
        ]
        + [f"/ws/fleet/sources/{w.sim.pk}/?namespace=rl-a&version={_quote(PAYLOAD)}"],
        "ws/refreshes/<int:refresh_id>/": [
            f"/ws/refreshes/{pk}/" for pk in PolicyRefresh.objects.values_list("pk", flat=True)
        ],
        "ws/refresh-banner/<int:source_id>/": [
            "/ws/refresh-banner/0/",
            f"/ws/refresh-banner/{w.sim.pk}/",
        ],
        "ws/gates/": ["/ws/gates/"],
        "ws/gate-table/": ["/ws/gate-table/"],
        "ws/inbox/": ["/ws/inbox/"],
        "ws/refresh-list/": [
            "/ws/refresh-list/",
            f"/ws/refresh-list/?who={_quote(PAYLOAD)}&state={_quote(PAYLOAD)}",
        ],
    }


async def _frames(path: str, user, *, then: Callable | None = None, until=None) -> list[str]:
    """The resync frame, then (with `then`) every frame until `until(frames)` holds.

    `then` runs on its own thread (like a Celery worker) while the consumer keeps running on
    this loop, so its pushes queue up; each read then has one overall deadline (a communicator
    read that times out cancels the application, so it is not a polling tool).
    """
    from controlplane.routing import websocket_urlpatterns

    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    connected, code = await communicator.connect()
    assert connected, (path, code)
    frames = [await communicator.receive_from(timeout=20)]
    if then is not None:
        await asyncio.to_thread(then)
        deadline = time.monotonic() + 30
        while not until(frames):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{path}: no expected push in {len(frames)} frames"
            frames.append(await communicator.receive_from(timeout=remaining))
    await communicator.disconnect()
    return frames


def _in_thread(fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        finally:
            connections.close_all()

    return run


def _check_streams(w: World, tally: Tally) -> None:
    from controlplane.routing import websocket_urlpatterns

    paths = _stream_paths(w)
    uncovered = [str(p.pattern) for p in websocket_urlpatterns if str(p.pattern) not in paths]
    assert not uncovered, f"websocket routes with no coverage in this suite: {uncovered}"

    async def read_all() -> list[tuple[str, list[str]]]:
        read = []
        for path_list in paths.values():
            for path in path_list:
                read.append((path, await _frames(path, w.admin)))
        # Pushed, not resynced: a discovery refresh while the source stream listens (rows
        # built by fleet.rows), and a refresh executing while its own stream listens.
        source_path = f"/ws/fleet/sources/{w.sim.pk}/"
        pushed = w.hostile("pushed worker version")
        w.fleet.set_version(w.by_ns["rl-b"][0], pushed)
        read.append(
            (
                source_path + " (push)",
                await _frames(
                    source_path,
                    w.admin,
                    then=_in_thread(lambda: _discover(w.sim)),
                    until=lambda frames: any(pushed[:6] in f for f in frames[1:]),
                ),
            )
        )
        planned = w.planned
        w.fleet.inject(
            w.by_ns["rl-c"][0], "update_weights_from_disk", Fault.error(w.hostile("pushed error"))
        )
        await database_sync_to_async(intents.start_policy_refresh)(
            planned, actor=SETUP, enqueue=False
        )
        read.append(
            (
                f"/ws/refreshes/{planned.pk}/ (push)",
                await _frames(
                    f"/ws/refreshes/{planned.pk}/",
                    w.admin,
                    then=_in_thread(lambda: execute_refresh(planned.pk)),
                    until=lambda frames: any('data-state="held"' in f for f in frames),
                ),
            )
        )
        return read

    try:
        streams = async_to_sync(read_all)()
    finally:
        channel_layers.backends.clear()
    for path, frames in streams:
        tally.frames += len(frames)
        for i, frame in enumerate(frames):
            if path.startswith("/ws/gates/"):
                json.loads(frame)  # data for machines, never markup
                tally.checked += 1
                tally.bodies.append(frame)
                if any(c in frame for c in "\u202e\u2066"):
                    tally.problems.append(f"{path} frame {i}: raw bidi control in JSON")
            else:
                tally.html(f"{path} frame {i}", frame)


# -- the test -------------------------------------------------------------------------------


def test_no_page_partial_or_frame_shows_a_hostile_string_unescaped(
    simfleet_factory, admin_user, settings
):
    settings.NOTIFICATION_MAX_ATTEMPTS = 1
    client = Client()
    client.force_login(admin_user)
    world = World(
        hostile=Hostile(), admin=admin_user, client=client, fleet_factory=simfleet_factory
    )
    for channel in CHANNELS:
        channel(world)

    tally = Tally()
    _check_pages(world, tally)
    _check_streams(world, tally)

    seen = "\n".join(tally.bodies)
    never_shown = [
        f"{v.channel} ({v.tag})" for v in world.hostile.values if v.shown and v.tag not in seen
    ]
    strings = len(world.hostile.values)
    print(
        f"\nhostile input: {tally.checked} pages, partials and websocket frames "
        f"({tally.frames} frames) x {strings} hostile strings checked, "
        f"{len(tally.problems)} unescaped"
    )
    markup_first = sorted(tally.problems, key=lambda p: "bidi" in p)
    assert not tally.problems, "\n".join(markup_first[:40])
    # A value no page ever showed proves nothing: the channel would not have been exercised.
    assert not never_shown, f"hostile values that reached no page or frame: {never_shown}"


def test_audit_export_does_not_reflect_an_unknown_format_as_markup(admin_client):
    response = admin_client.get("/history/export", {"format": PAYLOAD})
    assert response.status_code == 400
    is_html = "text/html" in response["Content-Type"]
    assert not (is_html and unescaped(response.content.decode()))

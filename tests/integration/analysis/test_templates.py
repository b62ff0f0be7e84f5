"""Saving analysis templates (PostgreSQL): versions are append-only, an identical body is a
no-op, bad input and a refused permission store nothing, every save is audited; the command
line and the pages save through the same service."""

from __future__ import annotations

import io
import json

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from controlplane.analysis import services
from controlplane.analysis.models import AnalysisTemplate
from controlplane.analysis.spec import MAX_TEMPLATE_BYTES, parse_template, template_size
from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from tests.integration.analysis.conftest import body, cases

pytestmark = pytest.mark.django_db

SAVED = AuditAction.ANALYSIS_TEMPLATE_SAVED


def test_each_edit_writes_the_next_version_and_old_ones_stay(source, admin_user):
    actor = Actor.for_user(admin_user)
    v1 = services.save_template(source, "held-out", body(20), actor=actor, note="first")
    v2 = services.save_template(source, "held-out", body(21), actor=actor, note="one more")
    assert (v1.version, v2.version) == (1, 2)
    assert AnalysisTemplate.latest(source, "held-out") == v2
    old = services.get_version(source, "held-out", 1)
    assert old is not None and len(old.body["prompts"]) == 20 and old.note == "first"
    assert old.body == parse_template(body(20)).to_dict()  # stored with every default
    assert [t.version for t in services.versions_of(source, "held-out")] == [2, 1]
    events = AuditEvent.objects.filter(action=SAVED).order_by("sequence")
    assert [e.details["version"] for e in events] == [1, 2]
    assert events[1].details["replaces_version"] == 1
    assert events[1].details["prompts"] == 21
    assert events[1].actor_label == admin_user.get_username()
    assert events[1].target_id == str(v2.pk)


def test_names_are_versioned_apart_and_per_source(source, admin_user):
    other = Source.objects.create(
        name="src-b", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    actor = Actor.for_user(admin_user)
    services.save_template(source, "a", body(), actor=actor)
    services.save_template(source, "a", body(22), actor=actor)
    services.save_template(source, "b", body(), actor=actor)
    services.save_template(other, "a", body(), actor=actor)
    assert [(t.name, t.version) for t in services.templates_of(source)] == [("a", 2), ("b", 1)]
    assert [(t.name, t.version) for t in services.templates_of(other)] == [("a", 1)]


def test_saving_an_identical_body_is_a_no_op(source, admin_user):
    actor = Actor.for_user(admin_user)
    first = services.save_template(source, "t", body(), actor=actor)
    # The same template written out in full (defaults filled in) is the same body too.
    again = services.save_template(source, "t", first.body, actor=actor, note="no change")
    assert again.pk == first.pk and again.version == 1
    assert AnalysisTemplate.objects.count() == 1
    assert AuditEvent.objects.filter(action=SAVED).count() == 1


def test_a_bad_body_changes_nothing(source, admin_user):
    actor = Actor.for_user(admin_user)
    services.save_template(source, "t", body(), actor=actor)
    with pytest.raises(ValidationError) as caught:
        services.save_template(
            source, "t", body(judge={"pass_score": 50, "marginal_score": 60}), actor=actor
        )
    assert "judge.marginal_score" in caught.value.message_dict
    with pytest.raises(ValidationError) as caught:
        services.save_template(source, "t", body(5), actor=actor)
    assert "prompts" in caught.value.message_dict
    with pytest.raises(ValidationError) as caught:
        services.save_template(source, "Not a slug!", body(), actor=actor)
    assert "name" in caught.value.message_dict
    assert AnalysisTemplate.objects.count() == 1
    assert AuditEvent.objects.filter(action=SAVED).count() == 1


@pytest.mark.parametrize("persona", ["viewer", "operator", "approver"])
def test_only_those_who_manage_sources_may_save(source, persona, request):
    user = request.getfixturevalue(persona)
    with pytest.raises(PermissionDenied):
        services.save_template(source, "t", body(), actor=Actor.for_user(user))
    assert not AnalysisTemplate.objects.exists()
    assert not AuditEvent.objects.filter(action=SAVED).exists()


# -- the command line ---------------------------------------------------------------------------
def run(*args, stdin: str | None = None) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("analysis_template", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_cli_set_show_list(source, tmp_path, admin_user):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(body()))
    out, _ = run("set", "src-a", "held-out", "--file", str(path), "--note", "from the CLI")
    assert out.strip() == "saved held-out v1"
    event = AuditEvent.objects.get(action=SAVED)
    assert event.actor_label == "manage.py analysis_template"
    assert event.details["note"] == "from the CLI"
    # show prints the body alone: its output is a file `set` takes back, unchanged.
    shown, err = run("show", "src-a", "held-out")
    assert "held-out v1" in err and "from the CLI" in err
    assert json.loads(shown) == AnalysisTemplate.latest(source, "held-out").body
    path.write_text(shown)
    out, _ = run("set", "src-a", "held-out", "--file", str(path))
    assert out.startswith("unchanged") and AnalysisTemplate.objects.count() == 1
    # As a named user, whose role is checked and who the audit row names.
    path.write_text(json.dumps(body(25)))
    out, _ = run(
        "set", "src-a", "held-out", "--file", str(path), "--as", admin_user.username, "--json"
    )
    assert json.loads(out) == {"ok": True, "name": "held-out", "version": 2, "created": True}
    assert (
        AuditEvent.objects.filter(action=SAVED).order_by("sequence").last().actor_label
        == admin_user.username
    )
    listed, _ = run("list", "src-a", "--json")
    assert [(t["name"], t["version"], t["prompts"]) for t in json.loads(listed)["templates"]] == [
        ("held-out", 2, 25)
    ]
    old, _ = run("show", "src-a", "held-out", "--version", "1", "--json")
    assert json.loads(old)["version"] == 1 and len(json.loads(old)["body"]["prompts"]) == 20


def test_cli_refusals_store_nothing(source, tmp_path, viewer):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(body(3)))
    with pytest.raises(CommandError) as caught:
        run("set", "src-a", "t", "--file", str(path))
    assert caught.value.returncode == 2 and "prompts" in str(caught.value)
    path.write_text("{not json")
    with pytest.raises(CommandError) as caught:
        run("set", "src-a", "t", "--file", str(path))
    assert caught.value.returncode == 2 and "not valid JSON" in str(caught.value)
    path.write_text(json.dumps(body()))
    with pytest.raises(CommandError) as caught:
        run("set", "src-a", "t", "--file", str(path), "--as", viewer.username)
    assert caught.value.returncode == 3
    with pytest.raises(CommandError) as caught:
        run("set", "nowhere", "t", "--file", str(path))
    assert caught.value.returncode == 4
    with pytest.raises(CommandError) as caught:
        run("show", "src-a", "t")
    assert caught.value.returncode == 4
    assert not AnalysisTemplate.objects.exists()
    assert not AuditEvent.objects.filter(action=SAVED).exists()


# -- the pages ----------------------------------------------------------------------------------
def test_the_source_page_links_the_templates(source, viewer_client):
    page = viewer_client.get(f"/sources/{source.pk}/")
    assert f'href="/sources/{source.name}/analysis/"' in page.content.decode()


def test_a_viewer_reads_but_cannot_save(source, admin_user, viewer_client):
    services.save_template(source, "t", body(), actor=Actor.for_user(admin_user), note="n1")
    listing = viewer_client.get("/sources/src-a/analysis/")
    assert listing.status_code == 200
    html = listing.content.decode()
    assert "/sources/src-a/analysis/t/" in html and 'id="template-form"' not in html
    detail = viewer_client.get("/sources/src-a/analysis/t/")
    assert detail.status_code == 200 and 'id="template-form"' not in detail.content.decode()
    refused = viewer_client.post(
        "/sources/src-a/analysis/", {"name": "t", "body": json.dumps(body(22))}
    )
    assert refused.status_code == 403
    assert AnalysisTemplate.objects.count() == 1


def test_saving_from_the_page_with_a_prompt_file(source, admin_client):
    lines = "\n".join(json.dumps(c) for c in cases(24)).encode()
    answer = admin_client.post(
        "/sources/src-a/analysis/",
        {
            "name": "held-out",
            "body": json.dumps(body(0, min_prompts=20)),
            "note": "uploaded",
            "prompt_file": SimpleUploadedFile("p.jsonl", lines, "application/x-ndjson"),
        },
    )
    assert answer.status_code == 302, answer.content.decode()[:3000]
    assert answer["Location"] == "/sources/src-a/analysis/held-out/"
    saved = AnalysisTemplate.latest(source, "held-out")
    assert saved is not None and len(saved.body["prompts"]) == 24 and saved.note == "uploaded"
    page = admin_client.get(answer["Location"])
    html = page.content.decode()
    assert page.status_code == 200 and "held-out v1" in html and 'id="template-form"' in html
    assert "kl_estimate" in html


def test_a_bad_body_from_the_page_is_shown_and_nothing_stored(source, admin_client):
    answer = admin_client.post(
        "/sources/src-a/analysis/",
        {"name": "t", "body": json.dumps(body(judge={"metrics": ["reward"]}))},
    )
    assert answer.status_code == 400
    assert "judge.metrics[0].name: unknown metric" in answer.content.decode().replace("&#x27;", "'")
    bad_json = admin_client.post("/sources/src-a/analysis/", {"name": "t", "body": "{"})
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.content.decode()
    too_big = admin_client.post(
        "/sources/src-a/analysis/",
        {
            "name": "t",
            "body": json.dumps(body()),
            "prompt_file": SimpleUploadedFile("p.jsonl", b" " * (1024 * 1024 + 1)),
        },
    )
    assert too_big.status_code == 400 and "at most 1048576" in too_big.content.decode()
    assert not AnalysisTemplate.objects.exists()


def test_any_version_opens_whole(source, admin_user, viewer_client):
    actor = Actor.for_user(admin_user)
    services.save_template(source, "t", body(20), actor=actor, note="first")
    services.save_template(source, "t", body(21), actor=actor, note="second")
    old = viewer_client.get("/sources/src-a/analysis/t/?version=1")
    html = old.content.decode()
    assert old.status_code == 200 and "t v1" in html and "An older version" in html
    assert "?version=2" in html and "first" in html
    assert html.count("{&quot;prompt&quot;:[") == 20
    assert viewer_client.get("/sources/src-a/analysis/t/?version=3").status_code == 404
    for odd in ("x", "²", "9" * 30, "-1", "1.0"):
        assert viewer_client.get(f"/sources/src-a/analysis/t/?version={odd}").status_code == 404
    assert viewer_client.get("/sources/src-a/analysis/nope/").status_code == 404
    assert viewer_client.get("/sources/nowhere/analysis/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_concurrent_saves_get_consecutive_versions(source, admin_user):
    """The source row serialises version numbers: saves racing on one template each get their
    own version instead of one failing on the unique constraint."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from django.db import connections

    actor = Actor.for_user(admin_user)
    barrier = Barrier(4)

    def save(n: int) -> int:
        try:
            barrier.wait(timeout=30)
            return services.save_template(source, "t", body(20 + n), actor=actor).version
        finally:
            connections.close_all()

    with ThreadPoolExecutor(4) as pool:
        versions = sorted(pool.map(save, range(4)))
    assert versions == [1, 2, 3, 4]
    stored = {len(t.body["prompts"]) for t in AnalysisTemplate.objects.all()}
    assert stored == {20, 21, 22, 23}
    assert AuditEvent.objects.filter(action=SAVED).count() == 4


def test_a_template_near_the_size_limit_goes_back_through_the_form_unchanged(
    source, admin_user, admin_client
):
    """What the page shows is what the form takes back: the largest templates included."""
    big = {"prompts": [{"prompt": [2**31 - 1] * 4000, "continuation": None}] * 23}
    assert 1_000_000 < template_size(big) <= MAX_TEMPLATE_BYTES
    saved = services.save_template(source, "big", big, actor=Actor.for_user(admin_user))
    page = admin_client.get("/sources/src-a/analysis/big/")
    shown = page.context["form"].initial["body"]
    answer = admin_client.post(
        "/sources/src-a/analysis/", {"name": "big", "body": shown, "note": "resent"}
    )
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    assert AnalysisTemplate.latest(source, "big") == saved  # identical: no new version


def test_the_check_a_plan_calls(source, admin_user):
    """What a plan calls before a canary analysis: the parsed template, or one clear error."""
    actor = Actor.for_user(admin_user)
    with pytest.raises(ValidationError) as caught:
        services.template_for_analysis(source, "held-out")
    assert caught.value.message_dict == {
        "analysis_template": ["src-a has no analysis template 'held-out'"]
    }
    saved = services.save_template(source, "held-out", body(20), actor=actor)
    template, spec = services.template_for_analysis(source, "held-out")
    assert template == saved and len(spec.prompts) == 20
    # A stored body with too few prompts (written before a limit rose, or by hand) is refused.
    short = {**saved.body, "prompts": saved.body["prompts"][:7]}
    AnalysisTemplate.objects.create(source=source, name="held-out", version=2, body=short)
    with pytest.raises(ValidationError) as caught:
        services.template_for_analysis(source, "held-out")
    (message,) = caught.value.message_dict["analysis_template"]
    assert message.startswith("analysis template held-out v2 of src-a: prompts: 7 prompts")
    assert "at least 20 (min_prompts)" in message
    assert services.template_for_analysis(source, "held-out", 1)[0] == saved
    with pytest.raises(ValidationError, match="no version 9 of analysis template"):
        services.template_for_analysis(source, "held-out", 9)

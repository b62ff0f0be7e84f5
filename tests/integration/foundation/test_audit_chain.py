"""The audit log is append-only and tamper-evident."""

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from controlplane.audit.actions import AuditAction
from controlplane.audit.chain import verify_chain
from controlplane.audit.models import AuditChainHead, AuditEvent
from controlplane.audit.recorder import Actor, record

pytestmark = pytest.mark.django_db


def _three_events(user):
    record(AuditAction.SOURCE_CREATED, actor=Actor.for_user(user), target=("fleet.source", 1, "a"))
    record(AuditAction.SOURCE_UPDATED, actor=Actor.system(), details={"interval": 5})
    record(AuditAction.SOURCE_REMOVED, actor=Actor.for_user(user), details={"big": 2**64 - 1})


def _verify():
    return verify_chain(
        AuditEvent.objects.order_by("sequence"), AuditChainHead.objects.filter(pk=1).first()
    )


def test_appended_events_form_a_verifiable_chain(operator):
    before = AuditEvent.objects.count()  # the persona's own user.created row
    _three_events(operator)
    events = list(AuditEvent.objects.order_by("sequence"))
    assert [e.sequence for e in events] == list(range(1, before + 4))
    assert events[-2].previous_hash == events[-3].entry_hash
    assert events[-1].details == {"big": 2**64 - 1}
    assert _verify().ok
    out = io.StringIO()
    call_command("audit", "verify", stdout=out)
    assert f"{before + 3} rows verified" in out.getvalue()


def test_application_cannot_update_or_delete_rows(operator):
    _three_events(operator)
    event = AuditEvent.objects.first()
    event.action = AuditAction.GATE_OPENED
    with pytest.raises(TypeError):
        event.save()
    with pytest.raises(TypeError):
        event.delete()
    with pytest.raises(TypeError):
        AuditEvent.objects.all().delete()
    with pytest.raises(TypeError):
        AuditEvent.objects.filter(sequence=1).update(action="x")


def _raw(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def test_modified_row_is_detected(operator):
    _three_events(operator)
    _raw("UPDATE audit_auditevent SET actor_label = %s WHERE sequence = 3", ["mallory"])
    report = _verify()
    assert not report.ok and report.first_bad_sequence == 3
    with pytest.raises(CommandError, match="row #3"):
        call_command("audit", "verify")


def test_modified_details_are_detected(operator):
    _three_events(operator)
    _raw("UPDATE audit_auditevent SET details = %s WHERE sequence = 3", ['{"interval": 50}'])
    assert _verify().first_bad_sequence == 3


def test_deleted_middle_row_is_detected(operator):
    _three_events(operator)
    _raw("DELETE FROM audit_auditevent WHERE sequence = 3")
    report = _verify()
    assert not report.ok and report.first_bad_sequence == 4


def test_deleted_last_row_is_detected(operator):
    _three_events(operator)
    _raw("DELETE FROM audit_auditevent WHERE sequence = 4")
    report = _verify()
    assert not report.ok and "deleted" in report.problem


def test_reordered_rows_are_detected(operator):
    _three_events(operator)
    # Swap the contents of rows 1 and 2 (keeping sequence numbers): links no longer match.
    _raw("UPDATE audit_auditevent SET sequence = 100 WHERE sequence = 1")
    _raw("UPDATE audit_auditevent SET sequence = 1 WHERE sequence = 2")
    _raw("UPDATE audit_auditevent SET sequence = 2 WHERE sequence = 100")
    report = _verify()
    assert not report.ok and report.first_bad_sequence == 1


def test_export_streams_every_row(operator):
    _three_events(operator)
    out = io.StringIO()
    call_command("audit", "export", "--format", "jsonl", stdout=out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["action"] for r in rows][-3:] == [
        "source.created",
        "source.updated",
        "source.removed",
    ]
    out = io.StringIO()
    call_command("audit", "export", "--format", "csv", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("sequence,occurred_at")
    assert len(lines) == 1 + AuditEvent.objects.count()


def test_history_page_filters_by_action(viewer_client, operator):
    _three_events(operator)
    response = viewer_client.get("/history/", {"action": "source.updated"})
    assert response.status_code == 200
    page = response.context["page"]
    assert [e.action for e in page] == ["source.updated"]


def test_history_page_rejects_inverted_time_range(viewer_client, operator):
    _three_events(operator)
    response = viewer_client.get(
        "/history/", {"since": "2026-01-02T00:00", "until": "2026-01-01T00:00"}
    )
    assert response.status_code == 200
    assert list(response.context["page"]) == []
    assert "before" in response.content.decode()


def test_history_query_count_is_constant(viewer_client, operator, django_assert_max_num_queries):
    for _ in range(60):
        record(AuditAction.SOURCE_UPDATED, actor=Actor.for_user(operator))
    # 7 for the page, 2 for its chain status (the head, the rows since the last verified one).
    with django_assert_max_num_queries(9):
        response = viewer_client.get("/history/")
    assert response.status_code == 200


def test_history_page_reads_as_text_and_links(viewer_client, operator):
    """Details as key: value lines (outside text escaped), targets with a page as links, whole
    correlation ids, and actions grouped by subject with an "any" entry per group."""
    record(
        AuditAction.SOURCE_UPDATED,
        actor=Actor.for_user(operator),
        target=("fleet.source", 7, "sim"),
        details={"interval": 5, "changed": ["a", "b"], "why": "<script>x</script>", "n": None},
        correlation_id="c0ffee00-1234-5678-9abc-def012345678",
    )
    record(AuditAction.GATE_OPENED, actor=Actor.system(), target=("refresh.gate", 3, "rl-a"))
    html = viewer_client.get("/history/").content.decode()
    details = html.split('<pre class="key-values">')[2].split("</pre>")[0]  # newest first
    # (PostgreSQL's jsonb keeps its own key order.)
    assert sorted(details.splitlines()) == [
        "changed: a, b",
        "interval: 5",
        "n: —",
        "why: &lt;script&gt;x&lt;/script&gt;",
    ]
    assert "{&#x27;" not in html and "<script>x" not in html  # no repr, nothing unescaped
    assert '<a href="/sources/7/">sim</a>' in html
    assert "<td>rl-a</td>" in html  # a gate has no page of its own: text
    assert ">c0ffee00-1234-5678-9abc-def012345678</a>" in html
    assert '<optgroup label="source">' in html and '<option value="gate.*">' in html
    gates_only = viewer_client.get("/history/", {"action": "gate.*"})
    assert [e.action for e in gates_only.context["page"]] == ["gate.opened"]

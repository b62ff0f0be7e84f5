"""An admin edits a source's analysis template in the browser: from the source page's link, a
refused body keeps its field error next to the form, then a prompt file upload saves v1, and an
edit of the shown version saves v2 while v1 stays readable."""

from __future__ import annotations

import json

import pytest

from controlplane.analysis.models import AnalysisTemplate
from controlplane.audit.models import AuditEvent
from controlplane.fleet.models import Source
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in

pytestmark = pytest.mark.browser


def test_an_admin_saves_and_edits_a_template(page, admin_user, tmp_path):
    source = Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    sign_in(page, admin_user.username, PASSWORD)
    page.goto(f"/sources/{source.pk}/")
    page.click("#analysis-templates-link")
    page.wait_for_url("**/sources/src-a/analysis/")
    assert page.locator("#no-templates").is_visible()
    # The form starts from every default: the whole metric catalog, no prompts yet.
    starter = json.loads(page.locator("#id_body").input_value())
    assert starter["prompts"] == [] and len(starter["judge"]["metrics"]) == 10

    # Too few prompts: refused, said next to the body, nothing stored.
    page.fill("#id_name", "held-out")
    page.click("#template-form button[type=submit]")
    assert "this template needs at least 20" in page.locator("#template-form").inner_text()
    assert not AnalysisTemplate.objects.exists()

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"prompt": [i, 5, 6], "continuation": [7]}) for i in range(22))
    )
    page.set_input_files("#id_prompt_file", str(prompts))
    page.fill("#id_note", "first cut")
    page.click("#template-form button[type=submit]")
    page.wait_for_url("**/sources/src-a/analysis/held-out/")
    assert "held-out v1" in page.locator("h1").inner_text()
    assert page.locator("#template-metrics tbody tr").count() == 10

    # The form on the template's page starts from the version shown: change it, save v2.
    body = json.loads(page.locator("#id_body").input_value())
    assert len(body["prompts"]) == 22
    body["judge"]["pass_score"] = 90
    page.fill("#id_body", json.dumps(body))
    page.fill("#id_note", "lower the bar")
    page.click("#template-form button[type=submit]")
    page.wait_for_url("**/sources/src-a/analysis/held-out/")
    assert "held-out v2" in page.locator("h1").inner_text()
    assert page.locator("#template-versions tbody tr").count() == 2
    page.click("#template-versions a:text('v1')")
    page.wait_for_url("**?version=1")
    assert "An older version" in page.locator("main").inner_text()
    assert json.loads(page.locator("#template-body").inner_text())["judge"]["pass_score"] == 95
    assert [t.version for t in AnalysisTemplate.objects.order_by("version")] == [1, 2]
    assert AuditEvent.objects.filter(action="analysis_template.saved").count() == 2

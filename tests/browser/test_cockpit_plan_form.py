"""The plan form: the only source is preselected, and only the chosen update method's fields
show, on one grid; changing the method swaps them."""

from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.fleet.models import Source
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in

pytestmark = pytest.mark.browser


def _source(name: str) -> Source:
    return Source.objects.create(
        name=name,
        listener_url="http://127.0.0.1:9/",
        allowed_networks=["127.0.0.0/8"],
        last_success_at=timezone.now(),
    )


def test_plan_form_preselects_the_only_source_and_shows_the_chosen_methods_fields(
    page, operator, client, transactional_db
):
    _source("only")
    client.force_login(operator)
    html = client.get("/refreshes/new/").content.decode()
    assert '<option value="only" selected>only</option>' in html
    # Served with the other methods' groups hidden: no flash of every field.
    assert html.count("data-method-fields=") == 6
    assert html.count('data-method-fields="disk" id="method-fields-1">') == 1

    sign_in(page, operator.username, PASSWORD)
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto("/refreshes/new/")
    assert page.locator("#id_source").input_value() == "only"
    assert page.locator("#id_method").input_value() == "disk"
    assert page.locator("#id_model_path").is_visible()
    for hidden in ("#id_lora_name", "#id_group_params", "#id_update_params", "#id_custom_route"):
        assert not page.locator(hidden).is_visible(), hidden

    page.select_option("#id_method", "lora")
    assert page.locator("#id_lora_name").is_visible()
    assert not page.locator("#id_model_path").is_visible()
    page.select_option("#id_method", "tensor")
    assert page.locator("#id_update_params").is_visible()
    assert not page.locator("#id_group_params").is_visible()
    page.select_option("#id_method", "distributed")
    assert page.locator("#id_update_params").is_visible()
    assert page.locator("#id_group_params").is_visible()

    # One grid: every field of the target policy starts at the same x.
    xs = {
        round(page.locator(sel).bounding_box()["x"])
        for sel in ("#id_weight_version", "#id_method", "#id_group_params", "#id_update_params")
    }
    assert len(xs) == 1, xs
    page.goto("about:blank")


def test_with_two_sources_none_is_chosen_for_you(client, operator, db):
    _source("a")
    _source("b")
    client.force_login(operator)
    html = client.get("/refreshes/new/").content.decode()
    assert " selected>a<" not in html and " selected>b<" not in html

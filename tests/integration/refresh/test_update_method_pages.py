"""The refresh page and the API show each worker's update method, the rank map and the
compatibility record."""

from __future__ import annotations

import pytest

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from tests.integration.refresh.helpers import fleet_config, make_source, plan

pytestmark = pytest.mark.django_db

TARGET = {
    "weight_version": "v4",
    "method": "distributed",
    "group": {"master_address": "10.1.0.1", "master_port": 29500},
    "update": {"names": ["w"]},
}


@pytest.fixture
def planned(simfleet_factory, operator):
    config = fleet_config(3, seed=9)
    config.workers[0].world_size = 2
    fleet = simfleet_factory(config)
    source = make_source(fleet)
    return plan(source, operator, target=TARGET, versions={"dynamo": "1.6.1", "vllm": "0.11.0"})


def test_the_plan_page_shows_method_reason_rank_map_and_compat_record(planned, operator_client):
    page = operator_client.get(f"/refreshes/{planned.pk}/").content.decode()
    assert 'id="plan-methods"' in page and 'id="rank-map"' in page
    assert "vllm advertises destroy_weights_update_group" in page
    for worker in planned.workers.all():
        assert f"<td>{worker.rank_offset}</td><td>{worker.ranks}</td>" in page
    assert 'id="compat-record"' in page
    assert "dynamo 1.6.1" in page and "vllm 0.11.0" in page
    assert "5 ranks" in page  # trainer rank 0 + 2 + 1 + 1


def test_the_api_exports_methods_ranks_group_and_compat(planned, operator, client):
    _, secret = create_token(user=operator, label="t", actor=Actor.system())
    body = client.get(
        f"/api/v1/refreshes/{planned.pk}", HTTP_AUTHORIZATION=f"Bearer {secret}"
    ).json()
    assert body["compat"]["versions"]["declared"] == {"dynamo": "1.6.1", "vllm": "0.11.0"}
    assert body["compat"]["topology"]["group_world_size"] == 5
    assert body["group"]["world_size"] == 5
    workers = body["workers"]
    assert {w["update_method"] for w in workers} == {"distributed"}
    assert sorted((w["rank_offset"], w["ranks"]) for w in workers) == [(1, 2), (3, 1), (4, 1)]
    assert body["group"]["ranks"] == {w["key"]: [w["rank_offset"], w["ranks"]] for w in workers}


def test_bad_declared_versions_are_refused(simfleet_factory, operator):
    from django.core.exceptions import ValidationError

    source = make_source(simfleet_factory(fleet_config(1, seed=2)))
    with pytest.raises(ValidationError, match="unknown version keys"):
        plan(source, operator, versions={"kernel": "6.1"})

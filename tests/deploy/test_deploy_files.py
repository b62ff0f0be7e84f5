"""The compose file and the Kubernetes overlays pass their schemas and our rules — and the
rules really catch what they are for (each check is shown failing on a broken copy)."""

from __future__ import annotations

import copy
import shutil

import pytest

from deploy import validate

needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl renders the overlays (kubectl kustomize)"
)


def test_compose_file_passes_the_schema_and_our_rules():
    assert validate.compose_problems(validate.load_compose()) == []


def test_compose_refuses_to_start_without_its_secrets():
    with pytest.raises(validate.InterpolationError, match="SECRET_KEY"):
        validate.load_compose(env={})


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("${A:-x}", {"A": ""}, "x"),
        ("${A-x}", {"A": ""}, ""),
        ("${A-x}", {}, "x"),
        ("${A}", {"A": "1"}, "1"),
        ("$$HOSTNAME", {}, "$HOSTNAME"),
        ("${A:+on}", {"A": "1"}, "on"),
    ],
)
def test_interpolation_follows_compose(text, env, expected):
    assert validate.interpolate(text, env) == expected


def test_compose_rules_catch_a_missing_healthcheck_a_second_beat_and_a_published_web():
    doc = validate.load_compose()
    del doc["services"]["worker"]["healthcheck"]
    doc["services"]["beat-2"] = copy.deepcopy(doc["services"]["beat"])
    doc["services"]["web"]["ports"] = ["8000:8000"]
    del doc["services"]["web"]["environment"]["SECRET_KEY"]
    problems = "\n".join(validate.compose_problems(doc))
    assert "service worker: no healthcheck" in problems
    assert "exactly one beat service expected, found ['beat', 'beat-2']" in problems
    assert "service web: publishes a port" in problems
    assert "service web: missing environment SECRET_KEY" in problems


def test_compose_schema_catches_an_unknown_key():
    doc = validate.load_compose()
    doc["services"]["web"]["helthcheck"] = {"test": ["CMD", "true"]}
    problems = validate.compose_problems(doc)
    assert any(p.startswith("compose schema: services/web") for p in problems)


def test_sim_registration_uses_the_fixed_dynamo_subnet():
    doc = validate.load_compose(env={**validate.SAMPLE_ENV, "DYNAMO_SUBNET": "10.99.0.0/24"})
    assert validate._sim_problems(doc) == []
    assert "--admin-network=10.99.0.0/24" in validate._command_text(doc["services"]["sim-register"])
    doc["networks"]["dynamo"]["ipam"]["config"][0]["subnet"] = "10.98.0.0/24"
    assert validate._sim_problems(doc) == [
        "sim-register: --admin-network is not the dynamo network's subnet"
    ]


def test_there_are_dev_production_and_operator_overlays():
    assert [p.name for p in validate.overlays()] == ["dev", "dynamo-operator", "production"]


@needs_kubectl
@pytest.mark.parametrize("overlay", validate.overlays(), ids=lambda p: p.name)
def test_every_overlay_renders_and_validates(overlay):
    docs = validate.render_overlay(overlay)
    assert validate.kubernetes_problems(docs, overlay=overlay.name) == []


@needs_kubectl
def test_kubernetes_checks_catch_schema_and_rule_violations():
    docs = validate.render_overlay(validate.OVERLAYS / "production")
    by_name = {validate._name(d): d for d in docs}
    web = by_name["Deployment/controlplane-web"]
    web["spec"]["replica"] = 3  # a typo: strict schemas refuse unknown fields
    container = web["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFilesystem"] = False
    container["readinessProbe"]["httpGet"]["path"] = "/healthz"
    by_name["Deployment/controlplane-beat"]["spec"]["strategy"] = {"type": "RollingUpdate"}
    by_name["Deployment/controlplane-worker"]["spec"]["replicas"] = 4
    problems = "\n".join(validate.kubernetes_problems(docs, overlay="production"))
    assert "Deployment/controlplane-web: spec: " in problems and "replica" in problems
    assert "container web: root filesystem is writable" in problems
    assert "web: readinessProbe is not /readyz" in problems
    assert "beat: strategy must be Recreate" in problems
    assert "worker replicas would fight the autoscaler" in problems


@needs_kubectl
def test_egress_policy_limits_destinations_and_ports():
    docs = validate.render_overlay(validate.OVERLAYS / "dev")
    policy = next(d for d in docs if validate._name(d) == "NetworkPolicy/controlplane-egress")
    policy["spec"]["egress"].append({"ports": [{"protocol": "TCP", "port": 443}]})
    problems = validate.kubernetes_problems(docs, overlay="dev")
    assert problems == ["egress policy: a rule without `to` allows every destination"]


#: Everything that ships a web command or documents one.
SHIPPED_FILES = [
    "Dockerfile",
    "docker-compose.yml",
    *(str(p.relative_to(validate.ROOT)) for p in (validate.ROOT / "deploy").rglob("*.y*ml")),
    *(
        str(p.relative_to(validate.ROOT))
        for p in (validate.ROOT / "controlplane/embedded").rglob("*.py")
    ),
    *(str(p.relative_to(validate.ROOT)) for p in (validate.ROOT / "docs").rglob("*.md")),
]


@pytest.mark.parametrize("path", SHIPPED_FILES)
def test_no_shipped_file_trusts_forwarded_headers_from_every_peer(path):
    text = (validate.ROOT / path).read_text()
    assert "--forwarded-allow-ips=*" not in text
    assert not validate._TRUST_EVERY_PEER.search(text)


def test_compose_trusts_forwarded_headers_from_caddys_fixed_address_only():
    doc = validate.load_compose(env={**validate.SAMPLE_ENV, "CADDY_ADDRESS": "172.28.241.9"})
    assert doc["services"]["web"]["environment"]["FORWARDED_ALLOW_IPS"] == "172.28.241.9"
    assert doc["services"]["caddy"]["networks"]["edge"]["ipv4_address"] == "172.28.241.9"
    assert "edge" in doc["services"]["web"]["networks"]
    doc["services"]["web"]["command"][2] += " --forwarded-allow-ips=*"
    doc["services"]["web"]["environment"]["FORWARDED_ALLOW_IPS"] = "172.28.241.3"
    problems = validate.compose_problems(doc)
    assert "service web: uvicorn trusts forwarded headers from every peer (`*`)" in problems
    assert (
        "service web: FORWARDED_ALLOW_IPS '172.28.241.3' is not caddy's fixed address" in problems
    )
    doc["services"]["web"]["environment"]["FORWARDED_ALLOW_IPS"] = "*"
    assert "service web: FORWARDED_ALLOW_IPS must name the proxy, got '*'" in (
        validate.compose_problems(doc)
    )


def test_dockerfile_check_catches_trust_in_every_peer():
    assert validate.dockerfile_problems((validate.ROOT / "Dockerfile").read_text()) == []
    broken = 'CMD ["sh", "-c", "exec uvicorn app --proxy-headers --forwarded-allow-ips=\'*\'"]'
    assert len(validate.dockerfile_problems(broken)) == 1


@needs_kubectl
def test_kubernetes_web_trusts_forwarded_headers_from_the_configured_proxies_only():
    docs = validate.render_overlay(validate.OVERLAYS / "production")
    by_name = {validate._name(d): d for d in docs}
    assert by_name["ConfigMap/controlplane-config"]["data"]["FORWARDED_ALLOW_IPS"]
    container = by_name["Deployment/controlplane-web"]["spec"]["template"]["spec"]["containers"][0]
    container["command"][2] += " --forwarded-allow-ips=*"
    del by_name["ConfigMap/controlplane-config"]["data"]["FORWARDED_ALLOW_IPS"]
    problems = validate.kubernetes_problems(docs, overlay="production")
    assert "web: uvicorn trusts forwarded headers from every peer (`*`)" in problems
    assert "web: FORWARDED_ALLOW_IPS must name the proxy, got None" in problems

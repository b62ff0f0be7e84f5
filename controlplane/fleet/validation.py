"""Validation shared by the source services, the forms and the command line.

One function per object type turns raw values into clean ones or raises `ValidationError`
keyed by field, so the UI, the API and `manage.py source` reject the same input with the same
words and none of them changes anything on bad input.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError

from controlplane.dynamo.families import DECLARABLE_FAMILIES, FAMILIES
from controlplane.dynamo.fingerprint import AgreementRule
from controlplane.dynamo.listing import U64_MAX
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.dynamo.releases import RELEASES
from controlplane.dynamo.scope import GLOBAL_NAMESPACE, Scope, resolve_scope
from controlplane.dynamo.urls import url_problem

MIN_INTERVAL_SECONDS = 1.0
SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
U64_TEXT = re.compile(r"^(0|[1-9][0-9]{0,19})$")

#: Fields a caller may set on a source; everything else is owned by discovery.
SOURCE_FIELDS = (
    "name",
    "listener_url",
    "frontend_url",
    "expected_namespace",
    "expected_prefix",
    "expected_worker_suffix",
    "listener_scope",
    "allowed_networks",
    "discovery_interval_seconds",
    "require_approval",
    "enabled",
    "agreement_rule",
    "agreement_tokens",
    "agreement_epsilon",
    "drift_policy",
    "drill_every",
    "declared_family",
    "declared_families",
    "dynamo_release",
    "max_lag_action",
    "max_lag_steps",
)
DRIFT_POLICIES = ("quarantine", "close", "observe")
DEFAULT_DRIFT_POLICY = "quarantine"
MAX_LAG_ACTIONS = ("observe", "alert", "close")
DEFAULT_MAX_LAG_ACTION = "observe"
DEFAULT_MAX_LAG_STEPS = 1
#: A bound on the step threshold, so a typo cannot switch the policy off by overflow.
MAX_LAG_STEPS_LIMIT = 10**9
#: Defaults for the agreement fields, so callers that predate them still validate.
AGREEMENT_DEFAULTS: dict[str, Any] = {
    "agreement_rule": AgreementRule().kind,
    "agreement_tokens": AgreementRule().tokens,
    "agreement_epsilon": AgreementRule().epsilon,
}


def _literal_outside(policy: OutboundPolicy, url: str) -> str | None:
    # Only IP literals are judged at save time: resolving names here would block a request on
    # DNS, and names are checked again before every call anyway.
    host = urlsplit(url).hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return policy.violation(url)


def parse_networks(raw: Any) -> list[str]:
    """CIDRs from a list or a comma/whitespace separated string, validated and normalised."""
    try:
        return OutboundPolicy.parse_cidrs(raw)
    except ValueError as exc:
        raise ValidationError({"allowed_networks": str(exc)}) from None


def expected_scope(values: dict[str, Any]) -> Scope:
    return resolve_scope(
        namespace=values.get("expected_namespace") or None,
        prefix=values.get("expected_prefix") or None,
        worker_suffix=values.get("expected_worker_suffix") or None,
    )


def clean_source_values(values: dict[str, Any]) -> dict[str, Any]:
    """Validate a complete set of source values. Raises ValidationError keyed by field."""
    unknown = set(values) - set(SOURCE_FIELDS)
    if unknown:
        raise ValidationError(f"unknown source fields: {', '.join(sorted(unknown))}")
    errors: dict[str, str] = {}
    clean = dict(values)

    name = str(values.get("name", ""))
    if not SLUG.match(name):
        errors["name"] = "must be 1-64 letters, digits, '-' or '_'"

    try:
        clean["allowed_networks"] = parse_networks(values.get("allowed_networks", ()))
        policy = OutboundPolicy.from_cidrs(clean["allowed_networks"])
    except ValidationError as exc:
        errors["allowed_networks"] = exc.message_dict["allowed_networks"][0]
        policy = None

    for field, required in (("listener_url", True), ("frontend_url", False)):
        url = values.get(field) or ""
        if not url and not required:
            clean[field] = ""
            continue
        name = field.replace("_", " ")
        problem = url_problem(url, name)
        if problem is None and policy is not None:
            outside = _literal_outside(policy, url)
            if outside:
                problem = f"{name} is outside the allowed networks: {outside}"
        if problem:
            errors[field] = problem

    try:
        interval = float(values.get("discovery_interval_seconds", 10.0))
    except (TypeError, ValueError):
        errors["discovery_interval_seconds"] = "refresh interval must be a number of seconds"
    else:
        if not interval >= MIN_INTERVAL_SECONDS:  # also rejects NaN
            errors["discovery_interval_seconds"] = (
                f"refresh interval must be at least {MIN_INTERVAL_SECONDS:g} s, got {interval:g}"
            )
        clean["discovery_interval_seconds"] = interval

    for field in ("expected_namespace", "expected_prefix", "expected_worker_suffix"):
        clean[field] = str(values.get(field) or "")
    clean["listener_scope"] = _clean_listener_scope(clean, values.get("listener_scope"), errors)
    clean["require_approval"] = bool(values.get("require_approval", False))
    clean["enabled"] = bool(values.get("enabled", True))
    clean.update(_clean_agreement(values, errors))
    policy_name = values.get("drift_policy") or DEFAULT_DRIFT_POLICY
    if policy_name not in DRIFT_POLICIES:
        errors["drift_policy"] = f"drift policy must be one of {', '.join(DRIFT_POLICIES)}"
    clean["drift_policy"] = policy_name
    drill_every = values.get("drill_every") or 0
    if isinstance(drill_every, str) and drill_every.strip().isdigit():
        drill_every = int(drill_every)
    if isinstance(drill_every, bool) or not isinstance(drill_every, int) or drill_every < 0:
        errors["drill_every"] = "drill schedule must be a whole number of hours (0 = never)"
    clean["drill_every"] = drill_every
    clean.update(_clean_declared_families(values, errors))
    release = str(values.get("dynamo_release") or "")
    if release and release not in RELEASES:
        errors["dynamo_release"] = (
            f"unknown Dynamo release {release!r}; known: {', '.join(RELEASES)}"
        )
    clean["dynamo_release"] = release
    clean.update(_clean_max_lag(values, errors))
    if errors:
        raise ValidationError(errors)
    return clean


LISTENER_SCOPES = ("", "exact", "prefix", "suffix", "global")


def _clean_listener_scope(clean: dict[str, Any], raw: Any, errors: dict[str, str]) -> str:
    """The declared listener scope must name what it needs: a prefix mode its prefix (and the
    `dynamo` prefix is the global scope, declared as such), a suffix mode its suffix."""
    mode = str(raw or "")
    if mode not in LISTENER_SCOPES:
        errors["listener_scope"] = "listener scope must be exact, prefix, suffix or global"
        return mode
    prefix = clean["expected_prefix"]
    if mode == "prefix" and not prefix:
        errors["expected_prefix"] = "a prefix scope needs the prefix (DYN_NAMESPACE_PREFIX)"
    elif mode == "prefix" and prefix == GLOBAL_NAMESPACE:
        errors["listener_scope"] = (
            f"the prefix {GLOBAL_NAMESPACE!r} matches every namespace: declare the global scope"
        )
    if mode == "suffix" and not clean["expected_worker_suffix"]:
        errors["expected_worker_suffix"] = (
            "a suffix scope needs the worker suffix (DYN_NAMESPACE_WORKER_SUFFIX)"
        )
    return mode


def _clean_agreement(values: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
    """The cross-worker agreement rule, judged by the same class the verify step uses."""
    raw = {f: values.get(f, AGREEMENT_DEFAULTS[f]) for f in AGREEMENT_DEFAULTS}
    if raw["agreement_rule"] not in ("exact", "logprob"):
        errors["agreement_rule"] = "agreement rule must be exact or logprob"
        return {}
    try:
        tokens = raw["agreement_tokens"]
        if isinstance(tokens, str) and tokens.strip().isdigit():
            tokens = int(tokens)
        epsilon = raw["agreement_epsilon"]
        if isinstance(epsilon, str):
            epsilon = float(epsilon)  # "nan"/"inf" parse here and are refused just below
        rule = AgreementRule(kind=raw["agreement_rule"], tokens=tokens, epsilon=epsilon)
    except ValueError as exc:
        field = "agreement_epsilon" if "epsilon" in str(exc) else "agreement_tokens"
        errors[field] = str(exc)
        return {}
    return {
        "agreement_rule": rule.kind,
        "agreement_tokens": rule.tokens,
        "agreement_epsilon": rule.epsilon,
    }


def clean_static_worker_values(values: dict[str, Any], *, allowed_networks) -> dict[str, Any]:
    """Validate a static worker. Its URL must pass the source's policy like any worker's."""
    errors: dict[str, str] = {}
    clean = dict(values)
    if not SLUG.match(str(values.get("name", ""))):
        errors["name"] = "must be 1-64 letters, digits, '-' or '_'"
    if not str(values.get("namespace") or "").strip():
        errors["namespace"] = "namespace is required"
    clean["component"] = str(values.get("component") or "backend")
    clean["endpoint"] = str(values.get("endpoint") or "generate")
    declared = str(values.get("declared_instance_id") or "").strip()
    if declared and not U64_TEXT.match(declared):
        errors["declared_instance_id"] = (
            "declared instance id must be an unsigned 64-bit integer (from the frontend's "
            "/health instances)"
        )
    elif declared and int(declared) > U64_MAX:
        errors["declared_instance_id"] = "declared instance id exceeds 2^64-1"
    clean["declared_instance_id"] = declared
    url = values.get("system_url") or ""
    problem = url_problem(url, "system URL")
    if problem is None:
        outside = _literal_outside(OutboundPolicy.from_cidrs(allowed_networks or []), url)
        if outside:
            problem = f"system URL is outside the source's allowed networks: {outside}"
    if problem:
        errors["system_url"] = problem
    family = values.get("family")
    if family not in FAMILIES:
        errors["family"] = f"family must be one of {', '.join(sorted(FAMILIES))}"
    routes = values.get("allowed_routes") or []
    if isinstance(routes, str):
        routes = [r for r in re.split(r"[\s,]+", routes) if r]
    routes = sorted({str(r).strip() for r in routes if str(r).strip()})
    bad = [r for r in routes if r.startswith("/") or ".." in r or " " in r]
    if bad:
        errors["allowed_routes"] = f"route names must be relative engine routes, not {bad[0]!r}"
    clean["allowed_routes"] = routes
    clean["model"] = str(values.get("model") or "")
    if errors:
        raise ValidationError(errors)
    return clean


#: `Source.declared_families`: namespace → the family declared for it (`{"rl-a": "vllm-sidecar"}`),
#: overriding `Source.declared_family` (`_clean_declared_families` checks it).
DeclaredFamilies = dict[str, str]


def _clean_declared_families(values: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
    """The operator's backend-family declarations: one for the source, and per namespace."""
    choices = ", ".join(DECLARABLE_FAMILIES)
    family = str(values.get("declared_family") or "")
    if family and family not in DECLARABLE_FAMILIES:
        errors["declared_family"] = f"declared family {family!r} is unknown; use one of {choices}"
    raw = values.get("declared_families") or {}
    per_namespace: dict[str, str] = {}
    if not isinstance(raw, dict):
        errors["declared_families"] = "declared families must map namespaces to families"
    else:
        for namespace, name in raw.items():
            if not isinstance(namespace, str) or not isinstance(name, str):
                errors["declared_families"] = "declared families must map namespaces to families"
                break
            if name not in DECLARABLE_FAMILIES:
                errors["declared_families"] = (
                    f"namespace {namespace!r}: declared family {name!r} is unknown; "
                    f"use one of {choices}"
                )
                break
            per_namespace[namespace] = name
    return {"declared_family": family, "declared_families": per_namespace}


def _clean_max_lag(values: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
    """The policy-lag policy: an action and a step threshold (refresh/policy_lag.py)."""
    action = values.get("max_lag_action") or DEFAULT_MAX_LAG_ACTION
    if action not in MAX_LAG_ACTIONS:
        errors["max_lag_action"] = f"max lag action must be one of {', '.join(MAX_LAG_ACTIONS)}"
    steps = values.get("max_lag_steps")
    if steps is None or steps == "":
        steps = DEFAULT_MAX_LAG_STEPS
    if isinstance(steps, str) and steps.strip().isdigit():
        steps = int(steps)
    if (
        isinstance(steps, bool)
        or not isinstance(steps, int)
        or not 0 <= steps <= MAX_LAG_STEPS_LIMIT
    ):
        errors["max_lag_steps"] = (
            f"max lag must be a whole number of steps from 0 to {MAX_LAG_STEPS_LIMIT}"
        )
    return {"max_lag_action": action, "max_lag_steps": steps}

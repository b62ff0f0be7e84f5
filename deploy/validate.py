"""Check the deployment files without Docker or a cluster (run by `.ci/check-deploy`).

- docker-compose.yml: `docker compose config` when the Compose plugin exists; always the
  compose-spec JSON schema (as vendored by the `check-jsonschema` package) on the file after
  Compose-style `${VAR}` interpolation, plus our own rules (`compose_problems`).
- Kubernetes: every overlay under deploy/kubernetes/overlays rendered with `kubectl kustomize`,
  each object validated against the Kubernetes OpenAPI schemas shipped by
  `kubernetes-validate` (offline, strict: unknown fields are errors), plus our own rules
  (`kubernetes_problems`).

`python -m deploy.validate` prints what it checked and exits 1 on any problem.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
OVERLAYS = ROOT / "deploy" / "kubernetes" / "overlays"
KUBERNETES_VERSION = "1.32.0"
#: What `.env` must provide (deploy/compose/env.example); sample values for interpolation.
SAMPLE_ENV = {
    "SECRET_KEY": "x" * 60,
    "AUDIT_HMAC_KEY": "k1:" + "y" * 40,
    "POSTGRES_PASSWORD": "secret",
}
APP_ENV_REQUIRED = (
    "CONTROLPLANE_ENV",
    "SECRET_KEY",
    "AUDIT_HMAC_KEY",
    "ALLOWED_HOSTS",
    "DATABASE_URL",
    "REDIS_URL",
    "AUDIT_ANCHOR_FILE",
)

# ---------------------------------------------------------------------------------------------
# Compose

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?+])?(?P<arg>[^}]*)\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class InterpolationError(ValueError):
    pass


#: uvicorn believing X-Forwarded-For from every peer: whoever reaches the web port could claim
#: any client address, loopback included (/metrics, audit source_ip, login throttle).
_TRUST_EVERY_PEER = re.compile(r"""--forwarded-allow-ips(?:=|\s+)["']?\*""")


def forwarded_problems(where: str, command: str, allowed: str | None) -> list[str]:
    """Forwarded headers trusted from the proxy only: never `*` on the command line, and
    FORWARDED_ALLOW_IPS (which uvicorn and the app's TRUSTED_PROXIES read) set and not `*`."""
    problems = []
    if _TRUST_EVERY_PEER.search(command):
        problems.append(f"{where}: uvicorn trusts forwarded headers from every peer (`*`)")
    if not allowed or "*" in allowed:
        problems.append(f"{where}: FORWARDED_ALLOW_IPS must name the proxy, got {allowed!r}")
    return problems


def dockerfile_problems(text: str) -> list[str]:
    return [
        f"Dockerfile: {line.strip()[:60]}…: trusts forwarded headers from every peer"
        for line in text.splitlines()
        if _TRUST_EVERY_PEER.search(line)
    ]


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`, `$$`."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["bare"]
        op, arg = match["op"] or "", match["arg"] or ""
        present = name in env
        current = env.get(name, "")
        unset_or_empty = not present or (op.startswith(":") and current == "")
        if op.endswith("-"):
            return arg if unset_or_empty else current
        if op.endswith("?"):
            if unset_or_empty:
                raise InterpolationError(f"{name}: {arg or 'required'}")
            return current
        if op.endswith("+"):
            return "" if unset_or_empty else arg
        return current

    return _VARIABLE.sub(substitute, value)


def load_compose(path: Path = COMPOSE_FILE, env: Mapping[str, str] | None = None) -> dict:
    raw = yaml.safe_load(path.read_text())  # PyYAML resolves `<<:` merge keys
    return interpolate(raw, SAMPLE_ENV if env is None else env)


def compose_schema() -> dict:
    vendored = resources.files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json"
    return json.loads(vendored.read_text())


def compose_schema_problems(doc: dict) -> list[str]:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)  # the draft it declares
    return [
        f"compose schema: {'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    ]


def _command_text(service: dict) -> str:
    command = service.get("command") or ""
    return command if isinstance(command, str) else " ".join(map(str, command))


def _healthcheck_enabled(service: dict) -> bool:
    check = service.get("healthcheck") or {}
    return bool(check.get("test")) and not check.get("disable")


def compose_problems(doc: dict) -> list[str]:
    """Our own rules, on an interpolated document."""
    problems = compose_schema_problems(doc)
    services: dict[str, dict] = doc.get("services", {})
    for name, service in services.items():
        check = service.get("healthcheck")
        if not check or not (check.get("test") or check.get("disable") is True):
            problems.append(f"service {name}: no healthcheck (or an explicit `disable: true`)")
        if check and check.get("disable") and service.get("restart") != "no":
            problems.append(f"service {name}: only one-shot jobs may disable their healthcheck")
        for target, rule in (service.get("depends_on") or {}).items():
            if target not in services:
                problems.append(f"service {name}: depends on unknown service {target}")
            elif rule.get("condition") == "service_healthy" and not _healthcheck_enabled(
                services[target]
            ):
                problems.append(
                    f"service {name}: waits for {target} to be healthy; it has no check"
                )
        environment = service.get("environment") or {}
        if "CONTROLPLANE_ENV" in environment:
            missing = [key for key in APP_ENV_REQUIRED if not environment.get(key)]
            if missing:
                problems.append(f"service {name}: missing environment {', '.join(missing)}")
    beats = [
        name for name, s in services.items() if re.search(r"celery .*\bbeat\b", _command_text(s))
    ]
    if beats != ["beat"]:
        problems.append(f"exactly one beat service expected, found {beats}")
    elif (services["beat"].get("deploy") or {}).get("replicas") != 1:
        problems.append("service beat: deploy.replicas must be 1")
    web = services.get("web", {})
    web_command = _command_text(web)
    for needed in ("uvicorn", "--workers", "--proxy-headers"):
        if needed not in web_command:
            problems.append(f"service web: command lacks {needed}")
    if web.get("ports"):
        problems.append("service web: publishes a port; only the TLS proxy may")
    allowed = (web.get("environment") or {}).get("FORWARDED_ALLOW_IPS")
    problems += forwarded_problems("service web", web_command, allowed)
    caddy_networks = services.get("caddy", {}).get("networks") or {}
    caddy_addresses = (
        [(n or {}).get("ipv4_address") for n in caddy_networks.values()]
        if isinstance(caddy_networks, dict)
        else []
    )
    if allowed and allowed not in caddy_addresses:
        problems.append(
            f"service web: FORWARDED_ALLOW_IPS {allowed!r} is not caddy's fixed address"
        )
    published = [name for name, s in services.items() if s.get("ports")]
    if published != ["caddy"]:
        problems.append(f"only caddy may publish ports, found {published}")
    caddy_mounts = " ".join(services.get("caddy", {}).get("volumes", []))
    if "deploy/compose/Caddyfile:/etc/caddy/Caddyfile" not in caddy_mounts:
        problems.append("service caddy: does not mount deploy/compose/Caddyfile")
    caddyfile = (ROOT / "deploy" / "compose" / "Caddyfile").read_text()
    for needed in ("tls ", "reverse_proxy", "name web", "port 8000"):
        if needed not in caddyfile:
            problems.append(f"Caddyfile: lacks {needed!r}")
    problems += _sim_problems(doc)
    return problems


def _sim_problems(doc: dict) -> list[str]:
    services = doc["services"]
    register = services.get("sim-register")
    if register is None:
        return ["the sim profile has no sim-register service"]
    subnets = [
        pool["subnet"]
        for pool in (doc.get("networks", {}).get("dynamo") or {}).get("ipam", {}).get("config", [])
    ]
    command = _command_text(register)
    problems = []
    if not subnets or f"--admin-network={subnets[0]}" not in command:
        problems.append("sim-register: --admin-network is not the dynamo network's subnet")
    if "--if-absent" not in command:
        problems.append("sim-register: not idempotent (--if-absent)")
    if "dynamo" not in (services.get("simfleet", {}).get("networks") or []):
        problems.append("simfleet: not on the dynamo network")
    return problems


def docker_compose_config() -> tuple[bool, str]:
    """(ran, output) of `docker compose config -q`; ran is False without the plugin."""
    docker = shutil.which("docker")
    if docker is None:
        return False, "no docker client"
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        return False, "no Compose plugin"
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_FILE), "--profile", "sim", "config", "-q"],
        capture_output=True,
        text=True,
        env={
            **SAMPLE_ENV,
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(Path.home()),
        },
        cwd=ROOT,
    )
    return True, (result.stdout + result.stderr).strip() if result.returncode else ""


# ---------------------------------------------------------------------------------------------
# Kubernetes


def render_overlay(overlay: Path) -> list[dict]:
    result = subprocess.run(
        ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    if result.returncode:
        raise RuntimeError(f"kubectl kustomize {overlay.name}: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _name(doc: dict) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def schema_problems(docs: Iterable[dict], version: str = KUBERNETES_VERSION) -> list[str]:
    problems = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(map(str, exc.path))
            problems.append(f"{_name(doc)}: {path}: {exc.message}")
        except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError):
            problems.append(
                f"{_name(doc)}: no schema for {doc.get('apiVersion')} {doc.get('kind')}"
            )
    return problems


def _ours(doc: dict) -> bool:
    labels = doc.get("metadata", {}).get("labels", {})
    return labels.get("app.kubernetes.io/name") == "controlplane"


def _pod_spec(doc: dict) -> dict | None:
    if doc.get("kind") in ("Deployment", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def _probe_path(container: dict, probe: str) -> str | None:
    return ((container.get(probe) or {}).get("httpGet") or {}).get("path")


def kubernetes_problems(docs: list[dict], *, overlay: str) -> list[str]:
    problems = schema_problems(docs)
    by_name = {_name(d): d for d in docs}
    for doc in docs:
        spec = _pod_spec(doc)
        if spec is None or not _ours(doc):
            continue
        where = _name(doc)
        pod_security = spec.get("securityContext", {})
        if not pod_security.get("runAsNonRoot"):
            problems.append(f"{where}: pod securityContext lacks runAsNonRoot")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: mounts a service account token it does not need")
        mounted = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for container in spec.get("initContainers", []) + spec["containers"]:
            security = container.get("securityContext", {})
            label = f"{where} container {container['name']}"
            if not security.get("readOnlyRootFilesystem"):
                problems.append(f"{label}: root filesystem is writable")
            if security.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{label}: allows privilege escalation")
            if "ALL" not in (security.get("capabilities") or {}).get("drop", []):
                problems.append(f"{label}: keeps Linux capabilities")
            requests = (container.get("resources") or {}).get("requests") or {}
            if not {"cpu", "memory"} <= set(requests):
                problems.append(f"{label}: no cpu/memory requests (HPA and scheduling need them)")
            tmp = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            if not tmp or tmp[0]["name"] not in mounted:
                problems.append(f"{label}: no emptyDir at /tmp")
    web = by_name.get("Deployment/controlplane-web")
    if web is None:
        problems.append("no Deployment/controlplane-web")
    else:
        container = web["spec"]["template"]["spec"]["containers"][0]
        if _probe_path(container, "livenessProbe") != "/healthz":
            problems.append("web: livenessProbe is not /healthz")
        if _probe_path(container, "readinessProbe") != "/readyz":
            problems.append("web: readinessProbe is not /readyz")
        config = by_name.get("ConfigMap/controlplane-config", {}).get("data") or {}
        command = " ".join(map(str, container.get("command", []) + container.get("args", [])))
        problems += forwarded_problems("web", command, config.get("FORWARDED_ALLOW_IPS"))
    beat = by_name.get("Deployment/controlplane-beat")
    if beat is None or beat["spec"].get("replicas") != 1:
        problems.append("beat: must be a Deployment with replicas 1")
    elif beat["spec"].get("strategy", {}).get("type") != "Recreate":
        problems.append("beat: strategy must be Recreate (never two schedules)")
    for needed in (
        "Service/controlplane-web",
        "Ingress/controlplane-web",
        "Deployment/controlplane-worker",
        "Job/controlplane-migrate",
        "NetworkPolicy/controlplane-egress",
        "ConfigMap/controlplane-config",
    ):
        if needed not in by_name:
            problems.append(f"missing {needed}")
    egress = by_name.get("NetworkPolicy/controlplane-egress")
    if egress is not None:
        ports = {p["port"] for rule in egress["spec"]["egress"] for p in rule.get("ports", [])}
        if not {53, 5432, 6379, 8000, 8001, 9090} <= ports:
            problems.append(f"egress policy: ports {sorted(ports)} miss DNS/db/redis/Dynamo")
        if any(not rule.get("to") for rule in egress["spec"]["egress"]):
            problems.append("egress policy: a rule without `to` allows every destination")
    if overlay != "dev" and "PodDisruptionBudget/controlplane-web" not in by_name:
        problems.append("missing PodDisruptionBudget/controlplane-web")
    if overlay == "production":
        hpa = by_name.get("HorizontalPodAutoscaler/controlplane-worker")
        if hpa is None:
            problems.append("production: no HorizontalPodAutoscaler for the workers")
        if "replicas" in by_name["Deployment/controlplane-worker"]["spec"]:
            problems.append("production: worker replicas would fight the autoscaler")
    secrets = [d for d in docs if d.get("kind") == "Secret"]
    if overlay != "dev" and secrets:
        problems.append(f"{overlay}: secrets belong outside the repository, found {secrets}")
    return problems


def overlays() -> list[Path]:
    return sorted(p for p in OVERLAYS.iterdir() if (p / "kustomization.yaml").exists())


def main() -> int:
    failures: list[str] = []
    ran, output = docker_compose_config()
    if ran:
        print(f"docker compose config: {'ok' if not output else 'FAILED'}")
        if output:
            failures.append(f"docker compose config: {output}")
    else:
        print(f"docker compose config: skipped ({output}); schema check instead")
    problems = compose_problems(load_compose())
    print(f"docker-compose.yml: {len(problems)} problem(s) (schema + rules)")
    failures += problems
    problems = dockerfile_problems((ROOT / "Dockerfile").read_text())
    print(f"Dockerfile: {len(problems)} problem(s)")
    failures += problems
    for overlay in overlays():
        docs = render_overlay(overlay)
        problems = kubernetes_problems(docs, overlay=overlay.name)
        print(
            f"kubernetes overlay {overlay.name}: {len(docs)} objects, {len(problems)} problem(s)"
            f" (Kubernetes {KUBERNETES_VERSION} schemas, strict)"
        )
        failures += [f"{overlay.name}: {p}" for p in problems]
    for failure in failures:
        print(f"  - {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

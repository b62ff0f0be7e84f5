"""slime skeleton: a fixed worker set. slime's own example runs stock SGLang engines behind
static Services (found by DNS name, kept if healthy) and sends generation through the Dynamo
frontend. The control plane knows those engines as static workers of a source
(`manage.py source add-static`), since SGLang does not register with `/v1/rl/workers`.

Here the DNS-plus-health step resolves each engine's host and keeps the engines whose
`/health` answers; then the checkpoint is announced and rollouts are generated and admitted.
`SLIME_ENGINE_URLS` lists the engines' system URLs (comma-separated).
"""

import os
import socket
from urllib.parse import urlsplit

import httpx
from common import control_plane, frontend, rollout_batch

STEP = int(os.environ.get("RECIPE_STEP", "1"))
VERSION = f"slime-rollout-{STEP}"


def healthy_engines(urls: list[str]) -> list[str]:
    """DNS plus health: every address a Service name resolves to, kept if `/health` is 200."""
    found = []
    for url in urls:
        parts = urlsplit(url)
        for *_, sockaddr in socket.getaddrinfo(parts.hostname, parts.port, type=socket.SOCK_STREAM):
            engine = f"{parts.scheme}://{sockaddr[0]}:{parts.port}{parts.path}"
            try:
                if httpx.get(f"{engine}/health", timeout=5).status_code == 200:
                    found.append(engine)
            except httpx.HTTPError:
                pass  # not serving: left out of this phase, as slime's example does
    return sorted(set(found))


engines = healthy_engines(os.environ["SLIME_ENGINE_URLS"].split(","))
print(f"{len(engines)} healthy engine(s)")
with control_plane() as control, frontend() as fe:
    answer = control.announce_checkpoint(
        VERSION, model_path=f"/checkpoints/slime/iter_{STEP:07d}/hf", step=STEP
    )
    control.wait_for_gate(VERSION, timeout=300, checkpoint=answer)
    samples = rollout_batch(control, fe, VERSION, [[51, 52, STEP], [61, 62, STEP]])

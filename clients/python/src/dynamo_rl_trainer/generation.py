"""Token-id generation through the Dynamo frontend, pinned to one admitted instance.

`Frontend.pinned_completion` sends `POST /v1/completions` with a token-id prompt, pinned with
`nvext.backend_instance_id`, asking for the engine's own token ids (`completion_token_ids`, and
`prompt_token_ids` / prompt logprobs when requested), `worker_id` (who served it) and
`detailed_finish_reason` (cancellation also reads `stop` without it). It stamps the request
with `x-rl-policy-version`, `x-rl-rollout-id` and `x-rl-attempt-id` so the serving side's logs
and traces can be joined to the trainer's sample.

Generation is not idempotent: a request that timed out may still have completed on the worker.
A retry therefore keeps its attempt identity (same rollout id, same attempt id), and the
frontend client refuses to send an attempt it already holds an answer for, so one attempt
yields at most one reply. The guard's duplicate rule (`AdmissionGuard`) is the second line:
one (rollout, attempt) is admitted at most once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from dynamo_rl_trainer.errors import DuplicateAttempt, GenerationError

POLICY_VERSION_HEADER = "x-rl-policy-version"
ROLLOUT_ID_HEADER = "x-rl-rollout-id"
ATTEMPT_ID_HEADER = "x-rl-attempt-id"
#: Statuses worth sending the same attempt again for: the worker or frontend was briefly
#: unable to serve it. 4xx means the request itself is wrong (or the pin is unknown: 400).
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class GenerationRequest:
    """What was asked, and when: the guard checks the reply against it."""

    model: str
    prompt_token_ids: tuple[int, ...]
    instance_id: int
    policy_version: Any
    rollout_id: str
    attempt_id: str
    max_tokens: int
    logprobs: bool = True
    prompt_logprobs: int | None = None
    temperature: float = 1.0
    #: Choices asked for; `completion_token_ids` requires exactly one (frontend contract).
    n: int = 1
    #: Wall-clock time (Unix seconds) the first send of this attempt left the trainer.
    sent_at: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        return (self.rollout_id, self.attempt_id)

    def body(self) -> dict[str, Any]:
        extra = ["completion_token_ids", "prompt_token_ids", "worker_id", "detailed_finish_reason"]
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(self.prompt_token_ids),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "nvext": {"backend_instance_id": self.instance_id, "extra_fields": extra},
        }
        if self.logprobs:
            body["logprobs"] = 0
        if self.prompt_logprobs is not None:
            body["prompt_logprobs"] = self.prompt_logprobs
            extra.append("prompt_logprobs")
        return body

    def headers(self) -> dict[str, str]:
        return {
            POLICY_VERSION_HEADER: str(self.policy_version),
            ROLLOUT_ID_HEADER: self.rollout_id,
            ATTEMPT_ID_HEADER: self.attempt_id,
        }


@dataclass(frozen=True)
class Completion:
    """One answered attempt: the request, the frontend's reply as sent, and how many sends it
    took (retries of the same attempt after a timeout or a retryable status)."""

    request: GenerationRequest
    reply: dict[str, Any]
    sends: int
    received_at: float
    errors: tuple[str, ...] = field(default=())


class Frontend:
    """The Dynamo frontend's OpenAI-compatible completions route, for rollouts."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        timeout: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.model = model
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout, transport=transport
        )
        #: Attempts answered through this client: sending one again is refused.
        self.answered: set[tuple[str, str]] = set()

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Frontend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pinned_completion(
        self,
        prompt_token_ids: Sequence[int],
        *,
        instance_id: int,
        policy_version: Any,
        rollout_id: str,
        attempt_id: str,
        max_tokens: int,
        logprobs: bool = True,
        prompt_logprobs: int | None = None,
        temperature: float = 1.0,
        timeout: float | None = None,
        tries: int = 3,
    ) -> Completion:
        """Generate once for (rollout_id, attempt_id) on `instance_id`.

        A timeout, a dropped connection or a retryable status sends the same attempt again (up
        to `tries` sends in all), with the same ids and headers. Raises `GenerationError` when
        no send was answered, or at once for a refusal (400 for an unknown pinned instance),
        and `DuplicateAttempt` when this attempt was already answered.
        """
        if isinstance(instance_id, bool) or not isinstance(instance_id, int):
            raise TypeError("instance_id must be an int (parse the API's decimal string)")
        if not prompt_token_ids or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt_token_ids
        ):
            raise TypeError("prompt_token_ids must be a non-empty sequence of ints")
        request = GenerationRequest(
            model=self.model,
            prompt_token_ids=tuple(prompt_token_ids),
            instance_id=instance_id,
            policy_version=policy_version,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            max_tokens=max_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            temperature=temperature,
            sent_at=time.time(),
        )
        if request.key in self.answered:
            raise DuplicateAttempt(f"rollout {rollout_id} attempt {attempt_id} was answered")
        errors: list[str] = []
        for send in range(1, tries + 1):
            try:
                response = self.http.post(
                    "/v1/completions",
                    json=request.body(),
                    headers=request.headers(),
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TimeoutException as exc:
                errors.append(f"send {send}: timed out ({type(exc).__name__})")
                continue
            except httpx.TransportError as exc:
                errors.append(f"send {send}: {type(exc).__name__}: {exc}")
                continue
            if response.status_code in RETRYABLE_STATUSES:
                errors.append(f"send {send}: HTTP {response.status_code}")
                continue
            if response.status_code >= 400:
                raise _refusal(response)
            self.answered.add(request.key)
            return Completion(
                request=request,
                reply=response.json(),
                sends=send,
                received_at=time.time(),
                errors=tuple(errors),
            )
        raise GenerationError(
            0, f"no answer after {tries} sends: " + "; ".join(errors), retryable=True
        )


def _refusal(response: httpx.Response) -> GenerationError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    message = str(body.get("message", response.text[:300])) if isinstance(body, dict) else ""
    kind = str(body.get("type", "")) if isinstance(body, dict) else ""
    return GenerationError(response.status_code, message, kind=kind)

"""Post-update generation check through the frontend's `/v1/completions` (contract §7).

After a refresh, each worker must prove it generates: a pinned, greedy, token-id request whose
reply carries the generated ids in the **top-level** `nvext`, echoes the prompt ids, aligns
log-probabilities with the ids, ends in a real terminal state, and names the expected model.
With a trainer fingerprint (`fingerprint.Fingerprint`) the completion must also be the one the
trainer's weights produce; agreement *between* workers is judged afterwards over all of them
(`fingerprint.cross_check`), from the samples `completion_sample` reads back out of the journal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from .admin import decode_body
from .errors import CallTimeout, TransportError, one_line
from .families.base import body_message
from .fingerprint import Fingerprint, Sample
from .http import MAX_RESPONSE_BYTES, DynamoClient
from .policy import OutboundPolicy
from .trace_join import verification_headers

# `worker_id` names the instance that really generated: a pinned check must be answered by the
# pinned worker, not merely by some replica of the model.
EXTRA_FIELDS = ("completion_token_ids", "prompt_token_ids", "detailed_finish_reason", "worker_id")
TERMINAL_FINISH = frozenset({"stop", "length"})
TERMINAL_DETAILED = frozenset({"eos", "stop", "length"})
U64_MAX = 2**64 - 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token_list(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(_is_int(t) and t >= 0 for t in value)


@dataclass(frozen=True, slots=True)
class GenerationCheck:
    model: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int = 4
    backend_instance_id: int | None = None
    expected_model: str | None = None
    #: What the trainer says the new policy generates for this prompt.
    fingerprint: Fingerprint | None = None

    def __post_init__(self) -> None:
        ids = tuple(self.prompt_token_ids)
        if not ids or not _is_token_list(list(ids)):
            raise ValueError("prompt_token_ids must be a non-empty list of token ids")
        object.__setattr__(self, "prompt_token_ids", ids)
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError("max_tokens must be a positive integer")
        bid = self.backend_instance_id
        if bid is not None and (not _is_int(bid) or not 0 <= bid <= U64_MAX):
            raise ValueError("backend_instance_id must be an unsigned 64-bit integer")

    def request_body(self) -> dict[str, Any]:
        nvext: dict[str, Any] = {"extra_fields": list(EXTRA_FIELDS)}
        if self.backend_instance_id is not None:
            # A Python int serializes as an exact JSON integer, even above 2^53.
            nvext["backend_instance_id"] = self.backend_instance_id
        return {
            "model": self.model,
            "prompt": list(self.prompt_token_ids),
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "logprobs": 0,  # the selected token's log-probability, no alternatives
            "n": 1,  # completion_token_ids requires exactly one choice
            "stream": False,
            "nvext": nvext,
        }


@dataclass(frozen=True, slots=True)
class GenerationVerdict:
    ok: bool
    reason: str | None
    completion_token_ids: tuple[int, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    detailed_finish_reason: str | None = None
    http_status: int | None = None
    body: Any = field(default=None, repr=False)
    #: The chosen tokens' log-probabilities, when the engine reported them.
    logprobs: tuple[float, ...] | None = None


def evaluate_completion(check: GenerationCheck, http_status: int, body: Any) -> GenerationVerdict:
    """Judge one unary `/v1/completions` reply. Pure: no I/O."""

    def verdict(reason: str | None, **kw: Any) -> GenerationVerdict:
        return GenerationVerdict(
            ok=reason is None,
            reason=one_line(reason) if reason else None,
            http_status=http_status,
            body=body,
            **kw,
        )

    if not 200 <= http_status < 300:
        message = body_message(body) or (one_line(body, 200) if body else "no body")
        if http_status == 400 and message == "Invalid request" and check.backend_instance_id:
            # The frontend answers this for any id it cannot route to: a worker that left, or
            # one whose model card differs from the card the first replica of this model
            # registered (different files or model path); 1.6.1 rejects the latter from the
            # model's worker set and logs "Rejected incompatible workers".
            return verdict(
                f"HTTP 400: Invalid request (the frontend does not route to backend_instance_id "
                f"{check.backend_instance_id}: the worker left, or the frontend rejected its "
                f"model card as different from another replica's; see its log for "
                f"'Rejected incompatible workers')"
            )
        return verdict(f"HTTP {http_status}: {message}")
    if not isinstance(body, dict):
        return verdict("response is not a JSON object")
    if "error" in body:
        return verdict(f"response carries an error: {body_message(body) or body['error']!r}")

    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        n = len(choices) if isinstance(choices, list) else "no"
        return verdict(f"expected exactly one choice, got {n}")
    choice = choices[0]

    nvext = body.get("nvext")
    if not isinstance(nvext, dict) or "completion_token_ids" not in nvext:
        where = " (found inside the choice, not top-level)" if "nvext" in choice else ""
        return verdict(f"top-level nvext.completion_token_ids missing{where}")
    completion = nvext.get("completion_token_ids")
    if not _is_token_list(completion) or not completion:
        return verdict("nvext.completion_token_ids must be a non-empty list of token ids")
    prompt = nvext.get("prompt_token_ids")
    finish = choice.get("finish_reason")
    detailed = nvext.get("detailed_finish_reason")
    facts: dict[str, Any] = {
        "completion_token_ids": tuple(completion),
        "prompt_token_ids": tuple(prompt) if _is_token_list(prompt) else (),
        "finish_reason": finish if isinstance(finish, str) else None,
        "detailed_finish_reason": detailed if isinstance(detailed, str) else None,
    }

    if not _is_token_list(prompt):
        return verdict("nvext.prompt_token_ids missing or not a list of token ids", **facts)
    if tuple(prompt) != check.prompt_token_ids:
        return verdict(
            f"echoed prompt ids {one_line(prompt, 120)} differ from the sent "
            f"{one_line(list(check.prompt_token_ids), 120)}",
            **facts,
        )
    if len(completion) > check.max_tokens:
        return verdict(
            f"{len(completion)} completion ids exceed max_tokens={check.max_tokens}", **facts
        )

    logprobs = choice.get("logprobs")
    if logprobs is not None:
        problem = _logprobs_problem(logprobs, len(completion))
        if problem:
            return verdict(problem, **facts)

    if finish not in TERMINAL_FINISH:
        return verdict(f"finish_reason {finish!r} is not a terminal stop/length", **facts)
    if detailed is None:
        if finish == "stop":
            # Cancellation also maps to `stop`; without the detail they are indistinguishable.
            return verdict(
                "finish_reason 'stop' without detailed_finish_reason: cannot rule out cancellation",
                **facts,
            )
    elif detailed not in TERMINAL_DETAILED:
        return verdict(f"detailed_finish_reason {detailed!r} is not a normal finish", **facts)
    elif (finish == "length") != (detailed == "length"):
        return verdict(
            f"finish_reason {finish!r} disagrees with detailed_finish_reason {detailed!r}",
            **facts,
        )
    if finish == "length" and len(completion) != check.max_tokens:
        return verdict(
            f"finish 'length' after {len(completion)} ids, expected max_tokens={check.max_tokens}",
            **facts,
        )

    answered_by = _decode_worker(nvext.get("worker_id"))
    if check.backend_instance_id is not None and answered_by not in (
        None,
        check.backend_instance_id,
    ):
        return verdict(
            f"pinned to backend_instance_id {check.backend_instance_id} but worker "
            f"{answered_by} generated",
            **facts,
        )
    if check.expected_model is not None and body.get("model") != check.expected_model:
        return verdict(
            f"model {body.get('model')!r} is not the expected {check.expected_model!r}", **facts
        )
    facts["logprobs"] = _chosen_logprobs(logprobs)
    if check.fingerprint is not None:
        problem = check.fingerprint.mismatch(completion, facts["logprobs"])
        if problem:
            return verdict(problem, **facts)
    return verdict(None, **facts)


def _decode_worker(worker_id: Any) -> int | None:
    """The decode worker's instance id from `nvext.worker_id`, when the frontend reported one."""
    if isinstance(worker_id, dict) and _is_int(worker_id.get("decode_worker_id")):
        return int(worker_id["decode_worker_id"])
    return None


def _chosen_logprobs(logprobs: Any) -> tuple[float, ...] | None:
    """The validated `token_logprobs` of a choice, or None when the engine sent none."""
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("token_logprobs"), list):
        return None
    return tuple(float(v) for v in logprobs["token_logprobs"])


def completion_sample(key: str, body: Any) -> Sample | None:
    """A verified reply's completion ids and logprobs, read back from a stored body.

    Only called on replies `evaluate_completion` accepted; anything else gives None.
    """
    if not isinstance(body, dict):
        return None
    nvext = body.get("nvext")
    choices = body.get("choices")
    if not isinstance(nvext, dict) or not isinstance(choices, list) or len(choices) != 1:
        return None
    ids = nvext.get("completion_token_ids")
    if not _is_token_list(ids) or not isinstance(choices[0], dict):
        return None
    logprobs = choices[0].get("logprobs")
    if logprobs is not None and _logprobs_problem(logprobs, len(ids)):
        return None
    return Sample(key, tuple(ids), _chosen_logprobs(logprobs))


def _logprobs_problem(logprobs: Any, n: int) -> str | None:
    if not isinstance(logprobs, dict):
        return "choice logprobs is not an object"
    tokens = logprobs.get("tokens")
    values = logprobs.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list):
        return "logprobs lacks tokens/token_logprobs lists"
    if len(tokens) != n or len(values) != n:
        return (
            f"logprobs cover {len(tokens)} tokens / {len(values)} values but "
            f"{n} completion ids were generated"
        )
    for value in values:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return "token_logprobs contains a non-number"
        if math.isnan(value) or value > 0:
            return f"token_logprobs contains an impossible value {value!r}"
    return None


async def run_generation_check(
    client: DynamoClient,
    policy: OutboundPolicy,
    frontend_url: str,
    check: GenerationCheck,
    *,
    timeout: float,
) -> GenerationVerdict:
    """POST the check to `{frontend_url}/v1/completions`; never raises for network problems."""
    url = frontend_url.rstrip("/") + "/v1/completions"
    problem = await policy.aviolation(url)
    if problem is not None:
        return GenerationVerdict(False, f"outbound policy: {problem}")
    try:
        reply = await client.send(
            "POST",
            url,
            json_body=check.request_body(),
            timeout=timeout,
            limit=MAX_RESPONSE_BYTES,
            # A verification request: its rollout and attempt ids join Dynamo's request traces
            # to the refresh or catch-up that sent it (trace_join.py).
            extra_headers=verification_headers(),
        )
    except CallTimeout:
        return GenerationVerdict(False, f"frontend timed out after {timeout:g}s")
    except TransportError as exc:
        return GenerationVerdict(False, one_line(f"frontend unreachable: {exc.reason}"))
    status, raw = reply.status, reply.raw
    if raw is None:
        return GenerationVerdict(False, "frontend response too large", http_status=status)
    body = decode_body(raw)
    if 300 <= status < 400:
        return GenerationVerdict(False, f"HTTP {status} redirect not followed", http_status=status)
    return evaluate_completion(check, status, body)

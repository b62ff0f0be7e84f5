"""The sample-admission guard: may this sample go into a training batch?

`admit(sample, request, reply, view)` checks a sample against the frontend's reply and the
request that produced it, by the admission rules of Dynamo's RL integration reference, and
returns every rule that failed (not just the first, so a rejected sample says all that was
wrong with it). It never tokenizes text: the engine's token ids are the only authority.

- `token_ids`: the reply has the expected number of choices and `nvext.completion_token_ids`
  (ints); the sample's ids are exactly those; an echoed `prompt_token_ids` is the request's
  prompt, and so is the sample's.
- `selected_logprobs`: when asked for, one finite logprob (<= 0) per generated id, in the reply
  and in the sample, in the same order.
- `prompt_logprobs`: when asked for, one entry per prompt position, position 0 undefined
  (`None`), every defined entry scores the prompt's own id at that position (so a shift shows),
  and the sample keeps `None` exactly where the reply has it.
- `finish`: a terminal, recognised finish: `length` with exactly `max_tokens` ids, or `stop`
  whose detailed reason is `eos` or `stop` (a cancelled request also reads `stop`).
- `identity`: the reply's model is the request's and the sample's, the pinned instance served
  it, and that instance registered the same model (and tokenizer, when both are known).
- `admitted`: the serving instance was admitted at the sample's stamped version when the
  request was sent (serving ledger, or the gate; see `admission`).
- `duplicate` (`AdmissionGuard` only): this (rollout, attempt) was not admitted before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dynamo_rl_trainer.admission import AdmissionView
from dynamo_rl_trainer.generation import Completion, GenerationRequest
from dynamo_rl_trainer.results import same_version

TOKEN_IDS = "token_ids"
SELECTED_LOGPROBS = "selected_logprobs"
PROMPT_LOGPROBS = "prompt_logprobs"
FINISH = "finish"
IDENTITY = "identity"
ADMITTED = "admitted"
DUPLICATE = "duplicate"
RULES = (TOKEN_IDS, SELECTED_LOGPROBS, PROMPT_LOGPROBS, FINISH, IDENTITY, ADMITTED, DUPLICATE)

#: `detailed_finish_reason` values that mean the engine finished the sequence.
TERMINAL_DETAILED = frozenset({"eos", "stop", "length"})


@dataclass(frozen=True)
class Sample:
    """What the trainer will train on, stamped with the policy version it was generated for.

    Build it from a completion with `Sample.from_completion`; a trainer that post-processes a
    sample still hands the guard what it will actually use."""

    rollout_id: str
    attempt_id: str
    policy_version: Any
    model: str
    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None
    #: Aligned with the prompt: `None` where the engine defines no logprob (position 0).
    prompt_logprobs: tuple[float | None, ...] | None = None
    tokenizer: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.rollout_id, self.attempt_id)

    @classmethod
    def from_completion(cls, completion: Completion, *, tokenizer: str | None = None) -> Sample:
        """The sample as the reply carries it; missing parts stay empty (the guard says so)."""
        request, reply = completion.request, completion.reply
        nvext = _nvext(reply)
        choice = _first_choice(reply) or {}
        ids = nvext.get("completion_token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        prompt_lp = nvext.get("prompt_logprobs")
        prompt = request.prompt_token_ids
        return cls(
            rollout_id=request.rollout_id,
            attempt_id=request.attempt_id,
            policy_version=request.policy_version,
            model=request.model,
            prompt_token_ids=tuple(prompt),
            completion_token_ids=tuple(ids) if isinstance(ids, list) else (),
            logprobs=tuple(logprobs) if isinstance(logprobs, list) else None,
            prompt_logprobs=(
                tuple(_chosen_logprob(e, t) for e, t in zip(prompt_lp, prompt, strict=False))
                if isinstance(prompt_lp, list)
                else None
            ),
            tokenizer=tokenizer,
        )


@dataclass(frozen=True)
class Failure:
    rule: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    """Accepted, or rejected with every rule that failed."""

    sample: Sample
    failures: tuple[Failure, ...] = field(default=())
    #: Which record answered the admission rule (`ledger` or `gate`).
    basis: str = ""

    @property
    def accepted(self) -> bool:
        return not self.failures

    @property
    def failed_rules(self) -> tuple[str, ...]:
        """Each failed rule once, in the order the rules run."""
        return tuple(dict.fromkeys(f.rule for f in self.failures))


def admit(
    sample: Sample, request: GenerationRequest, reply: dict[str, Any], view: AdmissionView
) -> Verdict:
    """Check one sample against its request and reply; see the module docstring."""
    failures: list[Failure] = []
    nvext = _nvext(reply)
    choice = _first_choice(reply)

    def fail(rule: str, reason: str) -> None:
        failures.append(Failure(rule, reason))

    ids = nvext.get("completion_token_ids")
    ids_ok = _int_list(ids)
    for reason in _token_ids(sample, request, reply, nvext, ids):
        fail(TOKEN_IDS, reason)
    for reason in _selected_logprobs(sample, request, choice, ids if ids_ok else None):
        fail(SELECTED_LOGPROBS, reason)
    for reason in _prompt_logprobs(sample, request, nvext):
        fail(PROMPT_LOGPROBS, reason)
    for reason in _finish(request, choice, nvext, ids if ids_ok else None):
        fail(FINISH, reason)
    served_by = _served_by(nvext)
    for reason in _identity(sample, request, reply, served_by, view):
        fail(IDENTITY, reason)
    basis = ""
    if served_by is not None:
        if not same_version(sample.policy_version, request.policy_version):
            fail(
                ADMITTED,
                f"sample is stamped {sample.policy_version!r} but was requested for "
                f"{request.policy_version!r}",
            )
        admission = view.admission(served_by, sample.policy_version, request.sent_at)
        basis = admission.basis
        if not admission.admitted:
            fail(ADMITTED, admission.reason)
    else:
        fail(ADMITTED, "the reply does not say which instance served it (nvext.worker_id)")
    return Verdict(sample=sample, failures=tuple(failures), basis=basis)


class AdmissionGuard:
    """`admit` plus duplicate suppression: one (rollout, attempt) is admitted at most once,
    however many replies for it arrive (a timed-out send that completed after all, a retry)."""

    def __init__(self) -> None:
        self.admitted: set[tuple[str, str]] = set()
        self.duplicates = 0

    def admit(
        self,
        sample: Sample,
        request: GenerationRequest,
        reply: dict[str, Any],
        view: AdmissionView,
    ) -> Verdict:
        verdict = admit(sample, request, reply, view)
        if sample.key in self.admitted:
            self.duplicates += 1
            duplicate = Failure(
                DUPLICATE, f"rollout {sample.rollout_id} attempt {sample.attempt_id} was admitted"
            )
            return Verdict(sample, (*verdict.failures, duplicate), verdict.basis)
        if verdict.accepted:
            self.admitted.add(sample.key)
        return verdict

    def admit_completion(
        self, completion: Completion, view: AdmissionView, *, tokenizer: str | None = None
    ) -> Verdict:
        sample = Sample.from_completion(completion, tokenizer=tokenizer)
        return self.admit(sample, completion.request, completion.reply, view)


# -- the rules --------------------------------------------------------------------------------
def _nvext(reply: dict[str, Any]) -> dict[str, Any]:
    nvext = reply.get("nvext")
    return nvext if isinstance(nvext, dict) else {}


def _first_choice(reply: dict[str, Any]) -> dict[str, Any] | None:
    choices = reply.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


def _token_ids(
    sample: Sample,
    request: GenerationRequest,
    reply: dict[str, Any],
    nvext: dict[str, Any],
    ids: Any,
) -> list[str]:
    reasons = []
    choices = reply.get("choices")
    count = len(choices) if isinstance(choices, list) else 0
    if count != request.n:
        reasons.append(f"{count} choice(s) in the reply, {request.n} expected")
    if ids is None:
        reasons.append("the reply has no nvext.completion_token_ids")
    elif not _int_list(ids):
        reasons.append("nvext.completion_token_ids is not a list of token ids")
    elif tuple(ids) != tuple(sample.completion_token_ids):
        reasons.append("the sample's completion ids differ from the engine's")
    echoed = nvext.get("prompt_token_ids")
    if echoed is not None and (
        not _int_list(echoed) or tuple(echoed) != tuple(request.prompt_token_ids)
    ):
        reasons.append("the engine's prompt_token_ids are not the prompt that was sent")
    if tuple(sample.prompt_token_ids) != tuple(request.prompt_token_ids):
        reasons.append("the sample's prompt ids are not the prompt that was sent")
    return reasons


def _finite_logprob(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value <= 0
    )


def _selected_logprobs(
    sample: Sample, request: GenerationRequest, choice: dict[str, Any] | None, ids: Any
) -> list[str]:
    if not request.logprobs:
        return ["the sample carries logprobs that were not asked for"] if sample.logprobs else []
    block = (choice or {}).get("logprobs")
    values = block.get("token_logprobs") if isinstance(block, dict) else None
    if not isinstance(values, list):
        return ["logprobs were asked for but the reply has none"]
    reasons = []
    if ids is not None and len(values) != len(ids):
        reasons.append(f"{len(values)} logprobs for {len(ids)} generated ids")
    tokens = block.get("tokens") if isinstance(block, dict) else None
    if isinstance(tokens, list) and len(tokens) != len(values):
        reasons.append(f"{len(tokens)} logprob tokens for {len(values)} logprobs")
    if not all(_finite_logprob(v) for v in values):
        reasons.append("a selected logprob is missing, positive or not finite")
    if sample.logprobs is None or tuple(sample.logprobs) != tuple(values):
        reasons.append("the sample's logprobs are not the engine's, in the engine's order")
    return reasons


def _chosen_logprob(entry: Any, token_id: int) -> float | None:
    """The logprob of the prompt's own token at one position (None where undefined)."""
    if not isinstance(entry, dict):
        return None
    scored = entry.get(str(token_id))
    value = scored.get("logprob") if isinstance(scored, dict) else None
    return float(value) if value is not None and _finite_logprob(value) else None


def _prompt_logprobs(
    sample: Sample, request: GenerationRequest, nvext: dict[str, Any]
) -> list[str]:
    if request.prompt_logprobs is None:
        if sample.prompt_logprobs is not None:
            return ["the sample carries prompt logprobs that were not asked for"]
        return []
    entries = nvext.get("prompt_logprobs")
    prompt: Sequence[int] = request.prompt_token_ids
    if not isinstance(entries, list):
        return ["prompt logprobs were asked for but the reply has none"]
    reasons = []
    if len(entries) != len(prompt):
        reasons.append(f"{len(entries)} prompt logprob positions for a {len(prompt)}-token prompt")
    if entries and entries[0] is not None:
        reasons.append("position 0 has a prompt logprob: the undefined first position was lost")
    for pos, (entry, token) in enumerate(zip(entries, prompt, strict=False)):
        if entry is None:
            continue
        if not isinstance(entry, dict) or _chosen_logprob(entry, token) is None:
            reasons.append(f"position {pos} does not score the prompt's token {token}")
            break
    expected = tuple(_chosen_logprob(e, t) for e, t in zip(entries, prompt, strict=False))
    if sample.prompt_logprobs is None or tuple(sample.prompt_logprobs) != expected:
        reasons.append("the sample's prompt logprobs are not the engine's, position for position")
    return reasons


def _finish(
    request: GenerationRequest, choice: dict[str, Any] | None, nvext: dict[str, Any], ids: Any
) -> list[str]:
    finish = (choice or {}).get("finish_reason")
    detailed = nvext.get("detailed_finish_reason")
    if finish is None:
        return ["the reply has no finish_reason: the generation did not end"]
    if finish == "length":
        if detailed is not None and detailed != "length":
            return [f"finish_reason length but detailed_finish_reason {detailed!r}"]
        if ids is not None and len(ids) != request.max_tokens:
            return [f"finish_reason length after {len(ids)} of {request.max_tokens} tokens"]
        return []
    if finish == "stop":
        if detailed is None:
            return ["finish_reason stop without detailed_finish_reason (cancellation reads stop)"]
        if detailed not in TERMINAL_DETAILED:
            return [f"the generation ended {detailed!r}, not at a stop or end of sequence"]
        return []
    return [f"finish_reason {finish!r} is not a terminal state a sample may end in"]


def _served_by(nvext: dict[str, Any]) -> int | None:
    worker = nvext.get("worker_id")
    if not isinstance(worker, dict):
        return None
    decode = worker.get("decode_worker_id")
    return decode if isinstance(decode, int) and not isinstance(decode, bool) else None


def _identity(
    sample: Sample,
    request: GenerationRequest,
    reply: dict[str, Any],
    served_by: int | None,
    view: AdmissionView,
) -> list[str]:
    reasons = []
    if reply.get("model") != request.model:
        reasons.append(f"the reply's model {reply.get('model')!r} is not {request.model!r}")
    if sample.model != request.model:
        reasons.append(f"the sample names model {sample.model!r}, the request {request.model!r}")
    if served_by is not None and served_by != request.instance_id:
        reasons.append(f"served by instance {served_by}, pinned to {request.instance_id}")
    worker = view.identity(served_by) if served_by is not None else None
    if worker is not None:
        if worker.model and worker.model != request.model:
            reasons.append(f"instance {served_by} registered model {worker.model!r}")
        if sample.tokenizer and worker.tokenizer and worker.tokenizer != sample.tokenizer:
            reasons.append(
                f"instance {served_by} uses tokenizer {worker.tokenizer!r}, "
                f"the sample {sample.tokenizer!r}"
            )
    return reasons

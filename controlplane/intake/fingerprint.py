"""The trainer fingerprint as the webhook and the JSON API accept it.

Typed for the OpenAPI schema and the webhook's JSON schema; the semantics (bounds, finite
numbers, at least one of ids and logprobs) come from `dynamo.fingerprint.Fingerprint`, the same
class the verify step compares with, so every entry point refuses the same input.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, model_validator

from controlplane.dynamo.fingerprint import MAX_FINGERPRINT_TOKENS, MAX_TOKEN_ID, Fingerprint

TokenId = Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID)]
LogProb = Annotated[StrictFloat | StrictInt, Field(le=0, allow_inf_nan=False)]
TokenList = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_FINGERPRINT_TOKENS)]


class FingerprintIn(BaseModel):
    """What the new policy generates, greedy, for the verification prompt."""

    model_config = ConfigDict(extra="forbid")

    completion_token_ids: TokenList | None = Field(
        None, description="the first completion ids every worker must generate exactly"
    )
    logprobs: (
        Annotated[list[LogProb], Field(min_length=1, max_length=MAX_FINGERPRINT_TOKENS)] | None
    ) = Field(None, description="the chosen tokens' log-probabilities, position by position")
    logprob_tolerance: float | None = Field(
        None,
        gt=0,
        le=10,
        allow_inf_nan=False,
        description="largest allowed |Δ| per position (default 0.05)",
    )
    prompt_token_ids: TokenList | None = Field(
        None, description="the prompt these were generated from; default: the refresh's prompt"
    )

    @model_validator(mode="after")
    def _complete(self):
        Fingerprint.from_dict(self.as_dict())  # ValueError → a validation error (4xx)
        return self

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)

"""The options that describe a policy refresh to plan, shared by `refresh plan` and
`policy_refresh`, and the one call that turns them into a stored plan."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.exceptions import ValidationError

from controlplane.accounts.management.commands._cli import Exit, Refused, shown
from controlplane.audit.recorder import Actor
from controlplane.dynamo.fingerprint import fingerprint_from_text
from controlplane.fleet.models import Source
from controlplane.refresh import actions
from controlplane.refresh.models import PolicyRefresh
from controlplane.refresh.targets import PAUSE_MODE_CHOICES

#: A fingerprint file holds at most a few hundred numbers; anything bigger is a mistake.
MAX_FINGERPRINT_FILE_BYTES = 64 * 1024


def add_plan_arguments(parser) -> None:
    parser.add_argument("source", help="source name")
    parser.add_argument(
        "--weight-version",
        required=True,
        metavar="V",
        help="the policy version every worker must report afterwards",
    )
    parser.add_argument("--model-path", required=True, help="checkpoint path the workers load")
    parser.add_argument(
        "--namespace", action="append", dest="namespaces", default=None, help="repeatable"
    )
    parser.add_argument(
        "--pause-mode",
        choices=PAUSE_MODE_CHOICES,
        default="auto",
        help="auto = each family's own default; a family refuses a mode it lacks",
    )
    parser.add_argument(
        "--pause-mode-for",
        action="append",
        default=[],
        metavar="FAMILY=MODE",
        help="a pause mode for one family only, e.g. sglang=retract (repeatable)",
    )
    parser.add_argument("--flush", choices=["auto", "always"], default="auto")
    parser.add_argument("--no-generation", action="store_true", help="skip generation check")
    parser.add_argument("--prompt-token-ids", default="5,6,7,8")
    parser.add_argument("--expected-model", default="")
    parser.add_argument(
        "--expect-tokens",
        metavar="IDS",
        help="trainer fingerprint: comma-separated completion ids every worker must generate",
    )
    parser.add_argument(
        "--expect-logprobs",
        metavar="LPS",
        help="trainer fingerprint: comma-separated reference logprobs of the chosen tokens",
    )
    parser.add_argument(
        "--logprob-tolerance",
        metavar="TOL",
        help="largest allowed |Δ| per reference logprob (default 0.05)",
    )
    parser.add_argument(
        "--fingerprint-file",
        metavar="PATH",
        help='JSON {"completion_token_ids": [...], "logprobs": [...], '
        '"logprob_tolerance": x, "prompt_token_ids": [...]}',
    )


def read_fingerprint(opts) -> dict | None:
    """The trainer fingerprint from the options or a JSON file; raises ValueError."""
    inline = opts["expect_tokens"] or opts["expect_logprobs"] or opts["logprob_tolerance"]
    if opts["fingerprint_file"]:
        if inline:
            raise ValueError("give the fingerprint either inline or as --fingerprint-file")
        path = Path(opts["fingerprint_file"])
        try:
            if path.stat().st_size > MAX_FINGERPRINT_FILE_BYTES:
                raise ValueError(f"{path} is larger than {MAX_FINGERPRINT_FILE_BYTES} bytes")
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"cannot read fingerprint file {path}: {exc}") from None
        return data  # validated by plan_policy_refresh, like any other entry point
    return fingerprint_from_text(
        opts["expect_tokens"] or "", opts["expect_logprobs"] or "", opts["logprob_tolerance"]
    )


def plan_from_options(opts, actor: Actor) -> PolicyRefresh:
    """Plan through `actions.plan_policy_refresh` (fresh discovery, stored, audited as
    `actor`). Bad input is a USAGE refusal and plans nothing; blockers are stored, not raised."""
    source = Source.objects.filter(name=opts["source"]).first()
    if source is None:
        raise Refused(f"no source named {shown(opts['source'])}", Exit.NOT_FOUND)
    try:
        prompt = [int(t) for t in opts["prompt_token_ids"].split(",")]
        return actions.plan_policy_refresh(
            source=source,
            actor=actor,
            target={
                "weight_version": opts["weight_version"],
                "method": "disk",
                "model_path": opts["model_path"],
            },
            namespaces=opts["namespaces"],
            pause_mode=opts["pause_mode"],
            pause_modes=dict(item.partition("=")[::2] for item in opts["pause_mode_for"]),
            flush_policy=opts["flush"],
            verification={
                "generation": not opts["no_generation"],
                "prompt_token_ids": prompt,
                "expected_model": opts["expected_model"],
            },
            fingerprint=read_fingerprint(opts),
        )
    except ValidationError as exc:
        raise Refused("; ".join(exc.messages), Exit.USAGE, "invalid_input") from None
    except ValueError as exc:
        raise Refused(str(exc), Exit.USAGE, "invalid_input") from None


def blocker_lines(refresh: PolicyRefresh) -> list[str]:
    """The plan's blockers, each blocked worker named with why, so one line is enough to act."""
    return [shown(b) for b in refresh.plan_blockers] + [
        f"{shown(w.key)}: {', '.join(shown(b) for b in w.blockers)}"
        for w in refresh.workers.all()
        if w.blockers
    ]

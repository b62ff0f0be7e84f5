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
from controlplane.refresh import intents
from controlplane.refresh.models import PolicyRefresh
from controlplane.refresh.strategy import EVALUATIONS, KINDS, StrategyJson, parse_strategy
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
    parser.add_argument(
        "--method",
        choices=["disk", "external"],
        default="disk",
        help="disk: the workers load --model-path; external: the trainer's framework applies "
        "the weights itself and reports applied",
    )
    parser.add_argument("--model-path", help="checkpoint path the workers load (disk)")
    parser.add_argument(
        "--apply-timeout",
        type=float,
        metavar="S",
        help="external: seconds the paused workers wait for the applied report",
    )
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
    parser.add_argument(
        "--inflight-may-straddle",
        action="store_true",
        help="declare that requests in flight may continue on the new weights (needed by a "
        "pause mode that keeps them: keep, retract, in_place)",
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
    add_strategy_arguments(parser)
    parser.add_argument(
        "--fingerprint-file",
        metavar="PATH",
        help='JSON {"completion_token_ids": [...], "logprobs": [...], '
        '"logprob_tolerance": x, "prompt_token_ids": [...]}',
    )


def add_strategy_arguments(parser) -> None:
    """How the refresh walks its scope; none of these given: the source's default strategy."""
    group = parser.add_argument_group(
        "strategy", "how the refresh walks its scope (none given: the source's default strategy)"
    )
    group.add_argument("--strategy", choices=KINDS, help="all_at_once, waves or canary")
    group.add_argument(
        "--max-unavailable",
        metavar="N|P%",
        help="waves and canary: most workers of a namespace paused at once, e.g. 2 or 10%%",
    )
    group.add_argument(
        "--max-failed",
        metavar="N|P%",
        help="failure budget: workers that may fail and be quarantined before it holds",
    )
    group.add_argument(
        "--pause-after",
        action="append",
        type=int,
        default=[],
        metavar="WAVE",
        help="wait after this wave until continued (repeatable)",
    )
    group.add_argument(
        "--admit-as-verified",
        action="store_true",
        help="verified workers join the gate wave by wave",
    )
    group.add_argument(
        "--canary", metavar="N|P%", help="canary of N workers (or P%% of the scope) first"
    )
    group.add_argument(
        "--canary-instance",
        action="append",
        default=[],
        dest="canary_instances",
        metavar="ID",
        help="this instance is in the canary (repeatable; instead of --canary)",
    )
    group.add_argument(
        "--canary-evaluation",
        choices=EVALUATIONS,
        help="none (the checks alone, default), manual (a person) or trainer (its verdict)",
    )
    group.add_argument(
        "--canary-timeout", type=int, metavar="SECONDS", help="how long a verdict is waited for"
    )
    group.add_argument(
        "--canary-analysis",
        metavar="TEMPLATE",
        help="judge the canary against the baseline with this analysis template of the source "
        "first (docs/concepts/canary-analysis.md)",
    )
    group.add_argument(
        "--instance",
        action="append",
        default=[],
        dest="instances",
        metavar="ID",
        help="refresh only this instance of the scope; the rest keep serving (repeatable)",
    )


def strategy_from_options(opts) -> StrategyJson | None:
    """The strategy's JSON form, or None when no strategy option was given. A canary option
    without --strategy means a canary. Raises Refused (usage) when it does not validate."""
    canary_given = (
        opts.get("canary") is not None
        or bool(opts.get("canary_instances"))
        or opts.get("canary_evaluation") is not None
        or opts.get("canary_timeout") is not None
        or opts.get("canary_analysis") is not None
    )
    kind = opts.get("strategy") or ("canary" if canary_given else None)
    given = (
        kind is not None
        or opts.get("max_unavailable") is not None
        or opts.get("max_failed") is not None
        or bool(opts.get("pause_after"))
        or bool(opts.get("admit_as_verified"))
    )
    if not given:
        return None
    raw: dict = {"kind": kind or "all_at_once"}
    for key in ("max_unavailable", "max_failed"):
        if opts.get(key) is not None:
            raw[key] = opts[key]
    if opts.get("pause_after"):
        raw["pause_after"] = opts["pause_after"]
    if opts.get("admit_as_verified"):
        raw["admit_as_verified"] = True
    if canary_given:
        canary: dict = {}
        if opts.get("canary") is not None:
            canary["size"] = opts["canary"]
        if opts.get("canary_instances"):
            canary["instances"] = opts["canary_instances"]
        if opts.get("canary_evaluation") is not None:
            canary["evaluation"] = opts["canary_evaluation"]
        if opts.get("canary_timeout") is not None:
            canary["timeout_seconds"] = opts["canary_timeout"]
        if opts.get("canary_analysis") is not None:
            canary["analysis"] = opts["canary_analysis"]
        raw["canary"] = canary
    try:
        return parse_strategy(raw).to_dict()
    except ValidationError as exc:
        raise Refused("; ".join(exc.messages), Exit.USAGE, "invalid_strategy") from None


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
    found = fingerprint_from_text(
        opts["expect_tokens"] or "", opts["expect_logprobs"] or "", opts["logprob_tolerance"]
    )
    return None if found is None else dict(found)


def target_from_options(opts) -> dict:
    """The target policy of `--method` (disk needs `--model-path`); raises ValueError."""
    method = opts.get("method") or "disk"
    target = {"weight_version": opts["weight_version"], "method": method}
    if method == "disk":
        if not opts.get("model_path"):
            raise ValueError("a disk update needs --model-path")
        target["model_path"] = opts["model_path"]
    elif opts.get("apply_timeout") is not None:
        target["apply_timeout_s"] = opts["apply_timeout"]
    return target


def plan_from_options(opts, actor: Actor) -> PolicyRefresh:
    """Plan through `intents.plan_policy_refresh` (fresh discovery, stored, audited as
    `actor`). Bad input is a USAGE refusal and plans nothing; blockers are stored, not raised."""
    source = Source.objects.filter(name=opts["source"]).first()
    if source is None:
        raise Refused(f"no source named {shown(opts['source'])}", Exit.NOT_FOUND)
    try:
        prompt = [int(t) for t in opts["prompt_token_ids"].split(",")]
        return intents.plan_policy_refresh(
            source=source,
            actor=actor,
            target=target_from_options(opts),
            namespaces=opts["namespaces"],
            pause_mode=opts["pause_mode"],
            pause_modes=dict(item.partition("=")[::2] for item in opts["pause_mode_for"]),
            inflight_may_straddle=bool(opts.get("inflight_may_straddle")),
            flush_policy=opts["flush"],
            verification={
                "generation": not opts["no_generation"],
                "prompt_token_ids": prompt,
                "expected_model": opts["expected_model"],
            },
            fingerprint=read_fingerprint(opts),
            strategy=strategy_from_options(opts),
            instances=opts.get("instances") or None,
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

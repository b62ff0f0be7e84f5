"""Plan-time checks of a canary analysis (`strategy.canary.analysis`): refused at plan time,
never judged on nothing.

- the named template must exist for the source and hold at least its `min_prompts` prompts;
- there must be a baseline: workers outside the canary that still serve another version than
  the target. When every worker outside the canary already serves it (everything is already
  on V), there is nothing to compare the canary with.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import ValidationError

from controlplane.analysis.models import AnalysisTemplate
from controlplane.analysis.spec import TemplateSpec, parse_template
from controlplane.fleet.models import Worker
from controlplane.refresh.strategy import CANARY, Strategy


def template_spec(source, name: str) -> tuple[AnalysisTemplate | None, TemplateSpec | None, str]:
    """The source's latest version of template `name`, parsed; or why there is none."""
    template = AnalysisTemplate.latest(source, name)
    if template is None:
        return None, None, f"canary analysis: source {source.name!r} has no template {name!r}"
    try:
        spec = parse_template(template.body)
    except ValidationError as exc:
        return template, None, f"canary analysis: template {name!r} is invalid: {exc.messages[0]}"
    return template, spec, ""


def analysis_blockers(
    source,
    strategy: Strategy,
    selected: list[Worker],
    wave_of: Mapping[str, int],
    target_version,
) -> list[str]:
    if strategy.kind != CANARY or strategy.canary is None or not strategy.canary.analysis:
        return []
    name = strategy.canary.analysis
    blockers = []
    _template, spec, problem = template_spec(source, name)
    if problem:
        blockers.append(problem)
    elif spec is not None and len(spec.prompts) < spec.min_prompts:
        blockers.append(
            f"canary analysis: template {name!r} has {len(spec.prompts)} prompt(s); it needs "
            f"at least {spec.min_prompts} to judge a canary"
        )
    if not source.frontend_url:
        blockers.append("canary analysis: the source has no frontend URL to send prompts through")
    baseline = [
        w
        for w in selected
        if wave_of.get(w.key, 1) != 1 and str(w.weight_version) != str(target_version)
    ]
    if selected and not baseline:
        blockers.append(
            "canary analysis: no baseline workers: every worker outside the canary already "
            f"serves {target_version!r}, so there is nothing to compare the canary with"
        )
    return blockers

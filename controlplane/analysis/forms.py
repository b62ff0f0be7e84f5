"""The web form that saves a new version of an analysis template: its JSON body, optionally
with the prompts replaced by an uploaded prompt file (JSON lines)."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from controlplane.analysis.models import NOTE_CHARS
from controlplane.analysis.spec import MAX_TEMPLATE_BYTES, read_prompt_lines
from controlplane.dynamo.jsonsafe import UnsafeJSON, loads_bounded

#: The body as typed: the template's own limit (checked on its compact JSON by `parse_template`)
#: plus room for the indentation `pretty` and people add.
BODY_TEXT_CHARS = MAX_TEMPLATE_BYTES + 64 * 1024


class TemplateForm(forms.Form):
    name = forms.SlugField(max_length=64, help_text="letters, digits, hyphens, underscores")
    body = forms.CharField(
        label="Template (JSON)",
        widget=forms.Textarea(attrs={"rows": 18, "class": "mono", "spellcheck": "false"}),
        max_length=BODY_TEXT_CHARS,
        strip=False,
        help_text="prompts, judge, min_prompts, max_tokens, background: see the docs page "
        "“Canary analysis templates”",
    )
    prompt_file = forms.FileField(
        required=False,
        label="Prompt file",
        help_text='optional: JSON lines, one {"prompt": [...], "continuation": [...]} each; '
        "replaces the body's prompts. At most 1 MiB.",
    )
    note = forms.CharField(max_length=NOTE_CHARS, required=False, help_text="why this version")

    def clean_body(self) -> Any:
        text = self.cleaned_data["body"]
        try:
            raw = loads_bounded(text, max_depth=settings.JSON_MAX_DEPTH, max_bytes=BODY_TEXT_CHARS)
        except UnsafeJSON as exc:
            raise ValidationError(f"not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValidationError("must be a JSON object")
        return raw

    def clean_prompt_file(self) -> list[Any] | None:
        upload = self.cleaned_data.get("prompt_file")
        if not upload:
            return None
        if upload.size > MAX_TEMPLATE_BYTES:
            raise ValidationError(f"{upload.size} bytes; at most {MAX_TEMPLATE_BYTES} (1 MiB)")
        try:
            text = upload.read(MAX_TEMPLATE_BYTES + 1).decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationError("not UTF-8 text") from None
        try:
            return read_prompt_lines(text)
        except ValidationError as exc:
            raise ValidationError(exc.messages) from None

    def template_json(self) -> Any:
        """The body to save: the JSON body, its prompts replaced by the file's when given."""
        raw = dict(self.cleaned_data["body"])
        if self.cleaned_data.get("prompt_file") is not None:
            raw["prompts"] = self.cleaned_data["prompt_file"]
        return raw

    def add_service_error(self, exc: ValidationError) -> None:
        """Field errors from `save_template`: `name` and `note` on their fields, the body's
        (keyed by path inside it: `judge.pass_score`) on the body, each prefixed with its path."""
        if not hasattr(exc, "error_dict"):
            self.add_error("body", exc.messages)
            return
        for path, messages in exc.message_dict.items():
            if path in ("name", "note"):
                self.add_error(path, messages)
            else:
                self.add_error("body", [f"{path}: {m}" for m in messages])


def pretty(body: Any) -> str:
    """A stored body as the form shows it: indented, with one line per prompt case (token id
    lists would otherwise take one line per id)."""
    if not isinstance(body, dict) or not isinstance(body.get("prompts"), list):
        return json.dumps(body, indent=2, ensure_ascii=False)
    rest = {k: v for k, v in body.items() if k != "prompts"}
    # Compact, so a template near its size limit still fits the form when shown and sent back.
    cases = [json.dumps(case, separators=(",", ":")) for case in body["prompts"]]
    lines = ["{", '  "prompts": [' + ("" if cases else "]" + ("," if rest else ""))]
    if cases:
        lines += [f"    {case}," for case in cases[:-1]] + [f"    {cases[-1]}"]
        lines.append("  ]" + ("," if rest else ""))
    if rest:
        lines += json.dumps(rest, indent=2, ensure_ascii=False).splitlines()[1:-1]
    lines.append("}")
    return "\n".join(lines)

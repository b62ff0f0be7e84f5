"""Details (audit rows, worker events) as key: value text, never a Python repr."""

from controlplane.html import key_values


def test_nested_values_read_as_indented_lines():
    text = key_values(
        {
            "step": "verify",
            "ok": True,
            "workers": ["w1", "w2"],
            "by_namespace": {"rl-a": {"failed": 1}, "rl-b": {}},
            "calls": [{"route": "update", "ms": 12}],
            "none": None,
            "empty": [],
        }
    )
    assert text.splitlines() == [
        "step: verify",
        "ok: yes",
        "workers: w1, w2",
        "by_namespace:",
        "  rl-a:",
        "    failed: 1",
        "  rl-b: (none)",
        "calls:",
        "  - route: update",
        "    ms: 12",
        "none: —",
        "empty: (none)",
    ]


def test_plain_values_and_markup_stay_text():
    assert key_values({}) == "(none)"
    assert key_values("<b>") == "<b>"  # the template escapes it: never marked safe here
    assert not hasattr(key_values({"a": "<b>"}), "__html__")

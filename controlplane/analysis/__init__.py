"""Canary analysis: old and new policy side by side on the same prompts, judged statistically
(docs/concepts/canary-analysis.md).

Below `refresh` (which decides what a verdict does to a refresh) and above `fleet` (a template
belongs to a source). `rules` holds the judge's inputs, `stats` the Mann-Whitney test, `metrics`
the per-prompt values computed from observations, `judge` the score and outcome.
"""

"""Rollback drills (README "Rollback drills"): prove, on a small subset of a scope, that the
fleet can go back to the policy verified before the current one and return, and record how long
each direction took.

Below, shared with the intents and drift: `refresh.models.drill` (`DrillRun`, one drill and its
two refreshes), `refresh.drill_history` (the previous verified policy of a namespace, the
subset a drill takes) and `refresh.drill_hold` (a drill and a refresh start exclude each other).

- `actions`: `start_drill`, the one way a drill begins (button, command, schedule).
- `runner`: `advance`, the idempotent orchestration the Celery task, the reconciler and the
  tests drive; `resume_stalled_drills` for beat.
- `schedule`: `start_due_drills`, beat's start of every due scheduled drill.
"""

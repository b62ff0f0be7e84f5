"""How much text the control plane keeps of a label, a reason or an error it stores.

Text we store often comes from outside (a worker's error body, an exception, a trainer's
reason, an SSO display name) and has no natural bound. Each limit below says what it bounds and
why it is that size; code truncates with these names, never with a bare number, so a column
and the text written into it cannot drift apart.

A leaf: it imports nothing, so every app (audit included) can use it.
"""

#: Who did something, as shown beside it: a user name, an API token's label, "executor@host".
#: The `*_label` and `lease_owner` columns are CharField(max_length=LABEL_CHARS).
LABEL_CHARS = 200

#: Outside text quoted inside a larger record: what an audit row is about (`AuditEvent.
#: target_label`), a request path or an error message in its details, the first line of a
#: database error. Audit rows stay in the hash chain for good, so what they quote is short.
QUOTED_CHARS = 300

#: One call's error, a worker's departure, a canary verdict's reason, a gate's reason: read in a
#: table cell or a banner. Enough for a multi-line engine error; a runaway body (a whole HTML
#: error page, a Python traceback) is cut rather than bloating every row that repeats it.
REASON_CHARS = 2000

#: Why a refresh, drill or quarantine stopped where it is (`held_reason`, `end_reason`, a step's
#: detail): the one paragraph an operator reads first, often several reasons joined, so twice
#: a single reason.
STATE_REASON_CHARS = 4000

#: A journaled call's URL (`JournalEntry.url`, `QuarantineCall.url`: CharField(max_length=
#: URL_CHARS)): longer than any admin route URL; a description journaled in its place is cut.
URL_CHARS = 800

#: Why an instance's serving interval began (`ServingInterval.cause`: CharField(max_length=
#: CAUSE_CHARS)): a short phrase naming the refresh, the discovery run or the person; a long
#: label quoted in it is cut, and `ledger.write` is the one place that cuts it.
CAUSE_CHARS = 500

#: One line of outside text for a log line or a console: an exception's first line
#: (`jobs.enqueue`), a webhook id in an audit row, a step's detail in `manage.py policy_refresh`.
SUMMARY_CHARS = 200

#: The request path an idempotency key is bound to (`IdempotencyRecord.operation`): longer than
#: any API route with its ids.
REQUEST_PATH_CHARS = 200

"""Running operator commands in-process the way a shell sees them: exit code, stdout, stderr."""

from __future__ import annotations

import io
import json

from django.core.management import CommandError, call_command


def cli(*args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `manage.py *args`: a refusal's code (CommandError's
    `returncode`, as `run_from_argv` exits with it) or a `sys.exit` code, else 0."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(*args, stdout=out, stderr=err)
    except CommandError as exc:
        err.write(str(exc))
        return exc.returncode, out.getvalue(), err.getvalue()
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def cli_json(*args: str) -> tuple[int, dict]:
    """(exit code, the one JSON document printed) of a command run with `--json`."""
    code, out, _ = cli(*args, "--json")
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return code, json.loads(lines[0])

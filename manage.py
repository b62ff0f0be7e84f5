#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.management import execute_from_command_line

    _runtime_notice(sys.argv[1:2])
    execute_from_command_line(sys.argv)


def _runtime_notice(command: list[str]) -> None:
    """One stderr line when this command does not use the running demo's Redis or database
    (controlplane/runtime.py); stdout stays what the command prints (`--json` included)."""
    if command in (["demo"], []) or command[0].startswith("-"):
        return
    from django.conf import settings

    try:
        notice = settings.RUNTIME_NOTICE
    except Exception:  # bad settings: the command itself reports them
        return
    if notice:
        print(notice, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

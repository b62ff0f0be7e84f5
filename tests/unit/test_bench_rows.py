"""`bench/rows.sh` runs every row of the benchmark page's fleet-scale table: each row it names
is in its run order and each in the order has a command (else the script refuses to run), and
each command names a bench that exists and whose argument parser takes the options given. No
bench runs: each is started only as far as its `parse_args`."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROWS_SH = ROOT / "bench" / "rows.sh"

# Run in a child process: each bench's own module-level setup (sys.path, environment) runs as
# when it is started, and `parse_args` stops it once its options are parsed (or refused: argparse
# exits 2 with its message).
PARSE_ONLY = """
import argparse, json, os, runpy, sys

class Parsed(Exception):
    pass

parse_args = argparse.ArgumentParser.parse_args

def parse_then_stop(self, args=None, namespace=None):
    parse_args(self, args, namespace)
    raise Parsed

argparse.ArgumentParser.parse_args = parse_then_stop
failures = {}
for row, argv in json.loads(sys.argv[1]).items():
    sys.argv = argv
    sys.path[0] = os.path.dirname(argv[0])  # as for a script: its folder first
    try:
        runpy.run_path(argv[0], run_name="__main__")
        failures[row] = "ran to its end without parsing options"
    except Parsed:
        pass
    except SystemExit as refused:
        failures[row] = f"refused its options (exit {refused.code})"
    except Exception as error:
        failures[row] = f"failed before parsing: {error!r}"
print(json.dumps(failures))
"""


def listed(script: Path = ROWS_SH) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), "--list"], capture_output=True, text=True, timeout=30
    )


def rows() -> dict[str, list[str]]:
    found = listed()
    assert found.returncode == 0, found.stderr
    out: dict[str, list[str]] = {}
    for line in found.stdout.splitlines():
        row, command = line.split(": ", 1)
        assert row not in out, f"{row} listed twice"
        out[row] = shlex.split(command)
    return out


def test_every_row_is_listed_with_a_bench_that_exists():
    found = rows()
    assert len(found) >= 10
    for row, argv in found.items():
        assert argv[0].startswith("bench/") and (ROOT / argv[0]).is_file(), (row, argv)


@pytest.mark.parametrize(
    ("edit", "refusal"),
    [
        ("s/^ORDER=(refresh_500 /ORDER=(/", "refresh_500 is in ROWS but not in ORDER"),
        ("s/^  \\[memory\\]=.*$//", "memory is in ORDER but not in ROWS"),
        ("s/^ORDER=(refresh_500 /ORDER=(memory refresh_500 /", "memory is twice in ORDER"),
    ],
)
def test_a_row_in_one_list_and_not_the_other_is_refused(tmp_path, edit, refusal):
    copy = tmp_path / "bench" / "rows.sh"
    copy.parent.mkdir()
    shutil.copy(ROWS_SH, copy)
    subprocess.run(["sed", "-i", edit, str(copy)], check=True)
    assert copy.read_text() != ROWS_SH.read_text(), "the edit no longer applies"
    found = listed(copy)
    assert found.returncode == 2 and refusal in found.stderr, found


def test_every_bench_takes_the_options_its_row_gives(tmp_path):
    argv = {row: [str(ROOT / args[0]), *args[1:]] for row, args in rows().items()}
    # What a bench sets up before parsing goes to this test's directory, not a new one in /tmp.
    env = {
        **os.environ,
        "CONTROLPLANE_VAR_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path}/unused.sqlite3",
    }
    found = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY, json.dumps(argv)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    failures = json.loads(found.stdout.splitlines()[-1])
    assert not failures, (failures, found.stderr[-2000:])

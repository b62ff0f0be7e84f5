"""The package stands alone: its version is the API's, it is typed, and it imports nothing of
the server."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import dynamo_rl_trainer


def test_the_major_version_is_the_api_version():
    assert dynamo_rl_trainer.API_VERSION == "v1"
    assert dynamo_rl_trainer.__version__.split(".")[0] == dynamo_rl_trainer.API_VERSION[1:]
    assert dynamo_rl_trainer.API_PREFIX == "/api/v1"


def test_the_package_ships_its_type_marker():
    assert resources.files("dynamo_rl_trainer").joinpath("py.typed").is_file()


def test_nothing_of_the_server_or_django_is_imported():
    probe = (
        "import sys, dynamo_rl_trainer; server = {'django', 'controlplane', 'ninja'}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & server))"
    )
    # A fresh interpreter that finds the package where this one did (installed or source).
    where = str(Path(dynamo_rl_trainer.__file__).resolve().parents[1])
    found = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": where},
    )
    assert found.stdout.strip() == "[]"


def test_every_public_name_is_exported():
    for name in dynamo_rl_trainer.__all__:
        assert hasattr(dynamo_rl_trainer, name), name

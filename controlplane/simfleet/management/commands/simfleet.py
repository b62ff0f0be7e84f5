"""`python manage.py simfleet ...`: the standalone simulated fleet (see `simfleet.cli`)."""

import argparse
import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from controlplane.simfleet.cli import add_arguments, build_config, serve


class Command(BaseCommand):
    help = "Serve a simulated Dynamo RL fleet (listener, workers, frontend) on 127.0.0.1."

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        asyncio.run(serve(build_config(argparse.Namespace(**options)), out=self.stdout))

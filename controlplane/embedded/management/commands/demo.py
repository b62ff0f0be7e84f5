"""`manage.py demo`: the whole product on embedded defaults, with a simulated fleet.

Starts an embedded Redis, migrates the SQLite database, creates one demo user per role, starts
a simulated Dynamo fleet and registers it as the source `sim`, then runs a Celery worker,
Celery beat and the ASGI server until Ctrl-C / SIGTERM stops them all.

The ASGI server is uvicorn with several worker processes, as in production: HTTP and Channels
websockets in every process, websocket groups carried across them by the Redis channel layer.
"""

import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse
from django.utils import timezone

from controlplane import runtime
from controlplane.celery import app as celery_app
from controlplane.embedded.credentials import ensure_demo_users
from controlplane.embedded.progress import Stages
from controlplane.embedded.redis import free_port, start_embedded_redis
from controlplane.embedded.supervisor import Supervisor, python_argv
from controlplane.env import env_str

SIM_SOURCE = "sim"
# The first discovery runs on Celery beat's next tick; if the fleet does not answer by then the
# demo still starts (the source page says why), it only stops waiting.
FIRST_DISCOVERY_TIMEOUT = 60.0


class _Stop(Exception):
    pass


def _raise_stop(signum, frame):
    raise _Stop()


#: The simulated fleet's frontend, listener and admin ports when they are free.
SIM_PORTS = (18000, 18001, 18002)


def _simfleet_argv(workers: int, namespaces: str, ports: list[int]) -> list[str]:
    frontend, listener, admin = ports
    return python_argv(
        "-m",
        "controlplane.simfleet",
        "--workers",
        str(workers),
        "--namespaces",
        namespaces,
        "--prefix",
        "rl",
        "--frontend-port",
        str(frontend),
        "--listener-port",
        str(listener),
        "--admin-port",
        str(admin),
        "--seed",
        "7",
    )


def _port_is_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def public_base_url(port: int) -> str:
    """The web server listens on loopback only, so this is the one address its pages are at."""
    return f"http://127.0.0.1:{port}"


def _point_this_process_at(redis_url: str) -> None:
    """The demo's own settings were read before the embedded Redis existed; nothing has
    connected yet (caches and channel layers are created lazily), so repoint them here."""
    settings.REDIS_URL = redis_url
    settings.CACHES["default"]["LOCATION"] = redis_url
    for host in settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]:
        host["address"] = redis_url
    settings.CELERY_BROKER_URL = redis_url
    celery_app.conf.broker_url = redis_url


def web_argv(port: int, processes: int) -> list[str]:
    """uvicorn's master and its workers share the child's process group, so the supervisor's
    SIGTERM to the group stops them all; the master alone would restart a worker that died."""
    return python_argv(
        "-m",
        "uvicorn",
        "controlplane.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(processes),
        # Django's ASGI handler has no lifespan protocol: say so instead of probing for it.
        "--lifespan",
        "off",
        "--no-access-log",
    )


def _wait_for_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise CommandError(f"{url} did not answer within {timeout:.0f} s")


class Command(BaseCommand):
    help = "Run the whole product locally: embedded Redis, Celery, ASGI server, simulated fleet."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000, help="web port (default 8000)")
        parser.add_argument("--workers", type=int, default=12, help="simulated workers")
        parser.add_argument(
            "--namespaces", default="rl-a,rl-b,rl-c", help="simulated worker namespaces"
        )
        parser.add_argument("--no-simfleet", action="store_true", help="no simulated fleet")
        parser.add_argument(
            "--web-processes",
            type=int,
            default=2,
            help="ASGI server worker processes (default 2)",
        )

    def handle(self, *args, port, workers, namespaces, no_simfleet, web_processes, **options):
        if settings.PRODUCTION:
            raise CommandError("demo runs the embedded defaults; unset CONTROLPLANE_ENV")
        if web_processes < 1:
            raise CommandError("--web-processes must be at least 1")
        if not _port_is_free(port):
            raise CommandError(f"127.0.0.1:{port} is in use; pick another with --port")
        var_dir = Path(settings.VAR_DIR)
        if (other := runtime.read_live_runtime(var_dir)) is not None:
            raise CommandError(
                f"a demo (pid {other.pid}) is already running with {var_dir}; stop it first"
            )
        stages = Stages(self.stdout.write, self.stdout.flush)
        supervisor = Supervisor(log_dir=var_dir / "logs")
        # Links the product builds outside a request (the trainer webhook URL on the admin
        # pages, links in notifications) use PUBLIC_BASE_URL: it follows --port, as does
        # every URL printed here.
        base_url = public_base_url(port)
        # The demo is a product, not a debugging session: the 404 page is ours, not Django's
        # list of every URL pattern, and no query log grows in memory. DEBUG=true still wins.
        supervisor.env.setdefault("DEBUG", "false")
        supervisor.env["PUBLIC_BASE_URL"] = settings.PUBLIC_BASE_URL = base_url
        stages.stage("Starting embedded Redis")
        redis = start_embedded_redis(var_dir / "redis")
        previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            supervisor.env["REDIS_URL"] = redis.url
            _point_this_process_at(redis.url)
            # Shells beside the demo read these (controlplane/runtime.py) unless their
            # environment says otherwise; the children get them in theirs.
            database_url = env_str("DATABASE_URL") or runtime.default_database_url(var_dir)
            supervisor.env["DATABASE_URL"] = database_url
            self.runtime_file = runtime.runtime_path(var_dir)
            runtime.write_runtime(
                var_dir,
                redis_url=redis.url,
                database_url=database_url,
                redis_key_prefix=settings.REDIS_KEY_PREFIX,
            )
            stages.stage(f"Migrating the database ({settings.DATABASES['default']['NAME']})")
            call_command("migrate", interactive=False, verbosity=0)
            stages.stage("Creating demo users")
            users = ensure_demo_users(var_dir)
            if not no_simfleet:
                stages.stage(f"Starting the simulated fleet ({workers} workers)")
                self._start_simfleet(supervisor, workers, namespaces)
            # The process kind decides how each child holds database connections (see
            # DATABASES in settings.py): a pool for the web server, persistent ones for Celery.
            celery = ["-m", "celery", "-A", "controlplane"]
            celery_env = {"CONTROLPLANE_PROCESS": "celery"}
            stages.stage("Starting the Celery worker")
            supervisor.start(
                "celery-worker",
                python_argv(*celery, "worker", "--pool", "threads", "-c", "8", "-l", "INFO"),
                extra_env=celery_env,
            )
            stages.stage("Starting Celery beat")
            supervisor.start(
                "celery-beat",
                python_argv(
                    *celery, "beat", "-l", "INFO", "-s", str(var_dir / "celerybeat-schedule")
                ),
                extra_env=celery_env,
            )
            stages.stage(f"Starting the web server on {base_url}/ ({web_processes} processes)")
            supervisor.start(
                "web", web_argv(port, web_processes), extra_env={"CONTROLPLANE_PROCESS": "web"}
            )
            _wait_for_http(f"{base_url}/accounts/login/", timeout=30)
            if not no_simfleet:
                stages.stage("Waiting for the first discovery of the simulated fleet")
                self._wait_for_first_discovery(stages, supervisor)
            stages.stage(f"Ready in {stages.elapsed():.1f} s")
            self._print_welcome(base_url, users, supervisor)
            while (exited := supervisor.first_exited()) is None:
                time.sleep(0.5)
            self.stderr.write(
                f"{exited.name} exited with code {exited.process.returncode}; "
                f"see {exited.log_path}. Stopping."
            )
        except _Stop:
            self.stdout.write("\nStopping…")
        finally:
            # A second Ctrl-C while stopping must not abandon the children half-stopped:
            # ignore it until every child is down, then restore the old handlers.
            for sig in previous:
                signal.signal(sig, signal.SIG_IGN)
            supervisor.stop_all()
            runtime.remove_runtime(var_dir)
            redis.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.stdout.write("Stopped.")

    def _start_simfleet(self, supervisor: Supervisor, workers: int, namespaces: str) -> None:
        # Imported once the embedded Redis is up and settings point at it (see above): the
        # demo's one late import of the fleet app.
        from controlplane.embedded import simsource

        # The usual ports when they are free, so the URLs stay the same from run to run. A
        # port seen free can still be taken before the fleet binds it (two demos starting at
        # once): the fleet then exits at once, and starts again on ports the system picks (0).
        preferred = [p if _port_is_free(p) else free_port() for p in SIM_PORTS]
        keys = {"listener_url", "frontend_url", "control_url"}
        for ports in (preferred, [0, 0, 0]):
            child = supervisor.start(
                "simfleet", _simfleet_argv(workers, namespaces, ports), capture_stdout=True
            )
            try:
                urls = supervisor.read_lines_until(child, keys, timeout=30)
                break
            except RuntimeError:
                if child.alive() or ports == [0, 0, 0]:
                    raise
                supervisor.forget(child)
        values: dict[str, Any] = {
            "listener_url": urls["listener_url"],
            "frontend_url": urls["frontend_url"],
            "expected_prefix": "rl",
            "allowed_networks": ["127.0.0.0/8"],
            "discovery_interval_seconds": 5.0,
        }
        self.sim_urls = urls
        self.sim_source_id = simsource.register(SIM_SOURCE, values)
        self.sim_started_at = timezone.now()

    def _wait_for_first_discovery(self, stages: Stages, supervisor: Supervisor) -> None:
        """Wait until a discovery of the simulated fleet finished after it started: the fleet
        page then shows workers instead of an empty table."""
        # Already imported by `_start_simfleet`, which runs first.
        from controlplane.embedded import simsource

        deadline = time.monotonic() + FIRST_DISCOVERY_TIMEOUT
        while time.monotonic() < deadline:
            if (exited := supervisor.first_exited()) is not None:
                raise CommandError(f"{exited.name} exited early; see {exited.log_path}")
            outcome = simsource.first_discovery(self.sim_source_id, self.sim_started_at)
            if outcome is not None:
                stages.stage(f"First discovery finished ({outcome})")
                return
            time.sleep(0.3)
        stages.stage(
            f"No discovery finished within {FIRST_DISCOVERY_TIMEOUT:.0f} s; "
            f"starting anyway (see {supervisor.log_dir}/celery-worker.log)"
        )

    def _print_welcome(self, base_url: str, users, supervisor: Supervisor) -> None:
        w = self.stdout.write
        w("")
        w(f"Dynamo RL control plane is running at {base_url}/")
        w("")
        w("Sign in as one of:")
        for role, (username, password) in users.items():
            w(f"  {role:<9} {username:<16} {password}")
        if hasattr(self, "sim_urls"):
            w("")
            w("Simulated fleet (source 'sim'):")
            for key in ("listener_url", "frontend_url", "control_url"):
                w(f"  {key:<13} {self.sim_urls[key]}")
            w("  Break a worker to see a held refresh, e.g.:")
            w(
                f"    curl -X POST {self.sim_urls['control_url']}/workers/<instance_id>/faults "
                """-d '{"route": "update_weights_from_disk", "fault": {"kind": "error_body"}}'"""
            )
            w(f"    curl -X DELETE {self.sim_urls['control_url']}/faults   # heal everything")
            w("  More: docs/operate/simulated-fleet.md, or GET the control URL for its routes.")
        w("")
        # reverse() would percent-encode a literal "<name>": reverse a marker and swap it.
        hook = reverse("intake:api-v1:trainer_webhook", args=["NAME"]).replace("NAME", "<name>")
        w(f"Trainer webhooks: create an endpoint at {base_url}{reverse('intake:endpoint_list')}")
        w(f"  (as {users['admin'][0]}); trainers then post to {base_url}{hook}")
        w("")
        w(
            f"Other shells of this checkout use the demo's Redis and database while it runs "
            f"(read from {self.runtime_file}); REDIS_URL / DATABASE_URL override it."
        )
        w(f"Logs: {supervisor.log_dir}/   Press Ctrl-C to stop everything.")
        self.stdout.flush()

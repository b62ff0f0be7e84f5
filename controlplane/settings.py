"""The one settings module.

Two modes, chosen by CONTROLPLANE_ENV:
- ``development`` (default): SQLite under ./var, a generated secret key stored in ./var, DEBUG on
  unless DEBUG=false. This is what `manage.py demo` and the tests use unless told otherwise.
- ``production``: SECRET_KEY, ALLOWED_HOSTS and DATABASE_URL are required, DEBUG is off and the
  security settings are strict enough for `manage.py check --deploy` to pass without warnings.
"""

import os
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from redis.connection import parse_url as redis_parse_url

from controlplane import runtime
from controlplane.audit.keys import local_key, parse_keys
from controlplane.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("CONTROLPLANE_VAR_DIR", str(BASE_DIR / "var")))

CONTROLPLANE_ENV = env_choice("CONTROLPLANE_ENV", "development", ("development", "production"))
PRODUCTION = CONTROLPLANE_ENV == "production"


def _local_secret_key() -> str:
    """A per-checkout key kept in ./var, so sessions survive restarts of the embedded default."""
    path = VAR_DIR / "secret_key"
    if path.exists():
        return path.read_text().strip()
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    path.write_text(key)
    path.chmod(0o600)
    return key


if PRODUCTION:
    SECRET_KEY = env_str("SECRET_KEY", required=True)
    if len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5:
        raise ImproperlyConfigured("SECRET_KEY must be at least 50 characters of varied text")
    DEBUG = env_bool("DEBUG", False)
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS")
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured("ALLOWED_HOSTS must be set in production")
else:
    SECRET_KEY = env_str("SECRET_KEY") or _local_secret_key()
    DEBUG = env_bool("DEBUG", True)
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])

CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "channels",
    "django_htmx",
    "controlplane.accounts",
    "controlplane.audit",
    "controlplane.notify",
    "controlplane.fleet",
    "controlplane.analysis",
    "controlplane.refresh",
    "controlplane.intake",
    "controlplane.simfleet",
    "controlplane.embedded",
    "controlplane.ops",
]

MIDDLEWARE = [
    # First: probes must answer before host validation and the HTTPS redirect (health.py).
    "controlplane.health.HealthCheckMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "controlplane.audit.middleware.CorrelationIdMiddleware",
    # NUL in the path, query, headers or form fields: a 400 before any view (controlplane/nul.py).
    "controlplane.nul.RefuseNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES: list[dict[str, Any]] = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "controlplane.accounts.context_processors.role",
                "controlplane.accounts.context_processors.runtime_notice",
            ],
        },
    },
]

# A running `manage.py demo` of this var dir (controlplane/runtime.py): a shell beside it uses
# its Redis and database unless the environment says otherwise. Development only.
DEMO_RUNTIME = None if PRODUCTION else runtime.read_live_runtime(VAR_DIR)

_default_db = runtime.default_database_url(VAR_DIR)
if DEMO_RUNTIME is not None:
    _default_db = DEMO_RUNTIME.database_url
_database_url = env_str("DATABASE_URL", None if PRODUCTION else _default_db)
if _database_url is None:
    raise ImproperlyConfigured("DATABASE_URL must be set in production")
try:
    DATABASES = {"default": dj_database_url.parse(_database_url)}
except Exception as exc:  # dj-database-url raises several types for bad URLs
    raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None

# Which kind of process this is decides how it holds PostgreSQL connections (see
# controlplane/celery.py, which sets "celery" for the `celery` command; docker-compose and
# `manage.py demo` also set it explicitly):
# - web (Daphne, manage.py, tests): Django runs each ASGI request's sync code in a thread of its
#   own, and a persistent connection per thread piles up one idle connection per thread that
#   ever served a request. So no persistent connections, and a bounded psycopg pool instead:
#   at most DATABASE_POOL_MAX_SIZE connections per process however many requests arrive.
# - celery (worker, beat): a fixed number of threads (the worker's -c), each keeps its own
#   connection for DATABASE_CONN_MAX_AGE seconds — bounded by the concurrency, and cheaper than
#   reconnecting for every task.
# Budget on one server: (web replicas * (DATABASE_POOL_MAX_SIZE + 1)) + (sum of worker
# concurrency) + 1 for beat must stay below max_connections (100 by default, shared by all its
# databases); the + 1 per web process is the gate poll's revision reader
# (controlplane/intake/api/gate_revisions.py), outside the pool.
PROCESS_KIND = env_choice("CONTROLPLANE_PROCESS", "web", ("web", "celery"))
DATABASE_POOL_MIN_SIZE = env_int("DATABASE_POOL_MIN_SIZE", 2, minimum=0)
DATABASE_POOL_MAX_SIZE = env_int("DATABASE_POOL_MAX_SIZE", 10, minimum=1)
DATABASE_POOL_TIMEOUT_SECONDS = env_float("DATABASE_POOL_TIMEOUT_SECONDS", 10.0, minimum=0.1)
DATABASE_CONN_MAX_AGE = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
if DATABASE_POOL_MIN_SIZE > DATABASE_POOL_MAX_SIZE:
    raise ImproperlyConfigured(
        "DATABASE_POOL_MIN_SIZE must not exceed DATABASE_POOL_MAX_SIZE "
        f"({DATABASE_POOL_MIN_SIZE} > {DATABASE_POOL_MAX_SIZE})"
    )

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL and a busy timeout let the web server, Celery worker and beat share one SQLite file.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not memory: live-server and Celery-worker tests reach it from other processes.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
else:
    _db_options = DATABASES["default"].setdefault("OPTIONS", {})
    # Names each connection's process kind in pg_stat_activity (a DATABASE_URL
    # `?application_name=` wins), so an operator can see who holds the server's connections.
    _db_options.setdefault("application_name", f"controlplane-{PROCESS_KIND}")
    if PROCESS_KIND == "web":
        from controlplane import dbpool

        dbpool.cap_reconnect_backoff()
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django refuses a pool with persistent ones
        _db_options["pool"] = {
            "min_size": DATABASE_POOL_MIN_SIZE,
            "max_size": DATABASE_POOL_MAX_SIZE,
            "timeout": DATABASE_POOL_TIMEOUT_SECONDS,
            # Test each connection before handing it out: one whose backend was terminated
            # (restart, failover, idle timeout) is discarded instead of failing the request.
            "check": dbpool.check_connection,
        }
    else:
        DATABASES["default"]["CONN_MAX_AGE"] = DATABASE_CONN_MAX_AGE
        # A connection kept across tasks may have been cut (database restart, idle timeout).
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str(
    "REDIS_URL", DEMO_RUNTIME.redis_url if DEMO_RUNTIME else "redis://127.0.0.1:6379/0"
)
# Put before every key this deployment writes (cache, channel layer, Celery broker), so several
# deployments — or test runs, see controlplane/embedded/pytest_plugin.py — can share one Redis
# database without touching each other's keys. Empty by default: changing it moves the broker
# queues, so set it before the first start, not on a running deployment. Set but empty in the
# environment is a choice too: only an unset one follows a running demo.
if "REDIS_KEY_PREFIX" not in os.environ and DEMO_RUNTIME is not None:
    REDIS_KEY_PREFIX = DEMO_RUNTIME.redis_key_prefix
else:
    REDIS_KEY_PREFIX = env_str("REDIS_KEY_PREFIX", "") or ""
# One line for commands (stderr, manage.py) and staff pages (base.html) when this process does
# not use the running demo's Redis or database; "" when it does, or no demo runs.
RUNTIME_NOTICE = runtime.runtime_notice(
    DEMO_RUNTIME,
    redis_url=REDIS_URL,
    database_url=_database_url,
    redis_key_prefix=REDIS_KEY_PREFIX,
)

CACHES: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"{REDIS_KEY_PREFIX}controlplane",
    }
}

# Channel layer: Redis pub/sub (channels_redis.pubsub), chosen over the core layer for fan-out.
# - The core layer stores a copy of every group message per subscriber (a Lua ZADD per channel,
#   capacity and expiry per channel) and took a pooled connection for each group_add/discard:
#   500 sockets connecting at once hit the pool's 100 ("Too many connections") and lost 28% of
#   the pushes. Pub/sub sends one PUBLISH per event; each process receives it once on its one
#   subscriber connection and fans out in memory, so thousands of sockets cost no connections.
# - Delivery: pub/sub has no capacity or expiry losses, but drops what is published while no
#   process subscribes, and what is published while a process's subscriber connection is
#   re-established. Both are fine here: a LiveStream joins its groups before it resyncs from the
#   database, and every page resyncs on (re)connect (see controlplane/realtime).
# - Isolation: pub/sub channel names are server-wide, not per database, so the prefix carries
#   the Redis database number as well as REDIS_KEY_PREFIX (each test run has its own).
# - Idle sockets: the subscriber reads with a short timeout of its own, but the publisher's pool
#   connections sit idle between refreshes; keep the read timeout generous (redis-py 8's 5 s
#   default once killed idle core-layer consumers every ~6 s) and let keepalive and a health
#   check catch a connection that died silently while idle.
CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS = 20.0
CHANNEL_LAYERS: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS,
                    "socket_connect_timeout": 5.0,
                    "socket_keepalive": True,
                    "health_check_interval": 30,
                }
            ],
            "prefix": f"{REDIS_KEY_PREFIX}asgi:db{redis_parse_url(REDIS_URL).get('db', 0)}:",
        },
    }
}

# Celery: JSON only; results live in our own journal tables, not in a result backend.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Broker restarts: a worker keeps reconnecting for as long as Redis is away (the default gives
# up after 100 tries and exits), and runs without the gossip and mingle steps, whose restart
# path fails on the dropped connection (see controlplane/celery.py).
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_CONSUMER = "controlplane.celery:BrokerRestartSafeConsumer"
# kombu's Redis transport, with a channel that fails like a lost connection once its connection
# is gone instead of an AttributeError that stopped the worker (see controlplane/broker.py).
CELERY_BROKER_TRANSPORT = "controlplane.broker:Transport"
# A running task is not cancelled when the broker connection drops: a policy refresh holds a
# fenced lease and its journal, so a redelivered copy finds it running instead of repeating it.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
# Publishing while Redis is away: a few quick retries, then the send fails and the caller's row
# (the outbox) waits for its sweep; never a request held for long.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Sockets to Redis: a connect that cannot succeed fails fast, a connection that died silently
# (no RST after a kill -9 or a network cut) is found by keepalive and the health check.
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 5.0,
    "socket_keepalive": True,
    "health_check_interval": 10,
    "retry_on_timeout": True,
}
if REDIS_KEY_PREFIX:
    # kombu prefixes every broker key (queues, bindings, unacked sets) with it.
    CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = REDIS_KEY_PREFIX

# Periodic work: one schedule, in one place. `expires` sits just under the interval so a tick
# that was delivered late is dropped instead of piling up behind the next one.
DISCOVERY_TICK_SECONDS = env_float("DISCOVERY_TICK_SECONDS", 2.0, minimum=0.5)
RECONCILE_TICK_SECONDS = env_float("RECONCILE_TICK_SECONDS", 15.0, minimum=1.0)
CELERY_BEAT_SCHEDULE = {
    "discovery-tick": {
        "task": "fleet.schedule_discoveries",
        "schedule": timedelta(seconds=DISCOVERY_TICK_SECONDS),
        "options": {"expires": DISCOVERY_TICK_SECONDS * 0.9},
    },
    "policy-refresh-reconcile": {
        "task": "refresh.reconcile_policy_refreshes",
        "schedule": timedelta(seconds=RECONCILE_TICK_SECONDS),
        "options": {"expires": RECONCILE_TICK_SECONDS * 0.9},
    },
    # Namespaces serving a policy further behind the trainer than their source allows.
    "policy-lag": {
        "task": "refresh.enforce_policy_lag",
        "schedule": timedelta(seconds=DISCOVERY_TICK_SECONDS),
        "options": {"expires": DISCOVERY_TICK_SECONDS * 0.9},
    },
    # Gates of a source whose last successful discovery is too old become `unknown`.
    "gate-freshness": {
        "task": "refresh.sync_gate_freshness",
        "schedule": timedelta(seconds=DISCOVERY_TICK_SECONDS),
        "options": {"expires": DISCOVERY_TICK_SECONDS * 0.9},
    },
}

# Discovery (each source has its own refresh interval; the tick only looks for due sources).
# Above Dynamo's own 30 s probe deadline, so a hung worker shows up as a per-worker error
# instead of failing the whole listener call.
DISCOVERY_LISTENER_TIMEOUT_SECONDS = env_float("DISCOVERY_LISTENER_TIMEOUT_SECONDS", 35.0)
DISCOVERY_PROBE_TIMEOUT_SECONDS = env_float("DISCOVERY_PROBE_TIMEOUT_SECONDS", 5.0)
DISCOVERY_PROBE_CONCURRENCY = env_int("DISCOVERY_PROBE_CONCURRENCY", 64, minimum=1)
# Who may scrape /metrics without signing in (Prometheus); loopback unless configured.
METRICS_ALLOWED_NETWORKS = env_list("METRICS_ALLOWED_NETWORKS", ["127.0.0.1/32", "::1/128"])
# When set, /metrics wants `Authorization: Bearer <token>` from every address instead (the
# file form suits a mounted Secret); the allowed networks then no longer apply.
METRICS_TOKEN = env_str("METRICS_TOKEN", "") or (
    Path(_token_file).read_text().strip() if (_token_file := env_str("METRICS_TOKEN_FILE")) else ""
)
# Peers whose X-Forwarded-For is believed (addresses or networks; `*` trusts every peer). The
# one list for uvicorn (it reads FORWARDED_ALLOW_IPS itself) and the app's client address:
# audit source_ip, login throttle, /metrics (controlplane/requests.py `client_address`).
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", env_list("FORWARDED_ALLOW_IPS", ["127.0.0.1", "::1"]))
OBSERVATION_RETENTION_DAYS = env_int("OBSERVATION_RETENTION_DAYS", 14, minimum=1)

# A source's gates say `unknown` (do not assume open) once its last successful discovery is
# older than GATE_STALE_INTERVALS of its own refresh interval, and never sooner than
# GATE_STALE_AFTER_SECONDS (which stays above one slow listener call: 35 s by default). A
# failing listener marks them at once, through the discovery run that fails.
GATE_STALE_AFTER_SECONDS = env_float("GATE_STALE_AFTER_SECONDS", 60.0, minimum=1.0)
GATE_STALE_INTERVALS = env_float("GATE_STALE_INTERVALS", 3.0, minimum=1.0)

# Policy refresh defaults.
REFRESH_CALL_TIMEOUT_SECONDS = env_float("REFRESH_CALL_TIMEOUT_SECONDS", 30.0, minimum=0.1)
REFRESH_CONCURRENCY = env_int("REFRESH_CONCURRENCY", 32, minimum=1)
REFRESH_LEASE_SECONDS = env_float("REFRESH_LEASE_SECONDS", 30.0, minimum=1.0)
# How long the executor rides out a database it cannot reach (terminated backends, a failover,
# a restart): it reconnects and runs the interrupted fenced transaction again, with backoff.
# Past this the refresh holds, its reason naming the database. An outage longer than the lease
# may let another executor take over: the fencing token then stops this one.
REFRESH_DB_OUTAGE_SECONDS = env_float("REFRESH_DB_OUTAGE_SECONDS", 120.0, minimum=0.1)
# Distributed updates: how long every rank may take to join the group (the workers' own
# DYN_RL_INIT_WEIGHTS_TIMEOUT_S watchdog, 30 s by default, kills a worker whose join hangs
# longer), and how long the trainer may take to broadcast and report `broadcast_done`.
REFRESH_GROUP_INIT_TIMEOUT_SECONDS = env_float(
    "REFRESH_GROUP_INIT_TIMEOUT_SECONDS", 30.0, minimum=0.1
)
REFRESH_BROADCAST_TIMEOUT_SECONDS = env_float(
    "REFRESH_BROADCAST_TIMEOUT_SECONDS", 600.0, minimum=0.1
)
# External updates: how long a refresh waits, its workers paused, for the trainer's `applied`
# report after `refresh.ready_for_apply` (a plan may give its own `apply_timeout_s`).
REFRESH_APPLY_TIMEOUT_SECONDS = env_float("REFRESH_APPLY_TIMEOUT_SECONDS", 600.0, minimum=0.1)
# A quarantine catch-up touches its heartbeat every third of this; one silent this long lost its
# Celery worker, and the reconciler beat queues it again (also a queued one never picked up).
QUARANTINE_STALL_SECONDS = env_float("QUARANTINE_STALL_SECONDS", 120.0, minimum=3.0)

# Trainer integration: webhook body cap, signature time window, notification retries, and the
# public base URL used for links in outbound notifications.
WEBHOOK_MAX_BODY_BYTES = env_int("WEBHOOK_MAX_BODY_BYTES", 1024 * 1024, minimum=1)
WEBHOOK_TOLERANCE_SECONDS = env_int("WEBHOOK_TOLERANCE_SECONDS", 300, minimum=1)
# Background processing of a delivery: transient failures (scope busy, discovery unreachable,
# deadlock) are retried with exponential backoff up to this many attempts, then left retryable.
WEBHOOK_MAX_ATTEMPTS = env_int("WEBHOOK_MAX_ATTEMPTS", 10, minimum=1)
WEBHOOK_RETRY_BASE_SECONDS = env_float("WEBHOOK_RETRY_BASE_SECONDS", 5.0, minimum=0.0)
WEBHOOK_RETRY_MAX_SECONDS = env_float("WEBHOOK_RETRY_MAX_SECONDS", 300.0, minimum=0.0)
# A delivery accepted but not picked up this long (its task never reached the broker, or the
# broker lost it) is enqueued again by the sweep, oldest first; also the sweep interval.
WEBHOOK_SWEEP_SECONDS = env_float("WEBHOOK_SWEEP_SECONDS", 30.0, minimum=0.5)
CELERY_BEAT_SCHEDULE["webhook-delivery-sweep"] = {
    "task": "intake.sweep_lost_deliveries",
    "schedule": timedelta(seconds=WEBHOOK_SWEEP_SECONDS),
    "options": {"expires": WEBHOOK_SWEEP_SECONDS * 0.9},
}
# Lock sites check the global lock order (controlplane/lockorder.py): raise outside production.
LOCK_ORDER_STRICT = not PRODUCTION
# How deeply JSON from outside (webhooks, API bodies, worker replies) may nest.
JSON_MAX_DEPTH = env_int("JSON_MAX_DEPTH", 64, minimum=2)
NOTIFICATION_MAX_ATTEMPTS = env_int("NOTIFICATION_MAX_ATTEMPTS", 6, minimum=1)
NOTIFICATION_RETRY_BASE_SECONDS = env_float("NOTIFICATION_RETRY_BASE_SECONDS", 5.0, minimum=0.0)
# A delivery whose next attempt is this overdue lost its queued task (a worker died holding
# the retry, the broker was down): the sweeper enqueues it again. Also the sweep interval.
NOTIFICATION_SWEEP_GRACE_SECONDS = env_float("NOTIFICATION_SWEEP_GRACE_SECONDS", 120.0, minimum=1.0)
CELERY_BEAT_SCHEDULE["notification-sweep"] = {
    "task": "notify.sweep_stuck_deliveries",
    "schedule": timedelta(seconds=NOTIFICATION_SWEEP_GRACE_SECONDS),
    "options": {"expires": NOTIFICATION_SWEEP_GRACE_SECONDS * 0.9},
}

# Plans never started are discarded (audited, actor "system") once this old; checked hourly
# at most, and at least every tenth of the expiry so a short expiry is honoured.
PLAN_EXPIRY_SECONDS = env_float("PLAN_EXPIRY_SECONDS", 24 * 3600.0, minimum=60.0)
PLAN_EXPIRY_TICK_SECONDS = min(3600.0, PLAN_EXPIRY_SECONDS / 10)
CELERY_BEAT_SCHEDULE["policy-refresh-plan-expiry"] = {
    "task": "refresh.expire_stale_plans",
    "schedule": timedelta(seconds=PLAN_EXPIRY_TICK_SECONDS),
    "options": {"expires": PLAN_EXPIRY_TICK_SECONDS * 0.9},
}
# A canary past its verdict deadline fails (refresh/intents/canary.py): checked this often.
# The watch after a reopen (refresh/intents/watch.py): each tick looks at the refreshes in
# their template's window and samples those whose interval came.
ANALYSIS_WATCH_TICK_SECONDS = env_float("ANALYSIS_WATCH_TICK_SECONDS", 10.0)
CELERY_BEAT_SCHEDULE["policy-refresh-watch-reopened"] = {
    "task": "refresh.watch_reopened",
    "schedule": timedelta(seconds=ANALYSIS_WATCH_TICK_SECONDS),
    "options": {"expires": ANALYSIS_WATCH_TICK_SECONDS * 0.9},
}
CANARY_EXPIRY_TICK_SECONDS = env_float("CANARY_EXPIRY_TICK_SECONDS", 15.0)
CELERY_BEAT_SCHEDULE["policy-refresh-canary-expiry"] = {
    "task": "refresh.expire_canary_reviews",
    "schedule": timedelta(seconds=CANARY_EXPIRY_TICK_SECONDS),
    "options": {"expires": CANARY_EXPIRY_TICK_SECONDS * 0.9},
}
# An external update past its apply deadline holds (refresh/intents/external.py): checked this
# often, so a missing report holds within the timeout plus one tick.
APPLY_EXPIRY_TICK_SECONDS = env_float("APPLY_EXPIRY_TICK_SECONDS", 5.0, minimum=0.1)
CELERY_BEAT_SCHEDULE["policy-refresh-apply-expiry"] = {
    "task": "refresh.expire_apply_waits",
    "schedule": timedelta(seconds=APPLY_EXPIRY_TICK_SECONDS),
    "options": {"expires": APPLY_EXPIRY_TICK_SECONDS * 0.9},
}
# Rollback drills (refresh/drills, README "Rollback drills"): how often a drill's task looks at
# its running refresh, how long one advance may hold the drill, after how long a silent drill is
# queued again, and how often beat starts due scheduled drills and resumes stalled ones.
DRILL_POLL_SECONDS = env_float("DRILL_POLL_SECONDS", 1.0, minimum=0.1)
# How long viewers of a running refresh share one computation of its capacity chart (seconds;
# a new step, call or state is a new computation anyway). 0 computes it for every viewer.
CAPACITY_LIVE_CACHE_SECONDS = env_int("CAPACITY_LIVE_CACHE_SECONDS", 2, minimum=0)
DRILL_CLAIM_SECONDS = env_float("DRILL_CLAIM_SECONDS", 120.0, minimum=5.0)
DRILL_STALL_SECONDS = env_float("DRILL_STALL_SECONDS", 60.0, minimum=5.0)
DRILL_TICK_SECONDS = env_float("DRILL_TICK_SECONDS", 60.0, minimum=1.0)
CELERY_BEAT_SCHEDULE["rollback-drills"] = {
    "task": "refresh.drill_tick",
    "schedule": timedelta(seconds=DRILL_TICK_SECONDS),
    "options": {"expires": DRILL_TICK_SECONDS * 0.9},
}
# Serving health (fleet/serving_health.py): how often each source's frontend /metrics is read
# for its live chart, and how long the points are kept (the ring is pruned on every tick).
SERVING_HEALTH_SAMPLE_SECONDS = env_float("SERVING_HEALTH_SAMPLE_SECONDS", 5.0, minimum=1.0)
SERVING_HEALTH_KEEP_SECONDS = env_float("SERVING_HEALTH_KEEP_SECONDS", 2 * 3600.0, minimum=60.0)
CELERY_BEAT_SCHEDULE["serving-health"] = {
    "task": "fleet.sample_serving_health",
    "schedule": timedelta(seconds=SERVING_HEALTH_SAMPLE_SECONDS),
    "options": {"expires": SERVING_HEALTH_SAMPLE_SECONDS * 0.9},
}
PUBLIC_BASE_URL = env_str("PUBLIC_BASE_URL", "http://127.0.0.1:8000")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Test runs only: a cheap hasher first, so every persona costs microseconds instead of PBKDF2's
# 1.5 M rounds (~0.6 s each here). Set by controlplane/embedded/pytest_plugin.py, inherited by
# the live servers and demos a test starts; ignored in production (a production process a test
# starts inherits it, and must hash as production does). PBKDF2 stays in the list, so existing
# hashes verify, and tests about hashing set PASSWORD_HASHERS themselves.
if env_bool("CONTROLPLANE_TEST_FAST_HASHER", False) and not PRODUCTION:
    PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    ]
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "accounts:login"
# Failed logins per (username, client address) before the login form refuses for a while.
LOGIN_THROTTLE_ATTEMPTS = env_int("LOGIN_THROTTLE_ATTEMPTS", 5, minimum=1)
LOGIN_THROTTLE_WINDOW_SECONDS = env_int("LOGIN_THROTTLE_WINDOW_SECONDS", 900, minimum=1)

# Single sign-on (README "Single sign-on"): OpenID Connect through mozilla-django-oidc, off
# unless OIDC_RP_CLIENT_ID is set. The provider's groups claim decides the role at every
# sign-in (controlplane/accounts/sso.py). Local accounts stay for break-glass unless
# LOCAL_LOGIN_ENABLED=false. mozilla-django-oidc reads the OIDC_* names below itself.
OIDC_RP_CLIENT_ID = env_str("OIDC_RP_CLIENT_ID", "") or ""
SSO_ENABLED = bool(OIDC_RP_CLIENT_ID)
LOCAL_LOGIN_ENABLED = env_bool("LOCAL_LOGIN_ENABLED", True)
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
# A single sign-on session, and any API token of a single sign-on user, lasts this long: then
# the person signs in again and their groups are read afresh. How long a role outlives its
# removal at the provider (controlplane/accounts/tokens.py).
SSO_SESSION_SECONDS = env_int("OIDC_SESSION_SECONDS", 8 * 3600, minimum=60)
if SSO_ENABLED:
    from controlplane.accounts.rolemap import parse_role_map

    SSO_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "single sign-on")
    OIDC_RP_CLIENT_SECRET = env_str("OIDC_RP_CLIENT_SECRET", required=True)
    OIDC_OP_ISSUER = env_str("OIDC_OP_ISSUER", required=True)
    OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("OIDC_OP_AUTHORIZATION_ENDPOINT", required=True)
    OIDC_OP_TOKEN_ENDPOINT = env_str("OIDC_OP_TOKEN_ENDPOINT", required=True)
    OIDC_OP_USER_ENDPOINT = env_str("OIDC_OP_USER_ENDPOINT", required=True)
    OIDC_OP_JWKS_ENDPOINT = env_str("OIDC_OP_JWKS_ENDPOINT", required=True)
    OIDC_RP_SIGN_ALGO = env_choice("OIDC_RP_SIGN_ALGO", "RS256", ("RS256", "ES256", "PS256"))
    OIDC_RP_SCOPES = env_str("OIDC_RP_SCOPES", "openid profile email")
    OIDC_USE_PKCE = True
    OIDC_USE_NONCE = True
    OIDC_CREATE_USER = True
    OIDC_AUTHENTICATION_CALLBACK_URL = "accounts:sso_callback"
    OIDC_TIMEOUT = env_float("OIDC_TIMEOUT_SECONDS", 10.0, minimum=0.1)
    # Which claim lists the person's groups, and group → role (`group=role,...`); the highest
    # role among a person's groups wins; no mapped group means no access.
    SSO_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
    SSO_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM", "preferred_username")
    SSO_ROLE_MAP = parse_role_map(env_list("OIDC_ROLE_MAP"), "OIDC_ROLE_MAP")
    # How far the provider's clock may be off ours when its ID token's exp and iat are checked.
    OIDC_CLOCK_SKEW_SECONDS = env_int("OIDC_CLOCK_SKEW_SECONDS", 10, minimum=0)
    AUTHENTICATION_BACKENDS.append("controlplane.accounts.sso.SsoBackend")
elif not LOCAL_LOGIN_ENABLED:
    raise ImproperlyConfigured("LOCAL_LOGIN_ENABLED=false needs single sign-on (OIDC_RP_CLIENT_ID)")

# Telemetry (README "Telemetry"): OpenTelemetry traces, off unless an OTLP endpoint is set or
# OTEL_TRACES_ENABLED=true; the exporter reads the standard OTEL_EXPORTER_OTLP_* variables.
# TRACE_URL_TEMPLATE links a refresh's trace id to a trace viewer, e.g.
# `https://grafana.example/explore?left={"queries":[{"query":"{trace_id}"}]}`.
OTEL_TRACES_ENABLED = env_bool(
    "OTEL_TRACES_ENABLED",
    bool(env_str("OTEL_EXPORTER_OTLP_ENDPOINT") or env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")),
)
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "dynamo-rl-controlplane")
TRACE_URL_TEMPLATE = env_str("TRACE_URL_TEMPLATE", "")
if TRACE_URL_TEMPLATE and "{trace_id}" not in TRACE_URL_TEMPLATE:
    raise ImproperlyConfigured("TRACE_URL_TEMPLATE must contain {trace_id}")

# Audit chain anchoring (README "Audit trail and its threat model"). Rows are HMAC-signed with
# keys held outside the database (`id:secret` pairs, newest first; required in production, a
# generated key file in development), and a beat task appends signed checkpoints of the chain
# head to a file the database cannot reach. AUDIT_ANCHOR_KEY, if set, signs checkpoints instead.
_audit_keys = env_str("AUDIT_HMAC_KEY", required=PRODUCTION) or local_key(VAR_DIR)
AUDIT_HMAC_KEYS = parse_keys(_audit_keys, "AUDIT_HMAC_KEY")
_anchor_keys = env_str("AUDIT_ANCHOR_KEY")
AUDIT_ANCHOR_KEYS = parse_keys(_anchor_keys, "AUDIT_ANCHOR_KEY") if _anchor_keys else ()
AUDIT_ANCHOR_FILE = Path(env_str("AUDIT_ANCHOR_FILE", str(VAR_DIR / "audit-anchors.jsonl")))
AUDIT_CHECKPOINT_SECONDS = env_float("AUDIT_CHECKPOINT_SECONDS", 300.0, minimum=1.0)
CELERY_BEAT_SCHEDULE["audit-checkpoint"] = {
    "task": "audit.checkpoint_chain_head",
    "schedule": timedelta(seconds=AUDIT_CHECKPOINT_SECONDS),
    "options": {"expires": AUDIT_CHECKPOINT_SECONDS * 0.9},
}

# Operations (README "Production"): probes, retention, and the beat heartbeat `doctor` reads.
# /readyz keeps its verdict this long per process, and bounds each dependency's answer.
READINESS_CACHE_SECONDS = env_float("READINESS_CACHE_SECONDS", 3.0, minimum=0.0)
READINESS_TIMEOUT_SECONDS = env_float("READINESS_TIMEOUT_SECONDS", 2.0, minimum=0.1)
# Long polls (`GET /api/v1/refreshes/<id>/group?wait=`, controlplane/intake/api/waiting.py) hold
# no database connection while they wait, but each is a socket, a task and a parked request
# thread (sync middleware wraps the chain): at most this many wait at once per web process,
# and per token (or signed-in user) in a process; past either a poll is answered 429 with
# Retry-After. A wait re-reads its state on every change published
# and at least every LONG_POLL_RECHECK_SECONDS (a live event may be dropped).
LONG_POLL_MAX_WAITS_PER_PROCESS = env_int("LONG_POLL_MAX_WAITS_PER_PROCESS", 500, minimum=1)
LONG_POLL_MAX_WAITS_PER_TOKEN = env_int("LONG_POLL_MAX_WAITS_PER_TOKEN", 50, minimum=1)
LONG_POLL_RECHECK_SECONDS = env_float("LONG_POLL_RECHECK_SECONDS", 5.0, minimum=0.1)
# Days kept before `manage.py purge` (and its hourly beat run) deletes; 0 keeps forever.
# Observations: discovery runs and worker events. Journal: admin-call rows of finished policy
# refreshes (the refreshes themselves and every audit row stay). Webhook deliveries: received
# trainer webhooks that reached an outcome. Notification deliveries: delivered or failed ones.
JOURNAL_RETENTION_DAYS = env_int("JOURNAL_RETENTION_DAYS", 90, minimum=0)
WEBHOOK_RETENTION_DAYS = env_int("WEBHOOK_RETENTION_DAYS", 30, minimum=0)
NOTIFICATION_RETENTION_DAYS = env_int("NOTIFICATION_RETENTION_DAYS", 30, minimum=0)
if 0 < WEBHOOK_RETENTION_DAYS * 86400 <= WEBHOOK_TOLERANCE_SECONDS:
    # A forgotten webhook id could be replayed while its signature's timestamp is still valid.
    raise ImproperlyConfigured("WEBHOOK_RETENTION_DAYS must outlast WEBHOOK_TOLERANCE_SECONDS")
RETENTION_PURGE_SECONDS = env_float("RETENTION_PURGE_SECONDS", 3600.0, minimum=60.0)
CELERY_BEAT_SCHEDULE["retention-purge"] = {
    "task": "ops.purge_expired",
    "schedule": timedelta(seconds=RETENTION_PURGE_SECONDS),
    "options": {"expires": RETENTION_PURGE_SECONDS * 0.9},
}
# Beat's schedule touches a heartbeat key through a worker; `doctor` calls beat dead when the
# key is older than BEAT_HEARTBEAT_STALE_INTERVALS of these.
BEAT_HEARTBEAT_SECONDS = env_float("BEAT_HEARTBEAT_SECONDS", 30.0, minimum=1.0)
BEAT_HEARTBEAT_STALE_INTERVALS = 3
CELERY_BEAT_SCHEDULE["beat-heartbeat"] = {
    "task": "ops.beat_heartbeat",
    "schedule": timedelta(seconds=BEAT_HEARTBEAT_SECONDS),
    "options": {"expires": BEAT_HEARTBEAT_SECONDS * 0.9},
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
WHITENOISE_USE_FINDERS = not PRODUCTION
if not PRODUCTION:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # collectstatic fills it only in production
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the cookie-free meta tag instead
# A failed CSRF check renders inside the layout, like the other error pages.
CSRF_FAILURE_VIEW = "controlplane.errors.csrf_failure"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

# Content-Security-Policy on every response (pages, partials, JSON, error pages, static files).
# Kept in one block with what it needs (the middleware, the nonce context processor, the
# engine that neutralises bidi controls: see controlplane/html.py) so it reads as one decision.
# Scripts come only from our own static files: no inline script, no event-handler attributes,
# no `javascript:` URLs, no eval (htmx runs with allowEval and allowScriptTags off, set in
# base.html). A future inline script must carry `nonce="{{ csp_nonce }}"`; the nonce appears in
# the header only on responses that used it. Styles are likewise our stylesheet only: no
# template uses a `style=` attribute and htmx's injected indicator style is turned off (its CSS
# ships in app.css); the nonce serves Django's own CSRF-failure page. `connect-src 'self'` lets
# the page open same-origin websockets (CSP Level 3: 'self' matches ws:/wss: of our origin).
from django.utils.csp import CSP  # noqa: E402

MIDDLEWARE.insert(
    MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
)
TEMPLATES[0]["BACKEND"] = "controlplane.html.TemplateEngine"
TEMPLATES[0]["NAME"] = "django"  # the alias the default backend would have had
TEMPLATES[0]["OPTIONS"]["context_processors"].append("django.template.context_processors.csp")
# `{{ version|version_link }}` on every page: a weight version links to its provenance trail.
TEMPLATES[0]["OPTIONS"].setdefault("builtins", []).append(
    "controlplane.intake.templatetags.provenance_tags"
)
# `{{ text|code_spans }}`: backtick spans in our help text as <code>, the rest escaped.
TEMPLATES[0]["OPTIONS"]["builtins"].append("controlplane.html")
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}

if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    # TLS usually ends at a proxy in front of the ASGI server.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "structured": {
            "()": "controlplane.logging.StructuredFormatter",
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "httpx": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
    },
}

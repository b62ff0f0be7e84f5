# The one image for every process of a deployment: web (uvicorn), Celery worker and beat,
# migrations, and the simulated fleet. Non-root, no compiler, static files collected at build.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CONTROLPLANE_VAR_DIR=/app/var \
    STATIC_ROOT=/app/staticfiles

WORKDIR /app
COPY pyproject.toml README.md manage.py ./
COPY controlplane ./controlplane
COPY templates ./templates
COPY static ./static
RUN pip install . \
    && rm -rf /root/.cache

# collectstatic in production mode, so WhiteNoise's manifest (hashed names) exists. The
# values below exist only for this build step; the real ones come from the environment.
RUN CONTROLPLANE_ENV=production \
    SECRET_KEY=build-only-not-a-secret-build-only-not-a-secret-0123456789 \
    ALLOWED_HOSTS=build \
    DATABASE_URL=sqlite:////tmp/build.sqlite3 \
    AUDIT_HMAC_KEY=build:build-only-not-a-secret-0123456789abcdef \
    python manage.py collectstatic --noinput --verbosity 0 \
    && rm -f /tmp/build.sqlite3

RUN useradd --system --uid 10001 --home-dir /app controlplane \
    && mkdir -p /app/var /app/anchors \
    && chown controlplane /app/var /app/anchors
USER 10001

EXPOSE 8000
# uvicorn: several worker processes, X-Forwarded-* trusted only from the proxy in front:
# uvicorn reads FORWARDED_ALLOW_IPS (its address or network; loopback unless set), and so does
# the app's own client address (TRUSTED_PROXIES defaults to it). Never `*`: whoever reaches the
# port could then claim any address, loopback included (/metrics, audit, login throttle).
CMD ["sh", "-c", "exec uvicorn controlplane.asgi:application --host 0.0.0.0 --port 8000 --workers ${WEB_CONCURRENCY:-4} --proxy-headers --no-server-header --lifespan off"]

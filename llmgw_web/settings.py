"""Django settings for llmgw-web, read from the environment.

SQLite under var/ by default (the one-command demo); PostgreSQL through
DATABASE_URL. With DJANGO_DEBUG off, a SECRET_KEY must be given.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import warnings
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from llmgw_policy import parse_roots

from catalog.agent_address import parse_networks
from llmgw_web.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("LLMGW_VAR_DIR") or BASE_DIR / "var")

DEBUG = env_bool("DJANGO_DEBUG", False)

SECRET_KEY = env_str("DJANGO_SECRET_KEY") or ""
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set. Set it to a long random string (python -c "
            "'import secrets; print(secrets.token_urlsafe(50))'), or set DJANGO_DEBUG=1 for development."
        )
    SECRET_KEY = "django-insecure-development-only-key-never-used-with-debug-off"  # noqa: S105

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
for origin in CSRF_TRUSTED_ORIGINS:
    if "://" not in origin:
        raise ImproperlyConfigured(
            f"CSRF_TRUSTED_ORIGINS item {origin!r} needs a scheme, e.g. https://{origin}"
        )

INSTALLED_APPS = [
    "llmgw_web.apps.AdminConfig",  # Django's admin, opened by a role (llmgw_web/admin.py)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "axes",
    "csp",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    # Before django_tasks_db: its db_worker command is operations' (which schedules the periodic tasks).
    "operations",
    "django_tasks",
    "django_tasks_db",
    "audit",
    "catalog",
    "web",
    "demo",
    "telemetry",
    # After the apps whose tables it tracks: its migration puts the version triggers on them.
    "versions",
    # Last: after each migrate it gives the roles the permissions every other app has made.
    "access",
]

# "answers": what versions/cache.py keeps under the fleet's versions, in each process's own memory
# (a gunicorn worker computes an answer once per version; the versions are read from the database
# at every request, so no process's copy is ever stale). An entry under an older version is never
# asked for again: it leaves when the cache is full or after TIMEOUT. Full is 5,000 entries: the lists
# keep each row by what it shows (a page of 100 API rows is 101 entries, the model list's 50 rows 51),
# and at 500 a few lists' rows pushed out the pages in use (a locmem cache drops a third, oldest first,
# when full). Most entries are a row's few kB; the largest a nodes page's 200-330 kB.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "answers": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "llmgw-answers",
        "TIMEOUT": 600,
        "OPTIONS": {"MAX_ENTRIES": 5000},
    },
    # "throttle": the API's rate counts (access/throttles.py), which every process must share or each
    # would allow the whole rate. In the database (the table access/migrations/0003 makes), or in
    # Redis when LLMGW_REDIS_URL names one. An entry lives a minute, the rates' period; past
    # MAX_ENTRIES callers at once a third of the entries are dropped (each set counts the table).
    "throttle": {
        "BACKEND": "django.core.cache.backends.db.DatabaseCache",
        "LOCATION": "access_throttle_cache",
        "OPTIONS": {"MAX_ENTRIES": 20000, "CULL_FREQUENCY": 3},
    },
}
LLMGW_REDIS_URL = env_str("LLMGW_REDIS_URL") or ""
if LLMGW_REDIS_URL:
    if not LLMGW_REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(
            f"LLMGW_REDIS_URL={LLMGW_REDIS_URL!r} is not a Redis URL: give redis://host:6379/0 "
            "(rediss:// for TLS, unix:// for a socket)."
        )
    if importlib.util.find_spec("redis") is None:
        raise ImproperlyConfigured(
            "LLMGW_REDIS_URL is set but the redis package is not installed: `uv add redis`, or unset "
            "LLMGW_REDIS_URL to keep the API's rate counts in the database."
        )
    CACHES["throttle"] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": LLMGW_REDIS_URL,
    }

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files from the process itself, compressed and with far-future caching for the hashed
    # names collectstatic writes: no separate file server is needed in front (make serve).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "audit.middleware.ActorMiddleware",
    # Last (django-axes): answers a locked-out sign-in, on /accounts/login/ and /admin/login/ alike.
    "axes.middleware.AxesMiddleware",
    "csp.middleware.CSPMiddleware",
]

# Failed sign-ins are counted per user name and address (django-axes, the address from
# access/client.py) and make further tries wait, doubling, never lock (access/signin.py says how): a
# stranger's failures from elsewhere leave the user's own sign-in alone.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
if "LLMGW_SIGNIN_LOCKOUT_MINUTES" in os.environ:
    raise ImproperlyConfigured(
        "LLMGW_SIGNIN_LOCKOUT_MINUTES is gone: failed sign-ins no longer lock a user out but make the next "
        "try wait, doubling; set LLMGW_SIGNIN_LONGEST_WAIT_MINUTES for the longest wait instead."
    )
LLMGW_SIGNIN_FAILURES = env_int("LLMGW_SIGNIN_FAILURES", 5, minimum=1)
LLMGW_SIGNIN_ACCOUNT_FAILURES = env_int("LLMGW_SIGNIN_ACCOUNT_FAILURES", 50, minimum=1)
LLMGW_SIGNIN_LONGEST_WAIT_MINUTES = env_int("LLMGW_SIGNIN_LONGEST_WAIT_MINUTES", 15, minimum=1)
AXES_HANDLER = "access.signin.SigninHandler"
AXES_CLIENT_IP_CALLABLE = "access.client.client_address"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# No lock at a count: the handler refuses a try only while its wait runs.
AXES_LOCK_OUT_AT_FAILURE = False
AXES_FAILURE_LIMIT = LLMGW_SIGNIN_FAILURES  # what axes' admin shows as the limit
# A try refused during a wait is not counted: the wait does not grow while the user waits.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
# How long a count is kept after its last failure (an hour, or twice the longest wait if longer).
AXES_COOLOFF_TIME = "access.signin.forget_time"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "access.lockout.locked_out"

ROOT_URLCONF = "llmgw_web.urls"
WSGI_APPLICATION = "llmgw_web.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Connections are kept between requests (opening one costs about as much as a small page) and
# checked before each request reuses them, so a database restart costs one failed check, not a
# failed request. DATABASE_CONN_MAX_AGE=0 closes each at the end of its request.
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'llmgw.sqlite3'}",
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 600, minimum=0),
        conn_health_checks=env_bool("DATABASE_CONN_HEALTH_CHECKS", True),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Writers wait for the lock instead of failing at once: the worker and the
    # web process share one file in the demo.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    # 12: OWASP ASVS 4.0.3 V2.1.1 (docs/design.md, "Sign-in limits, and the OWASP ASVS").
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT") or BASE_DIR / "staticfiles")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Gzip copies beside each file at collectstatic; names unchanged, so pages render the same
    # whether or not collectstatic has run (the tests do not run it).
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Without collectstatic (development, tests) whitenoise serves from the app and project folders.
WHITENOISE_USE_FINDERS = env_bool("WHITENOISE_USE_FINDERS", not STATIC_ROOT.is_dir())
if WHITENOISE_USE_FINDERS:
    # ...and its warning that STATIC_ROOT is missing says nothing new then.
    warnings.filterwarnings("ignore", message=f"No directory at: {re.escape(str(STATIC_ROOT))}")

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# Production hardening: on whenever debug is off, so `check --deploy` is clean.
if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True

# Behind a proxy that terminates TLS and sets X-Forwarded-Proto (and X-Forwarded-For) itself,
# overwriting what the client sent: only then may the request say it came over HTTPS, or any client
# could claim it. Off by default.
LLMGW_BEHIND_PROXY = env_bool("LLMGW_BEHIND_PROXY", False)
if LLMGW_BEHIND_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# How many proxies in front each append to X-Forwarded-For: the client's address, for the sign-in
# waits and the API's anonymous rate, is that many entries from the right (access/client.py). Read
# only with LLMGW_BEHIND_PROXY.
LLMGW_TRUSTED_PROXIES = env_int("LLMGW_TRUSTED_PROXIES", 1, minimum=1)

# Content Security Policy (django-csp): scripts only from this site's own files, so an injected
# <script> or on*= attribute does not run; htmx and Swagger UI are served from here and start from
# files (llmgw_web/api_docs.py). Styles allow inline: the memory bars draw their widths in style
# attributes, and Swagger UI and htmx set element styles.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "font-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

REST_FRAMEWORK = {
    # The token scheme first: an anonymous call is answered 401 with "WWW-Authenticate: Token".
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "knox.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Every endpoint declares its required_permission; one without is refused (base/rules.py).
    "DEFAULT_PERMISSION_CLASSES": ["base.rules.RequiredPermission"],
    "DEFAULT_FILTER_BACKENDS": ["base.api.filters.StrictFilterBackend"],
    # The API takes JSON alone (a form's fields are all strings, and the inputs want JSON numbers and
    # lists; another type is a 415). JSON nested past a bound is a 400 in the error shape, not a
    # RecursionError (base/api/parsers.py); a body over DATA_UPLOAD_MAX_MEMORY_SIZE is a 413 in it
    # (base/api/errors.py).
    "DEFAULT_PARSER_CLASSES": ["base.api.parsers.JSONParser"],
    # The tests' APIClient sends JSON, as the API takes.
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_PAGINATION_CLASS": "base.api.pagination.Pages",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "llmgw_web.schema.AutoSchema",
    "EXCEPTION_HANDLER": "base.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Per caller: anonymous by address, signed in by user (access/throttles.py reads the rates).
    "DEFAULT_THROTTLE_CLASSES": ["access.throttles.AnonymousRate", "access.throttles.UserRate"],
}

# API tokens (django-rest-knox): only a hash is stored; the secret is shown once, at creation.
# Their expiry is chosen per token (access/services.py); the prefix lets secret scanners find them.
KNOX_TOKEN_MODEL = "access.Token"
# knox's own migrations would create its default token table even when swapped out (as here), a
# table that nothing uses and that holds a key to the users: they are not run.
MIGRATION_MODULES = {"knox": None}
REST_KNOX = {"TOKEN_PREFIX": "llmgw_", "AUTO_REFRESH": False, "TOKEN_TTL": None}
# API calls a minute, per address when anonymous and per user when signed in (429 beyond).
LLMGW_API_RATE_ANONYMOUS = env_int("LLMGW_API_RATE_ANONYMOUS", 60, minimum=1)
LLMGW_API_RATE_USER = env_int("LLMGW_API_RATE_USER", 1200, minimum=1)
LLMGW_TOKEN_MAX_DAYS = env_int("LLMGW_TOKEN_MAX_DAYS", 365, minimum=1)
# The OpenAPI schema and Swagger UI need sign-in unless this opens them to anyone.
LLMGW_API_DOCS_PUBLIC = env_bool("LLMGW_API_DOCS_PUBLIC", False)

SPECTACULAR_SETTINGS = {
    "TITLE": "llmgw-web API",
    "DESCRIPTION": "Catalog, resize, context and restart operations of an LLM-serving GPU fleet.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "llmgw_web.schema.inputs_as_the_server_reads_them",
    ],
    # Swagger UI served from our own static files: operators' networks often reach no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

TASKS = {
    "default": {
        "BACKEND": env_str("LLMGW_TASKS_BACKEND") or "django_tasks_db.DatabaseBackend",
    }
}

# Restart operations and the node agents (operations/services/lease.py says how they fit).
# A worker's operation counts as abandoned when its heartbeat is older than
# STALE; the sweep then has another worker take it over.
LLMGW_OPERATION_STALE_SECONDS = env_int("LLMGW_OPERATION_STALE_SECONDS", 60, minimum=2)
LLMGW_OPERATION_HEARTBEAT_SECONDS = env_float("LLMGW_OPERATION_HEARTBEAT_SECONDS", 5.0, minimum=0.1)
if LLMGW_OPERATION_HEARTBEAT_SECONDS * 2 > LLMGW_OPERATION_STALE_SECONDS:
    raise ImproperlyConfigured(
        "LLMGW_OPERATION_HEARTBEAT_SECONDS must be at most half of LLMGW_OPERATION_STALE_SECONDS, "
        "or a live worker's operation would be taken over"
    )
LLMGW_OPERATION_SWEEP_SECONDS = env_float("LLMGW_OPERATION_SWEEP_SECONDS", 30.0, minimum=0.5)
LLMGW_OPERATION_POLL_SECONDS = env_float("LLMGW_OPERATION_POLL_SECONDS", 1.0, minimum=0.05)
# How long a restart asks an agent to hold its answer until a replacement's state changes (a long
# poll; the agent bounds it at 30 s). 0: plain polling every LLMGW_OPERATION_POLL_SECONDS.
LLMGW_AGENT_WAIT_SECONDS = env_float("LLMGW_AGENT_WAIT_SECONDS", 5.0, minimum=0.0)
if LLMGW_AGENT_WAIT_SECONDS > 30:
    raise ImproperlyConfigured("LLMGW_AGENT_WAIT_SECONDS must be at most 30: the agent waits no longer")
LLMGW_OPERATION_MAX_ATTEMPTS = env_int("LLMGW_OPERATION_MAX_ATTEMPTS", 3, minimum=1)
LLMGW_AGENT_TIMEOUT_SECONDS = env_float("LLMGW_AGENT_TIMEOUT_SECONDS", 10.0, minimum=0.1)
LLMGW_REPLICA_PORT_BASE = env_int("LLMGW_REPLICA_PORT_BASE", 8100, minimum=1024)
# How long a stop waits for the agent's answer: the agent answers once the engine is gone (its
# stop_grace_seconds, 10 by default, then SIGKILL and up to 10 s more), so at least that.
LLMGW_AGENT_STOP_SECONDS = env_float("LLMGW_AGENT_STOP_SECONDS", 25.0, minimum=0.5)
# How long a stop lets a ready engine finish its requests in flight before it is signalled (the
# agent reads them from the engine's /metrics; docs/restarts.md "Stops that drain"). A stop's wait
# for its agent is LLMGW_AGENT_STOP_SECONDS plus this.
LLMGW_STOP_DRAIN_SECONDS = env_float("LLMGW_STOP_DRAIN_SECONDS", 30.0, minimum=0.0)
if LLMGW_STOP_DRAIN_SECONDS > 3600:
    raise ImproperlyConfigured("LLMGW_STOP_DRAIN_SECONDS must be at most 3600: the agent waits no longer")
# How long a step waits for a node's agent that does not answer (restarted, upgraded, a blip) before
# it gives up: polls of a replacement, and stops, are asked again within this window.
LLMGW_AGENT_ABSENT_SECONDS = env_float("LLMGW_AGENT_ABSENT_SECONDS", 30.0, minimum=0.0)
# How long a replacement must stay ready before its old replica is stopped (as Kubernetes'
# minReadySeconds); a restart may ask for another (settle_seconds).
LLMGW_RESTART_SETTLE_SECONDS = env_float("LLMGW_RESTART_SETTLE_SECONDS", 10.0, minimum=0.0)
# The reconciler (operations/services/reconcile.py): how often the workers compare the catalog with
# what each node's agent runs, and how many agents it asks at once.
LLMGW_RECONCILE_SECONDS = env_float("LLMGW_RECONCILE_SECONDS", 30.0, minimum=0.5)
LLMGW_RECONCILE_PARALLEL = env_int("LLMGW_RECONCILE_PARALLEL", 16, minimum=1)
# Each agent's listing in a pass is bounded by this, short, on its own: a hung agent delays no other
# node, and is marked unreachable within it.
LLMGW_RECONCILE_AGENT_TIMEOUT_SECONDS = env_float("LLMGW_RECONCILE_AGENT_TIMEOUT_SECONDS", 5.0, minimum=0.1)
# A listing is not applied to a replica whose state changed after (or this little before) the agent
# was asked: the workers' clocks may differ by this much.
LLMGW_RECONCILE_CLOCK_MARGIN_SECONDS = env_float("LLMGW_RECONCILE_CLOCK_MARGIN_SECONDS", 1.0, minimum=0.0)
# The release watch (operations/services/release_watch.py): the package index asked for each engine's
# newest release (PEP 691 simple API; a fleet's own index in PyPI's place), and how often the workers ask
# (0: they do not; manage.py engine_releases still asks).
LLMGW_PACKAGE_INDEX_URL = env_str("LLMGW_PACKAGE_INDEX_URL") or "https://pypi.org/simple"
if not LLMGW_PACKAGE_INDEX_URL.startswith(("https://", "http://")):
    raise ImproperlyConfigured(
        f"LLMGW_PACKAGE_INDEX_URL must be the package index's simple API, http(s)://host/simple, not "
        f"{LLMGW_PACKAGE_INDEX_URL!r}."
    )
LLMGW_RELEASE_WATCH_SECONDS = env_float("LLMGW_RELEASE_WATCH_SECONDS", 86400.0, minimum=0.0)
# A worker holds its operation only while its heartbeat is fresh; the heartbeat beats from its own
# thread, but a takeover while an agent call is still in flight would let two workers act on one
# step's replica, so the stale threshold must be above the longest agent call a worker makes.
_LONGEST_AGENT_CALL = max(
    LLMGW_AGENT_TIMEOUT_SECONDS + LLMGW_AGENT_WAIT_SECONDS,
    LLMGW_AGENT_STOP_SECONDS + LLMGW_STOP_DRAIN_SECONDS,
)
if LLMGW_OPERATION_STALE_SECONDS <= _LONGEST_AGENT_CALL:
    raise ImproperlyConfigured(
        f"LLMGW_OPERATION_STALE_SECONDS ({LLMGW_OPERATION_STALE_SECONDS}) must be above the longest agent call "
        f"a worker makes ({_LONGEST_AGENT_CALL:g} s: the larger of LLMGW_AGENT_TIMEOUT_SECONDS + "
        "LLMGW_AGENT_WAIT_SECONDS, and LLMGW_AGENT_STOP_SECONDS + LLMGW_STOP_DRAIN_SECONDS), or a worker "
        "still waiting for an agent "
        "would be taken over: raise it, or shorten those."
    )

# Where the cluster's declared models live (TOML); refusals point here.
# Directories a model's source may be a path under (comma- or colon-separated); empty: Hugging
# Face repo ids only. The agents' model_roots should say the same.
# Hosts a node's agent URL may name: names, "*.suffix" or networks (10.0.0.0/8), comma-separated;
# empty: any host whose addresses LLMGW_AGENT_NETWORKS allows.
LLMGW_AGENT_HOSTS = env_list("LLMGW_AGENT_HOSTS", [])
# The networks an agent URL's host, once resolved, must be inside (catalog/agent_address.py): CIDRs,
# comma-separated, or "private" (10/8, 172.16/12, 192.168/16, fc00::/7), the default. Loopback and
# link-local only when named (the demo and the tests name 127.0.0.0/8); a cloud metadata address
# only when named alone (a /32 or /128).
# With debug on (development and the demo, whose agents listen on 127.0.0.1) loopback is added to the
# default, so `manage.py seed_demo` and `manage.py demo` work as the README lists them outside make.
LLMGW_AGENT_NETWORKS = env_list("LLMGW_AGENT_NETWORKS", ["private", "127.0.0.0/8"] if DEBUG else ["private"])
try:
    parse_networks(LLMGW_AGENT_NETWORKS)
except ValueError as exc:
    raise ImproperlyConfigured(f"LLMGW_AGENT_NETWORKS: {exc}.") from None
# The networks where an agent may be called over plain http (its token in every request, in clear):
# CIDRs or "private", comma-separated. By default loopback only (the demo, the tests, an agent on the
# control plane's own host); elsewhere an agent is reached over https (the agent's
# LLMGW_AGENT_TLS_CERT_FILE and LLMGW_AGENT_TLS_KEY_FILE) unless its network is named here, for a
# fleet network the operator trusts as it trusts the token (catalog/agent_address.py,
# plaintext_refusal).
LLMGW_AGENT_PLAIN_HTTP_NETWORKS = env_list("LLMGW_AGENT_PLAIN_HTTP_NETWORKS", ["127.0.0.0/8", "::1/128"])
try:
    parse_networks(LLMGW_AGENT_PLAIN_HTTP_NETWORKS)
except ValueError as exc:
    raise ImproperlyConfigured(f"LLMGW_AGENT_PLAIN_HTTP_NETWORKS: {exc}.") from None
# A CA bundle (PEM) to trust for https agent URLs; empty: the system's.
LLMGW_AGENT_CA_BUNDLE = env_str("LLMGW_AGENT_CA_BUNDLE") or ""
if LLMGW_AGENT_CA_BUNDLE and not Path(LLMGW_AGENT_CA_BUNDLE).is_file():
    raise ImproperlyConfigured(
        f"LLMGW_AGENT_CA_BUNDLE={LLMGW_AGENT_CA_BUNDLE!r} is not a file (a PEM CA bundle)."
    )
# With debug on and the variable unset, the demo's directory (LLMGW_DEMO_DIR, else <tmp>/llmgw-demo),
# where seed_demo writes its GGUF model: the demo works outside make. Debug off: no root unless named.
LLMGW_MODEL_ROOTS = parse_roots(
    env_str("LLMGW_MODEL_ROOTS")
    or (env_str("LLMGW_DEMO_DIR") or str(Path(tempfile.gettempdir()) / "llmgw-demo") if DEBUG else "")
)
LLMGW_CLUSTER_SETTINGS = env_str("LLMGW_CLUSTER_SETTINGS") or str(BASE_DIR / "cluster.toml")

# One handler, the root's: Django's own "django" logger keeps a console handler of its own when
# DEBUG is on, which printed each of its records twice; a refused request is one line, without
# its traceback (llmgw_web/logfilters.py).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"refusal_one_line": {"()": "llmgw_web.logfilters.RefusalWithoutTraceback"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["refusal_one_line"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL") or "INFO"},
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.db.backends": {"level": "WARNING"},
        # django-axes logs every sign-in at INFO; its lockouts are warnings.
        "axes": {"level": "WARNING"},
        # httpx's transport says every byte at DEBUG: LOG_LEVEL=DEBUG is for this project's loggers
        # (a restart's timings, operations/services/timing.py), not for that.
        "httpcore": {"level": "INFO"},
    },
}

# The audit log's tamper evidence (docs/design.md, "The audit log"). Each entry's hash is an HMAC with
# this key, which the database never holds, so nobody with only the database can recompute the chain.
# Unset, it is derived from DJANGO_SECRET_KEY (and `check --deploy` says to set it: rotating the secret
# key would then orphan the chain). Never change it once entries are written with it.
LLMGW_AUDIT_KEY = env_str("LLMGW_AUDIT_KEY") or ""
if LLMGW_AUDIT_KEY and len(LLMGW_AUDIT_KEY) < 32:
    raise ImproperlyConfigured(
        "LLMGW_AUDIT_KEY is too short: give at least 32 characters (python -c "
        "'import secrets; print(secrets.token_urlsafe(48))')."
    )
# Where `audit_checkpoint` appends its signed checkpoints (one JSON line each); the worker writes one
# every LLMGW_AUDIT_CHECKPOINT_SECONDS. Keep the file, or ship the lines, off the database's host.
LLMGW_AUDIT_CHECKPOINT_FILE = env_str("LLMGW_AUDIT_CHECKPOINT_FILE") or str(
    VAR_DIR / "audit-checkpoints.jsonl"
)
LLMGW_AUDIT_CHECKPOINT_SECONDS = env_float("LLMGW_AUDIT_CHECKPOINT_SECONDS", 300.0, minimum=1.0)

# Card telemetry (telemetry/): how long a card's samples are kept, and how old its latest reading
# may be and still count (a foreign process seen longer ago than that no longer keeps placement off).
# How often the worker samples every node's cards (telemetry/tasks.py); 0: it does not.
LLMGW_TELEMETRY_SECONDS = env_float("LLMGW_TELEMETRY_SECONDS", 15.0, minimum=0.0)
LLMGW_TELEMETRY_HISTORY_SECONDS = env_float("LLMGW_TELEMETRY_HISTORY_SECONDS", 3600.0, minimum=60.0)
LLMGW_TELEMETRY_STALE_SECONDS = env_float("LLMGW_TELEMETRY_STALE_SECONDS", 300.0, minimum=5.0)
# A round's shape (telemetry/services.py): agents asked at once, one thread per NODES_PER_THREAD nodes
# (at least 4, at most MAX_PARALLEL); answers written BATCH nodes a transaction; each card's history
# at most HISTORY_SAMPLES samples besides HISTORY_SECONDS. A round that takes t s is next due after
# max(LLMGW_TELEMETRY_SECONDS, 3 t).
LLMGW_TELEMETRY_NODES_PER_THREAD = env_int("LLMGW_TELEMETRY_NODES_PER_THREAD", 32, minimum=1)
LLMGW_TELEMETRY_MAX_PARALLEL = env_int("LLMGW_TELEMETRY_MAX_PARALLEL", 32, minimum=1)
LLMGW_TELEMETRY_BATCH = env_int("LLMGW_TELEMETRY_BATCH", 200, minimum=1)
LLMGW_TELEMETRY_HISTORY_SAMPLES = env_int("LLMGW_TELEMETRY_HISTORY_SAMPLES", 240, minimum=1)
# How often the pages that show what can change (the nodes grid, a node's page, the operations
# list) ask for their polled part again (base/views.py, polled); an unchanged part answers 204.
LLMGW_PAGE_POLL_SECONDS = env_int("LLMGW_PAGE_POLL_SECONDS", 5, minimum=1)
# How long a replica's page waits for its node's agent to answer for the engine's log before it says
# the agent is not answering (a page must not hang on a silent agent).
LLMGW_LOG_TIMEOUT_SECONDS = env_float("LLMGW_LOG_TIMEOUT_SECONDS", 3.0, minimum=0.1)
# /metrics (web/views/metrics.py): off unless a token is set; Prometheus sends it as its bearer token.
LLMGW_METRICS_TOKEN = env_str("LLMGW_METRICS_TOKEN") or ""
if LLMGW_METRICS_TOKEN and len(LLMGW_METRICS_TOKEN) < 32:
    raise ImproperlyConfigured(
        "LLMGW_METRICS_TOKEN is too short: give at least 32 characters (python -c "
        "'import secrets; print(secrets.token_urlsafe(32))')."
    )

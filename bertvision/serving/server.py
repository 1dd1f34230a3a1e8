"""``bertvision serve``: checks what it is given (the address, the workers, every bundle) in one
line each, then hands the app to uvicorn. Kept apart from the app, which imports torch (about 4 s),
so that a usage error or ``--help`` answers at once."""

from __future__ import annotations

import copy
import os
import socket
from dataclasses import replace
from pathlib import Path

from bertvision.errors import SettingsError
from bertvision.serving.bundle import bundle_paths, load_bundle, task_owners
from bertvision.serving.settings import DEFAULTS, ServeSettings

# how ``serve`` tells every worker process (uvicorn's factory mode) what to load
BUNDLE_ENV = "BERTVISION_SERVE_BUNDLE"
SETTINGS_ENV = "BERTVISION_SERVE_SETTINGS"


def check_listen(host: str, port: int, workers: int = 1) -> None:
    """A port out of range or already taken, or no worker process, fails here, in one line, before
    the bundles load."""
    if workers < 1:  # uvicorn would start one worker for 0 and say nothing
        raise SettingsError(f"--workers: {workers}; at least 1 worker process")
    if not 0 <= port <= 65535:
        raise SettingsError(f"--port: {port} is not a TCP port (0 to 65535)")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as err:
            raise SettingsError(f"--host/--port: cannot listen on {host}:{port} ({err.strerror})") from None


def serve(
    bundles: list[Path], host: str = "127.0.0.1", port: int = 8000, workers: int = 1, settings: ServeSettings = DEFAULTS
):
    """``bertvision serve``: every task of ``bundles`` over HTTP with uvicorn, ``workers`` processes."""
    import uvicorn

    check_listen(host, port, workers)
    # a broken bundle fails here, in one line, before any worker starts; so do two that share a task, or one given twice
    loaded = [load_bundle(p) for p in bundle_paths(bundles)]
    task_owners(loaded)
    # several workers on one CPU would otherwise each start a thread per core
    threads = settings.threads or (max(1, (os.cpu_count() or 1) // workers) if workers > 1 else None)
    settings = replace(settings, threads=threads)
    # uvicorn's factory mode: every worker process builds its own app from these
    os.environ[BUNDLE_ENV] = os.pathsep.join(str(b.root) for b in loaded)
    os.environ[SETTINGS_ENV] = settings.to_json()
    # every worker logs bertvision's lines (the JSON access log among them) beside uvicorn's own,
    # whose access log the app's replaces
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["loggers"]["bertvision"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    uvicorn.run(
        "bertvision.serving.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        access_log=False,
        log_config=log_config,
        timeout_graceful_shutdown=30,
    )

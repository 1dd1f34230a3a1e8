"""Operations: Prometheus metrics (``GET /metrics``, with ``prometheus-client``) and one structured
access-log line per request (logger ``bertvision.access``, JSON).

Per app, in its own registry (several apps may live in one process):
- ``bertvision_requests_total{route, method, status}``: requests answered, by route template and
  status code (4xx and 5xx included);
- ``bertvision_request_seconds{route}``: latency histogram;
- ``bertvision_batch_inputs`` and ``bertvision_batch_requests``: inputs (texts + questions) and
  requests per model call; ``bertvision_batch_seconds``: a model call's time;
- ``bertvision_encoder_passes_total``, ``bertvision_failed_requests_total``, and the gauges
  ``bertvision_queue_depth`` (requests waiting) and ``bertvision_ready``."""

from __future__ import annotations

import itertools
import json
import logging
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.routing import Match

from bertvision.serving.client_gone import CLIENT_CLOSED

access_log = logging.getLogger("bertvision.access")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServiceMetrics:
    """The metrics of one app: request counters and histograms (``observe_request``), batch
    histograms (``observe_batch``, every batcher's observer) and, read at each scrape, the
    service's encoder passes, failures and queue depth (every encoder together), and readiness."""

    def __init__(self, service, is_ready):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "bertvision_requests", "HTTP requests answered", ["route", "method", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "bertvision_request_seconds",
            "HTTP request latency",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_inputs = Histogram(
            "bertvision_batch_inputs",
            "Inputs (texts + questions) per model call",
            buckets=SIZE_BUCKETS,
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "bertvision_batch_requests", "Requests per model call", buckets=SIZE_BUCKETS, registry=self.registry
        )
        self.batch_seconds = Histogram(
            "bertvision_batch_seconds", "Seconds per model call", buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.registry.register(_LiveState(service, is_ready))

    def observe_batch(self, n_requests: int, n_inputs: int, seconds: float) -> None:
        self.batch_requests.observe(n_requests)
        self.batch_inputs.observe(n_inputs)
        self.batch_seconds.observe(seconds)

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _LiveState:
    """Read at scrape time: what the engines and batchers count themselves."""

    def __init__(self, service, is_ready):
        self.service, self.is_ready = service, is_ready

    def collect(self):
        passes = CounterMetricFamily("bertvision_encoder_passes", "Encoder forward calls")
        passes.add_metric([], self.service.encoder_passes)
        yield passes
        failed = CounterMetricFamily("bertvision_failed_requests", "Requests the model failed on")
        failed.add_metric([], self.service.failed())
        yield failed
        queue = GaugeMetricFamily("bertvision_queue_depth", "Requests waiting for a batch")
        queue.add_metric([], self.service.queued())
        yield queue
        ready = GaugeMetricFamily("bertvision_ready", "1 once the model is loaded and warmed")
        ready.add_metric([], 1.0 if self.is_ready() else 0.0)
        yield ready


class Observed:
    """ASGI middleware: every HTTP request's status and latency into ``metrics``, by its route
    template (``/v2/models/{name}/infer``, so that task names do not multiply the series), and
    one JSON access-log line."""

    def __init__(self, app, metrics: ServiceMetrics, route_lists=()):
        self.app, self.metrics, self.route_lists = app, metrics, route_lists

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status, gone = time.perf_counter(), None, False

        async def receiving():
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        async def sending(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        finally:
            seconds = time.perf_counter() - start
            # no answer: the client went away before one (mid-body, say), else the app failed
            status = status or (CLIENT_CLOSED if gone else 500)
            route = self.route(scope)
            self.metrics.observe_request(route, scope["method"], status, seconds)
            client = scope.get("client")
            access_log.info(
                json.dumps(
                    {
                        "method": scope["method"],
                        "path": scope["path"],
                        "route": route,
                        "status": status,
                        "ms": round(1000 * seconds, 2),
                        "client": f"{client[0]}:{client[1]}" if client else None,
                    }
                )
            )

    def route(self, scope) -> str:
        """The request's route template: the router's, or, for a request answered before routing
        (a body over the limit), the template its path matches."""
        if route := getattr(scope.get("route"), "path", None):
            return route
        # only the routes with a template: an included router is an entry with none (fastapi 0.165)
        routes = itertools.chain.from_iterable(self.route_lists)
        templated = (r for r in routes if isinstance(getattr(r, "path", None), str))
        return next((r.path for r in templated if r.matches(scope)[0] != Match.NONE), "unmatched")

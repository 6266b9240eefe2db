"""AdminServer: the admin HTTP listener (`--admin-listen`, default 127.0.0.1:9644) and its routes.

- `GET /metrics`: the Prometheus text format (OpenMetrics when the scraper's Accept asks for it):
  mqk.server.admin.metrics;
- `GET /health/live`: 200 while the process answers;
- `GET /health/ready`: 200 when ready, else 503, with the checks in JSON (mqk.server.admin.health);
- `GET /console/` and `/api/...`: the web console and the JSON API it reads (mqk.server.admin.console).

The runtime starts it before the store, so a long recovery shows as live and not ready, and stops it last. Other
pages (a web console) add their routes to `http` (mqk.server.admin.http.HttpServer.route / route_prefix).
"""

from __future__ import annotations

import asyncio
import logging

from mqk.server.admin.console import Console
from mqk.server.admin.health import readiness
from mqk.server.admin.http import HttpRequest, HttpResponse, HttpServer
from mqk.server.admin.parts import BrokerParts

log = logging.getLogger("mqk.admin")


class AdminServer:
    def __init__(self, listen: tuple[str, int], parts: BrokerParts) -> None:
        self.parts = parts
        self.http = HttpServer(listen)
        self.http.route("GET", "/metrics", self.metrics)
        self.http.route("GET", "/health/live", self.live)
        self.http.route("GET", "/health/ready", self.ready)
        Console(parts).install(self.http)
        #: one scrape at a time: a second scraper waits for the first rather than doubling the work
        self._scraping = asyncio.Lock()

    @property
    def address(self) -> tuple[str, int] | None:
        return self.http.address

    async def start(self) -> tuple[str, int]:
        address = await self.http.start()
        log.info("admin listener on http://%s:%d (/console/, /metrics, /health/live, /health/ready)", *address)
        return address

    async def stop(self) -> None:
        await self.http.stop()

    async def live(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse.json({"status": "live"})

    async def ready(self, request: HttpRequest) -> HttpResponse:
        ok, checks = readiness(self.parts)
        return HttpResponse.json({"status": "ready" if ok else "not ready", "checks": checks}, 200 if ok else 503)

    async def metrics(self, request: HttpRequest) -> HttpResponse:
        # (prometheus-client is loaded with the first scrape: a broker nobody scrapes never imports it)
        from mqk.server.admin import metrics

        async with self._scraping:
            snap = await metrics.snapshot(self.parts)
            body, content_type = await asyncio.to_thread(metrics.render, snap, request.headers.get("accept", ""))
        return HttpResponse(200, body, content_type)


__all__ = ["AdminServer"]

"""What the service tells of itself and its queues: stats, Prometheus metrics (with this
process's followers, feeds and readers), the health probe and the OpenAPI document."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from resumeq.producer.ops import stats
from resumeq.server import sse
from resumeq.server.auth import CAN_READ_ALL
from resumeq.server.routes.common import principal
from resumeq.server.service import service
from resumeq.store import metrics


async def get_stats(request: Request) -> Response:
    principal(request, CAN_READ_ALL)
    svc = service(request)
    return JSONResponse(await svc.run(stats, svc.store))


async def get_metrics(request: Request) -> Response:
    svc = service(request)
    if not svc.server.public_metrics:
        principal(request, CAN_READ_ALL)
    # The providers with totals in Redis, whatever this process's config names.
    text = await svc.run(metrics.render, svc.store)
    hub = svc.hub
    text += (
        "# HELP resumeq_server_followers Event streams open on this server process.\n"
        "# TYPE resumeq_server_followers gauge\n"
        f"resumeq_server_followers {hub.followers if hub else 0}\n"
        "# HELP resumeq_server_feeds Jobs whose events this server process reads (one "
        "feed each, whatever the followers).\n"
        "# TYPE resumeq_server_feeds gauge\n"
        f"resumeq_server_feeds {len(hub.feeds) if hub else 0}\n"
        "# HELP resumeq_server_readers Blocking reads of Redis this server process runs "
        f"for its feeds (one for up to {sse.READER_JOBS} jobs).\n"
        "# TYPE resumeq_server_readers gauge\n"
        f"resumeq_server_readers {hub.reading if hub else 0}\n"
    )
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def openapi(request: Request) -> Response:
    principal(request)  # every role: a producer's developer reads the API with its token
    return JSONResponse(service(request).openapi)


async def healthz(request: Request) -> Response:
    svc = service(request)
    if not svc.server.public_metrics:
        principal(request, CAN_READ_ALL)
    await svc.run(svc.ping)
    return JSONResponse({"status": "ok", "redis": "reachable"})

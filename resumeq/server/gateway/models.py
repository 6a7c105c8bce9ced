"""``GET /v1/models``: the models a client may name — the aliases of ``[gateway] models``,
and each provider profile (named ``PROFILE/MODEL``) — in OpenAI's list shape, or
Anthropic's when the request carries ``anthropic-version``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from resumeq.server.auth import CAN_CREATE, CAN_READ_ALL
from resumeq.server.gateway import common
from resumeq.server.gateway.errors import WireError
from resumeq.server.service import service


async def list_models(request: Request) -> Response:
    wire: common.Wire = "anthropic" if "anthropic-version" in request.headers else "openai"
    try:
        common.caller(request, wire, CAN_CREATE | CAN_READ_ALL)
    except WireError as exc:
        return exc.response(wire)
    settings = service(request).settings.file
    entries: list[dict[str, Any]] = [
        {"id": alias, "target": target, "owned_by": target.partition("/")[0]}
        for alias, target in sorted(settings.gateway.models.items())
    ]
    entries += [
        {"id": f"{name}/", "target": f"{name}/MODEL", "owned_by": name, "kind": profile.kind}
        for name, profile in sorted(settings.providers.items())
    ]
    if wire == "anthropic":
        data = [
            {"type": "model", "id": e["id"], "display_name": e["id"],
             "created_at": "1970-01-01T00:00:00Z", "resumeq": e}
            for e in entries
        ]  # fmt: skip
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return JSONResponse({"data": data, "has_more": False, "first_id": first, "last_id": last})
    data = [
        {"id": e["id"], "object": "model", "created": 0, "owned_by": e["owned_by"], "resumeq": e}
        for e in entries
    ]
    return JSONResponse({"object": "list", "data": data})

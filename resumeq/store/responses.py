"""Background responses to stop at the provider: the responses a cancelled (or fenced-out)
job's attempt left generating for nobody, noted until a janitor cancelled them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from resumeq.store import keys
from resumeq.store.codec import decode
from resumeq.store.transport import Transport


@dataclass(frozen=True)
class ResponseToStop:
    """A background response to cancel at the provider (:data:`keys.STOP_RESPONSES`)."""

    member: str
    job_id: str
    response_id: str
    provider: str
    since_ms: int


class Responses:
    """The index of background responses to stop (:data:`keys.STOP_RESPONSES`)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def responses_to_stop(self, limit: int = 100) -> list[ResponseToStop]:
        """Background responses that may still be generating for nobody, oldest first."""
        got = self.transport.read(
            "responses_to_stop",
            lambda r: r.zrange(keys.STOP_RESPONSES, 0, limit - 1, withscores=True),
        )
        out: list[ResponseToStop] = []
        for member, score in cast(list[Any], got):
            job_id, response_id, provider = [*decode(member).split(" ", 2), "", ""][:3]
            out.append(ResponseToStop(decode(member), job_id, response_id, provider, int(score)))
        return out

    def stop_responses(self, responses: Sequence[tuple[str, str, str]]) -> None:
        """Add ``(job id, response id, provider)``: responses to cancel at the provider."""
        if responses:
            now = int(time.time() * 1000)
            members = {" ".join(r): now for r in responses}
            self.transport.read(
                "stop_responses", lambda r: r.zadd(keys.STOP_RESPONSES, members, nx=True)
            )

    def responses_stopped(self, members: Sequence[str]) -> None:
        """Those were cancelled (or cannot be): forget them."""
        if members:
            self.transport.read(
                "responses_stopped", lambda r: r.zrem(keys.STOP_RESPONSES, *members)
            )

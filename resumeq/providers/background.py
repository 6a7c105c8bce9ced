"""A provider's background responses (the Responses wire's ``background``): stopped when
nobody will read the rest, and counted after (SPEC §22). The worker lets go of the one it
streams at a handoff, the janitor of a dead worker's, an operator's cancel of any."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resumeq.core.errors import ConfigError, ProviderError

if TYPE_CHECKING:
    import httpx

    from resumeq.core.models import JobRecord
    from resumeq.core.settings import Settings


def stop_background_response(settings: Settings, provider: str, response_id: str) -> bool:
    """Cancel a background response at the provider (``POST /responses/{id}/cancel``):
    nobody will read the rest, so nobody should pay for it. Answers whether it was
    stopped: False when this process knows no background profile ``provider`` or the
    response had ended. A provider error is raised (:class:`~resumeq.core.errors.ProviderError`).
    """
    try:
        profile = settings.profile(provider)
    except ConfigError:
        return False
    if not profile.background:
        return False
    import httpx  # noqa: PLC0415

    from resumeq.providers import make_client  # noqa: PLC0415

    with httpx.Client() as http:
        return make_client(profile, http).cancel(response_id)


@dataclass(frozen=True)
class Released:
    """What a background response let go made, as the provider says after its cancel:
    its output tokens (None where it reports no usage) and the UTF-8 bytes of its output
    text (None where it could not be read)."""

    billed_output: int | None = None
    output_bytes: int | None = None


def release_background_response(
    settings: Settings, provider: str, response_id: str, http: httpx.Client | None = None
) -> Released:
    """Cancel a background response nobody will read on, then read what it made (SPEC
    §22: cancelled first, counted after). Best effort: a provider that cannot be asked, or a
    profile this process does not know, answers what is known (nothing)."""
    try:
        profile = settings.profile(provider)
    except ConfigError:
        return Released()
    if not profile.background:
        return Released()
    import httpx  # noqa: PLC0415

    from resumeq.providers import make_client  # noqa: PLC0415
    from resumeq.providers.openai_responses import usage_of  # noqa: PLC0415

    own = http is None
    client = make_client(profile, http or httpx.Client())
    try:
        with contextlib.suppress(ProviderError):
            client.cancel(response_id)
        status = getattr(client, "status", None)
        if status is None:
            return Released()
        try:
            data = status(response_id)
        except ProviderError:
            return Released()
    finally:
        if own:
            client.http.close()
    usage = usage_of(data.get("usage"))
    return Released(
        billed_output=usage.output_tokens if usage is not None else None,
        output_bytes=_output_bytes(data.get("output")),
    )


def _output_bytes(output: Any) -> int | None:
    """The bytes of a Responses object's output text (its messages' ``output_text``)."""
    if not isinstance(output, list):
        return None
    size = 0
    for item in output:
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                size += len(part["text"].encode("utf-8"))
    return size


def response_of(record: JobRecord) -> tuple[str, str, str] | None:
    """``(job id, response id, provider)`` of the job's background response, if it has one."""
    if record.response_id is None:
        return None
    provider = (record.response_for or "").partition(" ")[0]
    return record.id, record.response_id, provider

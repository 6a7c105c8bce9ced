"""``resumeq serve``: the HTTP service (SPEC §18) — jobs, resumable event streams, the
spill lane and stats for web apps in any language, with bearer tokens and roles."""

from resumeq.server.app import app_from_env, check_exposure, create_app

__all__ = ["app_from_env", "check_exposure", "create_app"]

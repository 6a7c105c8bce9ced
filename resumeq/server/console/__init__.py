"""The operator console (``/console``): see :mod:`resumeq.server.console.views`."""

from resumeq.server.console.views import Console

__all__ = ["Console"]

"""The HTTP API's routes (SPEC §18), one module per resource: :mod:`.jobs` (create, read,
cancel, purge, follow tokens), :mod:`.events` (a job's event stream), :mod:`.spill` (the
spill lane) and :mod:`.status` (stats, metrics, health, the OpenAPI document); :mod:`.common`
holds what they all read from a request. :func:`resumeq.server.app.create_app` puts them
at their paths.

Every operation is the one the CLI and :class:`~resumeq.producer.client.Client` run — the
store's scripts, :func:`~resumeq.producer.enqueue.enqueue_job`, :mod:`resumeq.producer.ops` —
called in a worker thread (they are synchronous and re-send what Redis did not answer);
event streams read Redis with ``redis.asyncio``
(:class:`~resumeq.producer.async_client.AsyncClient`). Nothing is done differently for HTTP.
"""

"""Real parts for tests and benchmarks: a redis-server process on a free port."""

from resumeq.testing.redis_server import RedisServer, free_port

__all__ = ["RedisServer", "free_port"]

"""The worker's heap: per-thread caches off, freed memory handed back.

A concurrent worker runs every attempt on a thread of its own, and glibc's allocator keeps
two things per thread that a process with hundreds of threads pays for many times over
(BENCHMARKS.md §4, 200 streams):

- **The thread cache** (tcache): up to seven freed chunks of each size up to 1 KiB, per
  thread, never given back while the thread lives. Python objects over 512 bytes come from
  malloc, so every attempt thread kept some 56 KB of freed chunks: 11 MB at 200 streams.
  It can only be turned off before the process starts (``GLIBC_TUNABLES``), so the worker
  command starts itself again with ``glibc.malloc.tcache_count=0``
  (:func:`reexec_without_thread_caches`). Its CPU cost did not show in the benchmarks
  (CPU per token, the checkpoint overhead: BENCHMARKS.md §4).
- **Free pages inside the arenas**: glibc returns memory only from the top of a heap, so
  what an attempt frees (a response's buffers, a job's decoded payload, the validation of
  its spec) stays mapped. :func:`release_free_memory` (``malloc_trim(0)``) walks every arena
  and gives the free pages back; the worker calls it after attempts came and went.

glibc only: elsewhere (musl, macOS) both do nothing.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Mapping

#: The tunable the worker starts itself with (a user's own setting of it is kept).
TCACHE_OFF = "glibc.malloc.tcache_count=0"
_TCACHE_KEY = "glibc.malloc.tcache_count"
#: Set in the started-again process, so it never starts itself a third time (a setuid
#: interpreter, whose loader drops ``GLIBC_TUNABLES``, would otherwise loop).
_MARK = "RESUMEQ_HEAP_REEXEC"

#: Whether this process's own entry point said it may be replaced (:func:`mark_entry_point`).
_entry_point = threading.Event()


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):
        return False


@functools.cache
def _load_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, looked up on first use: finding the C library runs
    ``ldconfig``, which a command line that never trims should not pay for."""
    if not _glibc():
        return None
    import ctypes  # noqa: PLC0415
    import ctypes.util  # noqa: PLC0415

    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]  # type: ignore[attr-defined]
    trim.restype = ctypes.c_int  # type: ignore[attr-defined]
    return trim


def release_free_memory() -> bool:
    """Give the free pages of every malloc arena back to the system; answers whether the
    C library released any. ctypes releases the GIL for the call: other threads run
    meanwhile."""
    trim = _load_trim()
    if trim is None:
        return False
    return bool(trim(0))


def mark_entry_point() -> None:
    """Called by a process's own entry point (the console script, ``worker_entry.py``):
    from then on :func:`reexec_without_thread_caches` may replace the process. Never
    called when resumeq runs inside someone else's program (a test's CLI runner)."""
    _entry_point.set()


def thread_caches_off(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether an environment starts a process with glibc's thread caches as resumeq's
    worker wants them (or as the user set them)."""
    return _TCACHE_KEY in environ.get("GLIBC_TUNABLES", "") or bool(environ.get(_MARK))


def reexec_without_thread_caches() -> None:
    """Start this process again, the same command line under the same PID, with glibc's
    thread caches off — unless it is not an entry point, not on glibc, already started so,
    or the user's ``GLIBC_TUNABLES`` names ``tcache_count`` already. Call it before any
    thread starts and before anything is written."""
    if not _entry_point.is_set() or not _glibc() or thread_caches_off() or not sys.executable:
        return
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = ":".join(t for t in (env.get("GLIBC_TUNABLES"), TCACHE_OFF) if t)
    env[_MARK] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)

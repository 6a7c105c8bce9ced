"""What a command line command reads of a config file — ``[store]``, ``[limits]`` and the
provider profiles' names — without the settings models, once the models validated that
very file. Loading pydantic and building the models costs ``resumeq status`` more than the
rest of it (tests/test_imports.py holds the budget with a config file too).

A digest is kept in the user's cache directory (``$XDG_CACHE_HOME/resumeq``, else
``~/.cache/resumeq``), named by the SHA-256 of the file's bytes and of resumeq's version: a
file changed by one byte, or read by another version of resumeq, is validated again by the
models before anything is read from it. What the models make of a file depends on its bytes
alone (the environment's two variables are read apart, :mod:`resumeq.core.defaults`). A digest
that cannot be read or written is no error: the models validate the file then, as they would
without one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resumeq.core.defaults import LimitDefaults, StoreDefaults
from resumeq.core.version import __version__

if TYPE_CHECKING:
    from resumeq.core.settings import ConfigFile


@dataclass(frozen=True)
class ConfigDigest:
    store: StoreDefaults
    limits: LimitDefaults
    providers: tuple[str, ...]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "resumeq"


def _where(data: bytes) -> Path:
    digest = hashlib.sha256(f"resumeq {__version__}\0".encode() + data).hexdigest()
    return cache_dir() / f"config-{digest}.json"


def read_bytes(path: Path) -> bytes | None:
    """The file's bytes, or None if it cannot be read (the models then say why)."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def load(path: Path) -> ConfigDigest | None:
    """The digest of the file as it is now, if the models validated these bytes before."""
    data = read_bytes(path)
    if data is None:
        return None
    try:
        kept: dict[str, Any] = json.loads(_where(data).read_text(encoding="utf-8"))
        return ConfigDigest(
            store=StoreDefaults(**kept["store"]),
            limits=LimitDefaults(**kept["limits"]),
            providers=tuple(str(name) for name in kept["providers"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def of(file: ConfigFile) -> ConfigDigest:
    """What the models made of a file, as a command reads it."""
    return ConfigDigest(
        store=StoreDefaults(**file.store.model_dump()),
        limits=LimitDefaults(**file.limits.model_dump()),
        providers=tuple(sorted(file.providers)),
    )


def save(path: Path, data: bytes, file: ConfigFile) -> None:
    """Keep the digest of ``file``, what the models made of ``data``, if the file still
    holds those bytes; quietly nothing if the cache cannot be written."""
    if read_bytes(path) != data:
        return  # changed while it was validated: the next command validates it again
    where = _where(data)
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        partial = where.with_name(f"{where.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(asdict(of(file))), encoding="utf-8")
        os.replace(partial, where)  # whole or not at all
    except OSError:
        return

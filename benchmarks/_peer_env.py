"""Virtual environments of their own for the benchmarks' peers whose pins clash with
resumeq's (arq pins redis-py below 6; rq-dashboard brings Flask): each is made on first use,
inside resumeq's ``.venv`` (which git ignores), from an extra of pyproject.toml — the one
place the peer's version is pinned — and made again when that extra changes."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def requirements(extra: str) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return list(project["project"]["optional-dependencies"][extra])


def peer_python(extra: str) -> str:
    """The interpreter of the environment for ``extra`` (``.venv/<extra>``)."""
    env_dir = ROOT / ".venv" / extra
    python = env_dir / "bin" / "python"
    wanted = requirements(extra)
    stamp = env_dir / ".installed"
    if python.exists() and stamp.exists() and stamp.read_text() == json.dumps(wanted):
        return str(python)
    print(f"making the {extra} environment ({', '.join(wanted)}) in {env_dir}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env_dir)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *wanted], check=True)
    stamp.write_text(json.dumps(wanted))
    return str(python)

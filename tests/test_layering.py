"""The layering contracts of ``[tool.importlinter]`` (``lint-imports``, in ``make lint``)
cover every module there is: a module added to resumeq is named in them, or this fails."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The faces, and what only tools and tests run: the contracts name them apart.
FACES = {"resumeq.cli", "resumeq.server"}
APART = {"resumeq.fake", "resumeq.testing", "resumeq.demo", "resumeq.docs"}


def contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def top_level() -> set[str]:
    package = ROOT / "resumeq"
    modules = {f"resumeq.{p.stem}" for p in package.glob("*.py") if not p.stem.startswith("__")}
    packages = {f"resumeq.{p.name}" for p in package.iterdir() if (p / "__init__.py").exists()}
    return modules | packages


def test_every_module_below_the_faces_is_held_to_both_contracts() -> None:
    below = top_level() - FACES - APART - {"resumeq.scripts"}  # the scripts are Lua
    found = contracts()
    assert set(found["faces-on-top"]["source_modules"]) == below
    assert set(found["no-fake-in-product"]["source_modules"]) == below | FACES | {"resumeq.docs"}
    assert set(found["no-fake-in-product"]["forbidden_modules"]) == {
        "resumeq.fake",
        "resumeq.testing",
    }

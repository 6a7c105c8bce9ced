"""The layering contracts of ``[tool.importlinter]`` (``lint-imports``, in ``make lint``)
cover every module there is: a package or module added to resumeq is placed in the layers,
or named apart, or this fails."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: What only tools and tests run, and what is not Python: the contracts name them apart.
APART = {"resumeq.fake", "resumeq.testing", "resumeq.demo"}
#: Not imported by resumeq's own modules: the generator of docs/jobspec.md, ``python -m``.
UNLAYERED = {"resumeq.docs"}


def contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def top_level() -> set[str]:
    package = ROOT / "resumeq"
    modules = {f"resumeq.{p.stem}" for p in package.glob("*.py") if not p.stem.startswith("__")}
    packages = {f"resumeq.{p.name}" for p in package.iterdir() if (p / "__init__.py").exists()}
    return modules | packages


def layered() -> set[str]:
    return {m.strip() for layer in contracts()["layers"]["layers"] for m in layer.split("|")}


def test_every_product_package_has_its_layer() -> None:
    assert layered() == top_level() - APART - UNLAYERED


def test_product_code_never_imports_the_fake_or_the_harness() -> None:
    found = contracts()["no-fake-in-product"]
    assert set(found["source_modules"]) == layered() | UNLAYERED
    assert set(found["forbidden_modules"]) == {"resumeq.fake", "resumeq.testing"}


def test_the_core_is_the_bottom_layer_and_pure() -> None:
    assert contracts()["layers"]["layers"][-1] == "resumeq.core"
    forbidden = set(contracts()["core-is-pure"]["forbidden_modules"])
    assert {"redis", "rq", "httpx", "threading", "asyncio"} <= forbidden


def test_no_package_sits_in_the_old_flat_shape() -> None:
    """The top level holds the packages by role, the public entry points and the two names
    RQ and hook modules know (``resumeq.hooks``, ``resumeq.rq_worker``) — nothing else."""
    package = ROOT / "resumeq"
    flat = {p.stem for p in package.glob("*.py")} - {"__init__", "__main__"}
    assert flat == {"demo", "docs", "hooks", "rq_worker"}

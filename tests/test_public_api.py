"""The package's public surface is explicit and complete."""

from __future__ import annotations

import inspect

import resumeq
from resumeq.core import errors


def test_all_names_exist() -> None:
    for name in resumeq.__all__:
        assert hasattr(resumeq, name), name


def test_every_exception_is_exported_and_in_one_tree() -> None:
    classes = [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, Exception) and obj.__module__ == errors.__name__
    ]
    assert classes
    for cls in classes:
        assert cls.__name__ in resumeq.__all__, cls
        assert issubclass(cls, errors.ResumeqError)
        # The tree in the module docstring names every class.
        assert cls.__name__ in (errors.__doc__ or ""), cls


def test_write_refusals_share_a_base() -> None:
    for cls in (errors.LeaseLost, errors.StaleRevision, errors.JobCancelled):
        assert issubclass(cls, errors.WriteRefused)

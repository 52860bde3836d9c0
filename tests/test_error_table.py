"""The one table of what each error means at the edges (HTTP status and problem type, the
command's exit code): what it names, and how a class it does not name is looked up."""

from __future__ import annotations

from interlock.cli import common
from interlock.client.error_table import ERRORS, meaning
from interlock.core.vocabulary import InterlockError
from interlock.runtime.errors import UnknownRun, UnknownWorkflow

EXIT_CODES = {common.EXIT_FAILED, common.EXIT_USAGE, common.EXIT_NO_RUN, common.EXIT_DENIED}


def test_every_row_is_an_interlock_error_with_an_answer() -> None:
    for cls, found in ERRORS.items():
        assert issubclass(cls, InterlockError), cls
        assert found.exit_code in EXIT_CODES or found.exit_code is None, cls
        assert (found.status is None) == (found.problem is None), cls
        assert found.status is None or 400 <= found.status < 600, cls
        assert found.status is not None or found.exit_code is not None, cls


def test_a_subclass_means_what_its_nearest_listed_class_means() -> None:
    class Gone(UnknownRun):
        pass

    found = meaning(Gone("r1"))
    assert found is ERRORS[UnknownRun]
    assert (found.status, found.problem, found.exit_code) == (404, "unknown-run", 4)
    assert found.detail(Gone("r1")) == "no run 'r1'"
    assert meaning(UnknownWorkflow("no workflow w")) is ERRORS[UnknownWorkflow]


def test_an_error_it_does_not_name_has_no_meaning() -> None:
    assert meaning(InterlockError("other")) is None
    assert meaning(ValueError("plain")) is None

"""A failed end-to-end test's report carries the logs of the live stack's processes."""
from __future__ import annotations

import pytest

from tests.e2e.livestack import LiveStack


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, LiveStack):
                report.sections.append((f"logs of the processes of `{name}`", value.logs()))
    return report

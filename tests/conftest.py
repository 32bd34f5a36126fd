import pytest

from resilience.plugin import fail_skips_in_ci


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fail_skips_in_ci(outcome.get_result())

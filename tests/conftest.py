import os
import shutil
import tempfile

import pytest

from resilience.commands.pytest_plugin import fail_skips_in_ci
from resilience.core import janitor

from .harness_helpers import REFERENCE_CACHE_ENV

REFERENCE_CACHE = pytest.StashKey[str]()  # the run's reference cache, on the configs that made it
WORKER_INPUT_KEY = "resilience_reference_cache"


def pytest_configure(config):
    """One reference cache for the whole run: made here by a plain session or the xdist controller,
    handed to each worker (`pytest_configure_node`), removed when the run ends (and by the janitor
    if the run is killed). `ReferenceCache` locks each key, so two workers needing the same reference
    run it once. ``RESILIENCE_CACHE`` points there too, so the commands tests run (`resilience run`,
    `qualify`, `fuzz`, ... in this process or in subprocesses) share it and write nothing under ~/.cache."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and WORKER_INPUT_KEY in workerinput:
        root = workerinput[WORKER_INPUT_KEY]
    else:
        root = tempfile.mkdtemp(prefix="resilience-tests-references-")
        janitor.register("dir", root)
        config.stash[REFERENCE_CACHE] = root
    os.environ[REFERENCE_CACHE_ENV] = root
    os.environ["RESILIENCE_CACHE"] = root


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist controller: each worker uses the controller's reference cache."""
    node.workerinput[WORKER_INPUT_KEY] = node.config.stash[REFERENCE_CACHE]


def pytest_unconfigure(config):
    root = config.stash.get(REFERENCE_CACHE, None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
        janitor.release("dir", root)


@pytest.fixture(autouse=True)
def _fresh_reference(request):
    """A test marked ``fresh_reference`` runs its cases' references itself, not from the run's cache."""
    if request.node.get_closest_marker("fresh_reference"):
        request.getfixturevalue("monkeypatch").delenv(REFERENCE_CACHE_ENV, raising=False)
    yield


def _minutes_first(item) -> float:
    marker = item.get_closest_marker("minutes")
    return -marker.args[0] if marker else 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fail_skips_in_ci(outcome.get_result())


def pytest_collection_modifyitems(config, items):
    """Tests marked ``minutes(N)`` go first, longest first (xdist hands out tests in collection order,
    so a test of several minutes that came last would leave one worker running it alone). Tests marked ``gpu``
    run only where CUDA is available; elsewhere they are deselected (counted as deselected, never as
    skipped), so a CPU machine's CI=true run stays honest and green."""
    items.sort(key=_minutes_first)  # stable: the rest keep their order
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    config.hook.pytest_deselected(items=gpu_tests)
    items[:] = [item for item in items if not item.get_closest_marker("gpu")]

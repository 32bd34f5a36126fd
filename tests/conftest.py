import atexit
import os
import shutil
import tempfile

import pytest

from resilience.commands.pytest_plugin import fail_skips_in_ci

if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    # torch 2.13.0 makes its compile cache directory ($TMPDIR/torchinductor_<user>) when
    # torch._dynamo loads (megatron-core's import in a test process does) and never removes it
    _compile_cache = tempfile.mkdtemp(prefix="resilience-tests-compile-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _compile_cache
    atexit.register(shutil.rmtree, _compile_cache, True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fail_skips_in_ci(outcome.get_result())


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run only where CUDA is available; elsewhere they are deselected (counted
    as deselected, never as skipped), so a CPU machine's CI=true run stays honest and green."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    config.hook.pytest_deselected(items=gpu_tests)
    items[:] = [item for item in items if not item.get_closest_marker("gpu")]

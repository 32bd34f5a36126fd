"""Startup hook for the processes a rank's libraries start on their own (DeepSpeed's decoupled
checkpoint writer, DCP's writer processes): a rank whose fault reaches helpers puts this directory
first on ``PYTHONPATH``, and Python imports this module at the start of every child interpreter.
It arms the fault there (see ``resilience.rank.helper_hook``), then runs any other ``sitecustomize``."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _install() -> None:
    config = os.environ.get("RESILIENCE_HELPER_HOOK")
    if not config:
        return
    import json

    sys.path.insert(0, json.loads(config)["project_root"])  # before the child's own path setup
    from resilience.rank.helper_hook import install

    install(config)


def _install_blackbox() -> None:
    """A user's own training script under torchrun (black-box mode): see resilience.rank.blackbox_hook."""
    config = os.environ.get("RESILIENCE_BLACKBOX")
    if not config:
        return
    import json

    sys.path.insert(0, json.loads(config)["project_root"])
    from resilience.rank.blackbox_hook import install

    install(config)


def _chain() -> None:
    """The sitecustomize this one shadows (a distribution's own), if there is one."""
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != __file__:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_install()
_install_blackbox()
_chain()

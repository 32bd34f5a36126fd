"""Runs cases on this machine: each in a work directory of its own, through the one phase sequence
(`run.case_sequence`) as `run.local_case.LocalCase` takes it, or the crash-state explorer's
(`run.explore.Explorer`) for a fault that explores.

Every phase has a deadline; the whole rank group is destroyed at the end of every phase, on the
first rank failure (as torchrun does) and on any exception in the harness itself.
"""
from __future__ import annotations

import copy
from pathlib import Path

from ..core import compile_cache, janitor, registry
from ..core.case import Case
from ..core.plan import PhasePlan
from ..core.records import CaseResult, PhaseResult
from ..errors import StrategyUnavailable
from ..launch.backend import BACKENDS, DEFAULT_BACKEND, ProcessBackend, backend_for_case
from .explore import Explorer
from .local_case import LocalCase
from .reference_cache import ReferenceCache
from .supervisor import run_local_phase


class Harness:
    """Runs cases. ``cache``: a `ReferenceCache` to share reference runs across cases (None: run
    the reference in every case). ``object_store``: for cases with ``object_store``, a callable
    from the case's work directory to the store it checkpoints into (None: moto's server on
    loopback, `resilience.objectstore.server.S3Store`)."""

    def __init__(self, backend: ProcessBackend | None = None, work_root: Path | None = None, keep: bool = False,
                 cache: ReferenceCache | None = None, explore_profile: str | None = None,
                 explore_restores: int | None = None, explore_warm: bool = True, explore_reduce: bool = True,
                 object_store=None):
        compile_cache.keep_in_this_run()  # before the first process this harness starts
        self.object_store = object_store
        self.backend = backend or BACKENDS[DEFAULT_BACKEND]()
        self.work_root, self.keep, self.cache = work_root, keep, cache
        # power_loss cases: the explorer's profile (ci, long) and cap on restores, overriding the scenario's
        self.explore_profile, self.explore_restores = explore_profile, explore_restores
        self.explore_warm = explore_warm  # False: every crash state restored by fresh ranks
        self.explore_reduce = explore_reduce  # False: no state judged with another's restore (run.explore_reduction)

    def with_backend(self, backend: ProcessBackend) -> Harness:
        """The same harness (work root, cache, exploration settings) starting ranks with ``backend``."""
        other = copy.copy(self)
        other.backend = backend
        return other

    def run(self, case: Case) -> CaseResult:
        missing = registry.resolve("strategy", case.strategy.name).missing_for(case.strategy.options)
        if missing:
            raise StrategyUnavailable(f"strategy {case.strategy.name} needs {missing}")
        if case.object_store:
            from ..objectstore.server import missing as store_missing

            if store_missing():
                raise StrategyUnavailable(f"object_store: {case.object_store} needs {store_missing()}")
        with janitor.temporary_directory("resilience-", self.work_root, self.keep) as work_dir:
            return self._run(case, work_dir)

    def _run(self, case: Case, work_dir: Path) -> CaseResult:
        if registry.resolve("fault", case.fault.kind).explores:
            return Explorer(case, work_dir, self.run_phase, self.cache, self.keep, self.explore_profile,
                            self.explore_restores,
                            warm_backend=(backend_for_case(case) or self.backend) if self.explore_warm else None,
                            reduce=self.explore_reduce).run()
        return LocalCase(case, work_dir, self.run_phase, self.cache, self.object_store).run()

    def run_phase(self, plan: PhasePlan, case: Case, supervisor=None,
                  backend: ProcessBackend | None = None) -> PhaseResult:
        """Start the phase's ranks (with ``backend``, else the case's software's, else this harness's),
        supervise them to the end (``supervisor``: a fault that acts from outside the ranks while they
        run) and collect them."""
        return run_local_phase(plan, case, supervisor, backend, default=self.backend)

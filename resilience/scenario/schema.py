"""The keys a scenario may hold and the values they allow: shared by the validator, the matrix and the
listings, so an error's `allowed` and `resilience list` cannot drift apart."""
from __future__ import annotations

import re

TOP_KEYS = ("name", "description", "strategy", "workload", "fault", "restart", "expect",
            "known_issue", "timeouts", "tier", "matrix", "topology", "object_store", "timeline", "soak",
            "verify_saves", "software")
OBJECT_STORES = ("s3",)  # `object_store`: where checkpoints go instead of a directory
WORKLOAD_KEYS = ("model", "world_size", "steps", "checkpoint_every", "seed", "global_batch", "size",
                 "rank_rng", "options")
TRIGGER_KEYS = ("rank", "step", "phase", "point", "file", "after_bytes")
SOFTWARE_KEYS = ("python", "packages")  # `software` (every phase) and the restart's own
RESTART_KEYS = ("world_size", "rank_map", *SOFTWARE_KEYS, "topology")
TOPOLOGY_KEYS = ("tp", "pp", "nodes", "node_ids", "storage")
EXPECT_KEYS = ("outcome", "error", "fallback_ok", "fallback")
FALLBACK_CHOICES = ("optional", "required")
KNOWN_ISSUE_KEYS = ("reason", "link", "verdict")
TIMEOUT_KEYS = ("collective", "phase")
TIERS = ("smoke", "full", "deep")  # deep: run with -m deep (or qualify --deep), not by default
RANK_RNG = ("same", "distinct")
REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]+\])?"  # a pip requirement
                         r"(\s*(==|>=|<=|~=|!=|<|>)\s*[A-Za-z0-9.*+!_-]+)*$")
MAX_WORLD_SIZE = 64
DEFAULT_TIMEOUTS = {"collective": 60.0, "phase": 180.0}
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week; far longer overflows the process group's timedelta
SHORT_FORMS = {"strategy": "name", "expect": "outcome", "fault": "kind"}  # `strategy: x` = `strategy: {name: x}`

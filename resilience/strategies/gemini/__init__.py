"""lm-resiliency's GEMINI in-memory checkpoint with peer replicas as a system under test
(``checkpoint.py``).

Its package (0.2.0) declares only numpy and torch, which this environment has; every phase of a
case on it runs with ``PACKAGES`` layered over this environment (`Case.software`), installed once
and cached, as the other libraries that are not extras. The library is imported only there."""
from __future__ import annotations

from ..stack import Stack

PACKAGES = ("lm-resiliency==0.2.0",)

STACK = Stack(
    name="gemini",
    distributions=("lm-resiliency",),
    requires="lm_resiliency",  # never installed here: the fork server preloads nothing of it
)

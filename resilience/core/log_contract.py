"""The log contract of black-box mode: the lines a user's training script prints on stdout (every
rank, each on a line of its own) so that its run can be judged without reading its code.

    RESILIENCE step=N loss=L        after optimizer step N (1, 2, ...), before that step's checkpoint
                                    is saved; L as float.hex() (or repr(float)): exact to the bit
    RESILIENCE saved step=N         once the checkpoint of step N is complete (the save returned)
    RESILIENCE restored step=N      after resuming from the checkpoint of step N (0: a fresh start)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "RESILIENCE "
_LINE = re.compile(r"^RESILIENCE (?:step=(?P<step>\d+) loss=(?P<loss>\S+)|(?P<kind>saved|restored) step=(?P<at>\d+))$")


@dataclass(frozen=True)
class ContractLine:
    kind: str  # "step", "saved" or "restored"
    step: int
    loss: float | None = None


def parse_line(line: str) -> ContractLine | None:
    """The contract line ``line`` is, or None for any other output. A line that starts like one but
    breaks the contract raises, so a typo cannot pass for a silent run."""
    line = line.strip()
    if not line.startswith(PREFIX):
        return None
    match = _LINE.match(line)
    if match is None:
        raise ValueError(f"log contract: malformed line; got {line!r}; allowed: "
                         "'RESILIENCE step=N loss=<float.hex()>', 'RESILIENCE saved step=N', "
                         "'RESILIENCE restored step=N'")
    if match["step"] is not None:
        return ContractLine("step", int(match["step"]), _float(match["loss"], line))
    return ContractLine(match["kind"], int(match["at"]))


def _float(text: str, line: str) -> float:
    try:
        return float.fromhex(text) if "x" in text.lower() else float(text)
    except ValueError:
        raise ValueError(f"log contract: loss is not a float; got {text!r} in {line!r}; "
                         f"allowed: float.hex() or repr(float)") from None

"""`resilience bisect SCENARIO [--case ID] --package NAME --versions A..B [--restart]`: run one case
under the releases of one library it needs to, and print where its verdict changes.

Each release V is layered over this environment, installed once without its dependencies and
cached like every layered package: the whole case runs under it (``software: {packages: [NAME==V]}``,
its reference included), or with ``--restart`` only the restart does (``restart.packages``: saved by
this environment's release, restored by V). The releases are those the package index pip reaches
lists from A to B, inclusive, oldest first. The two ends run first; where their verdicts agree
there is nothing to bisect (a verdict that changes and changes back between them is not seen: the
search assumes one boundary, as git bisect does). Otherwise a binary search finds two neighbouring
releases whose verdicts differ, in about log2(N) runs. Every run shows the release its ranks
imported (their ``joined`` event), so a layering that did not take is never mistaken for a verdict.
Exit status: 0 when a boundary was found, 1 when the ends agree or a run could not be made, 2 for
bad arguments.
"""
from __future__ import annotations

import argparse
import copy
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..core.case import Case, Software
from ..core.events import Event
from ..core.plan import FIRST_RUN, RESTART
from ..core.records import CaseResult
from ..errors import ResilienceError, Unavailable
from ..launch.interpreters import released_versions
from ..run.harness import Harness
from ..scenario.loader import parse_case


@dataclass(frozen=True)
class Observation:
    """One release's run of the case."""

    version: str
    verdict: str  # a VerdictKind value, or UNAVAILABLE / ERROR when the case could not run under it
    detail: str  # the verdict's first finding or error
    imported: str | None  # the release the ranks reported (None: no rank got that far)


def release_range(text: str, name: str, releases: tuple[str, ...]) -> tuple[str, ...]:
    """The releases from A to B of ``A..B``, oldest first; a bad range raises ValueError naming what is allowed."""
    ends = text.split("..")
    if len(ends) != 2 or not all(ends):
        raise ValueError(f"--versions: {text!r} is not a range; allowed: FIRST..LAST, e.g. "
                         f"{releases[max(0, len(releases) - 8)]}..{releases[-1]}")
    missing = [end for end in ends if end not in releases]
    if missing:
        raise ValueError(f"--versions: {', '.join(missing)} is not a release of {name} on the package index; "
                         f"allowed: {', '.join(releases[-30:])}{' (and older)' if len(releases) > 30 else ''}")
    first, last = (releases.index(end) for end in ends)
    if last - first < 1:
        raise ValueError(f"--versions: {text!r} must name an older release first and a newer one last")
    return releases[first:last + 1]


def case_under(case: Case, name: str, version: str, at_restart: bool) -> Case:
    """The case with release ``version`` of ``name`` layered over the software it names (or over
    the restart's), validated as any case is."""
    document = copy.deepcopy(dict(case.document))
    section = document.setdefault("restart", {}) if at_restart else document.setdefault("software", {})
    if section.get("python"):
        raise ValueError(f"{case.source}[{case.id}]: {'restart' if at_restart else 'software'}.python names an "
                         "interpreter of its own; a release can be layered only over this environment")
    kept = [r for r in section.get("packages", []) if Software(packages=(r,)).package_names != (name,)]
    section["packages"] = kept + [f"{name}=={version}"]
    return parse_case(document, case.source, case.id)


def observe(harness: Harness, case: Case, name: str, version: str, at_restart: bool) -> Observation:
    try:
        result = harness.run(case_under(case, name, version, at_restart))
    except Unavailable as exc:
        return Observation(version, "UNAVAILABLE", one_line(str(exc)), None)
    except ResilienceError as exc:
        return Observation(version, "ERROR", one_line(str(exc)), None)
    verdict = result.verdict
    detail = verdict.findings[0] if verdict.findings else (verdict.first_error.summary() if verdict.first_error
                                                           else "")
    return Observation(version, verdict.kind.value, one_line(detail), imported_release(result, name, at_restart))


def one_line(text: str) -> str:
    """``text`` on one line, without terminal escapes (torch's load errors carry bold), at most 300 characters."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())[:300]


def imported_release(result: CaseResult, name: str, at_restart: bool) -> str | None:
    phase = result.phase(RESTART if at_restart else FIRST_RUN)
    joined = phase.events(Event.JOINED) if phase is not None else []
    return joined[0].get("versions", {}).get(name) if joined else None


def search(releases: tuple[str, ...], run: Callable[[str], Observation]
           ) -> tuple[list[Observation], tuple[Observation, Observation] | None]:
    """Every observation made (in the order made) and the two neighbouring releases whose verdicts
    differ, or None when the two ends agree. The older side keeps the first end's verdict."""
    low, high = run(releases[0]), run(releases[-1])
    made = [low, high]
    if low.verdict == high.verdict:
        return made, None
    low_index, high_index = 0, len(releases) - 1
    while high_index - low_index > 1:
        middle_index = (low_index + high_index) // 2
        middle = run(releases[middle_index])
        made.append(middle)
        if middle.verdict == low.verdict:
            low, low_index = middle, middle_index
        else:
            high, high_index = middle, middle_index
    return made, (low, high)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--package", required=True, help="the distribution whose releases to bisect (e.g. deepspeed)")
    parser.add_argument("--versions", required=True, help="FIRST..LAST: the oldest and newest release to try")
    parser.add_argument("--restart", action="store_true",
                        help="layer each release over the restart only (restart.packages): this environment saves")


def main(args: argparse.Namespace, harness: Harness, cases: list[Case]) -> int:
    if len(cases) != 1:
        ids = ", ".join(f"{c.source}[{c.id}]" for c in cases) or "none"
        print(f"ERROR --case: bisect runs one case; selected {len(cases)} ({ids[:600]})", flush=True)
        return 2
    case = cases[0]
    try:
        releases = release_range(args.versions, args.package, released_versions(args.package))
        case_under(case, args.package, releases[0], args.restart)  # a case that cannot take it fails here
    except (ValueError, ResilienceError) as exc:
        print(f"ERROR {exc}", flush=True)
        return 2
    where = "the restart" if args.restart else "every phase"
    print(f"bisecting {case.source}[{case.id}] over {len(releases)} releases of {args.package} "
          f"({releases[0]}..{releases[-1]}), layered under {where}", flush=True)

    def run(version: str) -> Observation:
        seen = observe(harness, case, args.package, version, args.restart)
        imported = f"imported {seen.imported}" if seen.imported else "no rank reported its release"
        print(f"  {args.package}=={version:<10} {seen.verdict:<11} ({imported}) {seen.detail}", flush=True)
        return seen

    _, boundary = search(releases, run)
    if boundary is None:
        print(f"no boundary: {releases[0]} and {releases[-1]} give the same verdict", flush=True)
        return 1
    older, newer = boundary
    print(f"boundary: {args.package} {older.version} gives {older.verdict}, {newer.version} gives {newer.verdict}",
          flush=True)
    return 0

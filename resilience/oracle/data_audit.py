"""The data audit: which samples the job trained, per epoch, against the reference run.

Every rank's ``loss`` event carries ``samples``: the dataset indices of the batch it trained in
that step, read from the batch itself (`Workload.consumed_samples`). The job's training history
is the first run's steps up to the restored step followed by the restart's steps after it (what
the restored state went on from); the reference run's steps are the expected history. Epochs are
cut where the reference's sample stream repeats a sample, so no loop's epoch counter is trusted.
A sample trained twice or never within an epoch is named by its positions in the reference's
order of that epoch ("positions 96..119 of epoch 0"), with the first few dataset indices.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..core.events import Event
from ..core.records import PhaseResult, PhaseStatus

SHOWN = 4  # dataset indices quoted per finding


def step_samples(phase: PhaseResult) -> dict[int, list[int]] | None:
    """step -> the samples all ranks trained in it (rank order; a sample that several ranks of a
    model-parallel group train together counts once), or None where a step lacks them on a rank."""
    by_step: dict[int, dict[int, list[int]]] = {}
    for record in phase.ranks:
        for event in record.events:
            if event["event"] == Event.LOSS:
                if "samples" not in event:
                    return None
                by_step.setdefault(event["step"], {})[record.rank] = event["samples"]
    merged = {}
    for step, ranks in by_step.items():
        if len(ranks) != phase.world_size:
            return None
        merged[step] = list(dict.fromkeys(s for rank in sorted(ranks) for s in ranks[rank]))
    return merged


def epochs_of(reference: dict[int, list[int]]) -> list[tuple[list[int], list[int]]]:
    """The reference's epochs as (steps, samples in order): a new epoch starts at the first step
    that repeats a sample of the current one."""
    epochs: list[tuple[list[int], list[int]]] = []
    seen: set[int] = set()
    for step in sorted(reference):
        samples = reference[step]
        if not epochs or seen.intersection(samples):
            epochs.append(([], []))
            seen = set()
        epochs[-1][0].append(step)
        epochs[-1][1].extend(samples)
        seen.update(samples)
    return epochs


def spans(positions: Iterable[int]) -> str:
    """0, 1, 2, 5 -> '0..2, 5'."""
    out: list[str] = []
    for position in sorted(positions):
        if out and out[-1][1] == position - 1:
            out[-1] = (out[-1][0], position)
        else:
            out.append((position, position))
    return ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in out)


def audit(reference: PhaseResult, runs: list[PhaseResult], restored_steps: list[int]) -> list[str]:
    """SILENT findings: the samples of each reference epoch that the job trained twice or never,
    and those it trained in that epoch's steps although the reference's epoch does not hold them.
    ``runs``: the first run and every launch after it; ``restored_steps``: the step each launch
    after the first restored. Empty where a run did not record its samples or the last launch did
    not complete."""
    expected, launches = step_samples(reference), [step_samples(run) for run in runs]
    if expected is None or None in launches or runs[-1].status != PhaseStatus.COMPLETED:
        return []
    history: dict[int, list[int]] = {}  # what each restored state went on from: later launches win
    for samples, restored_step in zip(launches, [0, *restored_steps], strict=True):
        history = {step: s for step, s in history.items() if step <= restored_step}
        history.update({step: s for step, s in samples.items() if step > restored_step})
    if not set(expected) <= set(history):
        return []
    found = []
    for epoch, (steps, order) in enumerate(epochs_of(expected)):
        trained = Counter(s for step in steps for s in history[step])
        position = {sample: index for index, sample in enumerate(order)}
        twice = [s for s in order if trained[s] > 1]
        never = [s for s in order if trained[s] == 0]
        foreign = sorted(s for s in trained if s not in position)
        where = (f"after the restore at step {restored_steps[0]}" if len(restored_steps) == 1 else
                 f"after the restores at steps {', '.join(map(str, restored_steps))}")
        for samples, what in ((twice, "were trained twice"), (never, "were never trained")):
            if samples:
                found.append(f"data: {where}, {len(samples)} samples at positions "
                             f"{spans(position[s] for s in samples)} of epoch {epoch} {what} "
                             f"(dataset indices {', '.join(map(str, samples[:SHOWN]))}"
                             f"{', ...' if len(samples) > SHOWN else ''})")
        if foreign:
            found.append(f"data: {where}, {len(foreign)} samples trained in epoch {epoch}'s steps "
                         f"{steps[0]}..{steps[-1]} are not among those the reference trained in them (dataset "
                         f"indices {', '.join(map(str, foreign[:SHOWN]))}{', ...' if len(foreign) > SHOWN else ''})")
    return found

"""The fallback for a save too large to enumerate: Hypothesis draws crash points, steered towards
states whose restore takes the newest step, and shrinks a failure to the smallest crash state
that still gives it (docs/exploration.md)."""
from __future__ import annotations

from collections.abc import Callable

from ..disk.crash_states import BLOCK, HOW, CrashModel, CrashPoint, Loss

# A lost writeback is drawn as one or two 4 KiB blocks: wider holes hit a zip header more often,
# which torch.load refuses, and tell less about whether a reader notices a hole.
MAX_ZERO_BLOCKS = 2


class WorseThanExpected(Exception):
    def __init__(self, state):
        super().__init__(state.verdict.kind.value)
        self.state = state


def crash_points(model: CrashModel):
    """The Hypothesis strategy of crash points of ``model``'s save; simplest first (shrinks to
    early cuts, nothing lost)."""
    from hypothesis import strategies as st

    boundaries = model.boundaries()

    @st.composite
    def draw_point(draw) -> CrashPoint:
        # integers, not sampled_from: Hypothesis draws the ends (no op done, every op done) often
        cuts = model.cuts_at(boundaries[draw(st.integers(0, len(boundaries) - 1))])
        volatile = model.volatile(cuts)
        lost_metadata = draw(st.integers(0, len(volatile.metadata)))
        dirty = {path: (unsynced, size) for path, unsynced, size in volatile.dirty}
        if draw(st.booleans()):  # every file draws its own fate, as after a real power cut
            fates = [(path, draw(st.sampled_from(HOW))) for path in dirty]
        else:  # one or two files lose data, the rest reach the disk: what shrinking ends on
            lossy = draw(st.lists(st.sampled_from(list(dirty)), unique=True, max_size=2)) if dirty else []
            fates = [(path, draw(st.sampled_from(HOW[1:]))) for path in dirty if path in lossy]
        losses = []
        for path, how in fates:
            unsynced, size = dirty[path]
            if how == "prefix" and unsynced:
                losses.append(Loss(path, how, keep_bytes=draw(st.integers(0, unsynced - 1))))
            elif how == "zeros" and size:
                blocks = (size + BLOCK - 1) // BLOCK
                first = draw(st.integers(0, blocks - 1))
                count = draw(st.integers(1, min(MAX_ZERO_BLOCKS, blocks - first)))
                losses.append(Loss(path, how, zero_from=first * BLOCK, zero_to=min(size, (first + count) * BLOCK)))
            elif how == "drop":
                losses.append(Loss(path, how))
        return CrashPoint(cuts=cuts, lost_metadata=lost_metadata, losses=tuple(losses))

    return draw_point()


def search(model: CrashModel, evaluate: Callable, worse: Callable, examples: int, derandomize: bool,
           on_failure: Callable[[], None]) -> tuple[object | None, int]:
    """Run the Hypothesis search: ``evaluate(point)`` gives a state's result (None past the
    budget), ``worse(state)`` whether it fails. Returns the shrunk failing state (or None) and
    how many points were drawn."""
    from hypothesis import HealthCheck, Phase, assume, given, settings, target
    from hypothesis.errors import Unsatisfiable

    draws = [0]

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              phases=(Phase.generate, Phase.target, Phase.shrink), print_blob=False)
    @given(crash_points(model))
    def property_holds(point: CrashPoint) -> None:
        draws[0] += 1
        state = evaluate(point)
        assume(state is not None)
        # Steer towards states the restore takes for the newest save: there a torn file
        # is either noticed or loaded as if whole.
        target(float(state.verdict.restored_step or 0), label="restored step")
        if worse(state):
            on_failure()
            raise WorseThanExpected(state)

    try:
        property_holds()
    except WorseThanExpected as failure:
        return failure.state, draws[0]
    except Unsatisfiable:  # the budget was spent before Hypothesis drew a state of its own
        pass
    return None, draws[0]

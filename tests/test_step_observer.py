"""Black-box mode's view of an unmodified loop (`rank.step_observer`), in this process: losses from
autograd's entry point, step boundaries from torch's optimizer step hooks, state digests; and the
oracle that reads them (`oracle.blackbox`): the restored step by digest, what was not restored,
a checkpoint overwritten in place."""
import pytest
import torch

from resilience.core.case import VerdictKind
from resilience.oracle.blackbox import RankLog, judge_logs, restored_steps
from resilience.rank.step_observer import StepObserver


@pytest.fixture
def observed(monkeypatch):
    """An observer installed for one test (torch's hooks removed and backward restored after it)."""
    import torch.optim.optimizer as optimizer_module

    monkeypatch.setattr(torch.autograd, "backward", torch.autograd.backward)
    monkeypatch.setattr(torch.optim.Optimizer, "load_state_dict", torch.optim.Optimizer.load_state_dict)
    monkeypatch.setattr(optimizer_module, "_global_optimizer_pre_hooks", optimizer_module.OrderedDict())
    monkeypatch.setattr(optimizer_module, "_global_optimizer_post_hooks", optimizer_module.OrderedDict())
    events, places = [], []
    observer = StepObserver(lambda name, **fields: events.append((name, fields)),
                            lambda phase, step: places.append((phase, step)),
                            lambda step: places.append(("returned", step)))
    observer.install()
    return events, places


def train(steps, accumulation=1, second_optimizer=False, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1) if second_optimizer else None
    for _ in range(steps):
        for _ in range(accumulation):
            (model(torch.randn(2, 4)).pow(2).mean() / accumulation).backward()
        optimizer.step()
        if other is not None:
            other.step()  # no backward of its own: the same step
        optimizer.zero_grad()


def test_each_optimizer_step_after_a_backward_is_one_step_with_its_losses_and_digest(observed):
    events, places = observed
    train(3, accumulation=2, second_optimizer=True)
    steps = [fields for name, fields in events if name == "observed_step"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(len(s["micro_losses"]) == 2 and s["loss"] == sum(s["micro_losses"]) for s in steps)
    assert set(steps[0]["digest"]) >= {"parameters", "optimizer", "torch_rng", "python_rng"}
    assert steps[0]["digest"]["parameters"] != steps[1]["digest"]["parameters"]
    assert places == [("train", 1), ("save", 1), ("returned", 1), ("train", 2), ("save", 2),
                      ("returned", 2), ("train", 3), ("save", 3)]


def test_the_same_loop_twice_digests_the_same_and_a_non_scalar_backward_is_not_a_loss(observed):
    events, _ = observed
    train(2)
    torch.ones(2, requires_grad=True).mul(2).backward(torch.ones(2))  # no loss: not counted
    train(2)
    steps = [fields for name, fields in events if name == "observed_step"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert steps[0]["digest"] == steps[2]["digest"] and steps[1]["loss"] == steps[3]["loss"]


DIGESTS = {step: {"parameters": f"p{step}", "optimizer": f"o{step}", "torch_rng": f"r{step}"} for step in (1, 2, 3, 4)}


AFTER = {step: {"parameters": f"p{step + 1}", "optimizer": f"o{step + 1}"} for step in (1, 2, 3, 4)}


def log(rank, observed=None, digests=None, written=(), saved=(), errors=(), fault_events=(), after=None):
    """A rank's log; with ``digests``, the states after each step too (those of the next step's start)."""
    return RankLog(rank, {}, tuple(saved), (), tuple(errors), tuple(fault_events), dict(observed or {}),
                   dict(digests or {}), tuple(written), dict(AFTER if after is None and digests is DIGESTS else {}))


LOSSES = {1: 0.5, 2: 0.4, 3: 0.3, 4: 0.2}


def test_the_restored_step_is_the_one_whose_parameters_match_and_a_stream_not_restored_is_named():
    reference = [log(0, LOSSES, DIGESTS), log(1, LOSSES, DIGESTS)]
    resumed = {1: dict(DIGESTS[3], torch_rng="r1"), 2: DIGESTS[4]}
    restore = restored_steps(reference, [], [log(0, {1: 0.3, 2: 0.2}, resumed)])
    assert restore.steps == {0: 2}
    assert restore.notes == ("rank 0: parameters restored at step 2; not restored: torch's RNG stream "
                             "(it is the one of step 0)",)
    unknown = restored_steps(reference, [], [log(0, {1: 0.3}, {1: dict(DIGESTS[3], parameters="x")})])
    assert unknown.steps == {} and "match no step" in unknown.silent[0]


def test_each_rank_is_judged_against_its_own_reference_and_an_overwritten_checkpoint_is_named():
    other = {step: loss + 1 for step, loss in LOSSES.items()}  # rank 1 logs its own loss
    written = [("ckpt.pt", 2, "save")]
    reference = [log(0, LOSSES, DIGESTS, written, saved=[2, 4]), log(1, other, DIGESTS)]
    first = [log(0, {1: 0.5, 2: 0.4}, DIGESTS, written, saved=[2]), log(1, {1: 1.5, 2: 1.4}, DIGESTS)]
    restart = [log(0, {1: 0.3, 2: 0.2}, {1: DIGESTS[3]}), log(1, {1: 1.3, 2: 1.2}, {1: DIGESTS[3]})]
    verdict = judge_logs(reference, first, restart, None)
    assert verdict.kind is VerdictKind.RECOVERED and verdict.restored_step == 2, verdict.findings
    torn = [log(0, {1: 0.5, 2: 0.4}, DIGESTS, written + [("ckpt.pt", 4, "save")], saved=[2]), first[1]]
    error = {"event": "error", "rank": 0, "type": "RuntimeError", "message": "failed finding central directory",
             "time": 20.0}
    verdict = judge_logs(reference, torn, [log(0, errors=[error]), log(1)], None)
    assert verdict.kind is VerdictKind.LOUD
    assert ("the newest complete checkpoint (step 2) was overwritten in place by the save of step 4 (ckpt.pt)"
            in verdict.findings[-1])


def test_a_restart_that_trains_no_step_is_judged_by_the_state_it_loaded():
    """A power cut after the final save: the restart comes back at the run's last step and ends,
    or at an older one and ends too (the step it is given says so), found from the loaded state."""
    import dataclasses

    reference = [log(0, LOSSES, DIGESTS, saved=[2, 4]), log(1, LOSSES, DIGESTS)]
    first = [log(0, LOSSES, DIGESTS, saved=[2]), log(1, LOSSES, DIGESTS)]  # the step-4 save never returned
    at_the_end = [dataclasses.replace(log(rank), state_at_exit=AFTER[4]) for rank in (0, 1)]
    verdict = judge_logs(reference, first, at_the_end, None)
    assert verdict.kind is VerdictKind.RECOVERED and verdict.restored_step == 4, verdict.findings
    assert any("the restart trained no step" in line for line in verdict.findings)
    assert any("accepted only because its parameter and optimizer digests are that step's, the run's last" in line
               for line in verdict.findings)
    older = [dataclasses.replace(log(rank), state_at_exit=AFTER[2]) for rank in (0, 1)]
    verdict = judge_logs(reference, first, older, None)
    assert verdict.kind is VerdictKind.SILENT and verdict.restored_step == 2
    assert "the restarted job ended at step 2 without an error" in verdict.findings[0]


def test_an_optimizer_loaded_before_any_step_is_digested_at_exit_and_forgotten_once_one_runs(observed):
    events, _ = observed
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    after_step = [fields["digest"] for name, fields in events if name == "step_done"]
    saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    restarted = []  # a restarted rank's observer: it loads the checkpoint and ends without a step
    fresh = StepObserver(lambda name, **fields: restarted.append((name, fields)), lambda *a: None, lambda s: None)
    fresh.install()
    model, optimizer = torch.nn.Linear(2, 1), None
    model.load_state_dict(saved["model"])
    optimizer = torch.optim.AdamW(model.parameters())
    optimizer.load_state_dict(saved["optimizer"])
    fresh.exiting()
    assert [fields["digest"] for name, fields in restarted if name == "state_at_exit"] == after_step
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()  # a step ran: its digests say what was restored, nothing at exit
    fresh.exiting()
    assert [name for name, _ in restarted].count("state_at_exit") == 1


def test_the_restore_s_reads_are_on_record_and_cross_checked_with_the_saves_that_wrote_them():
    from resilience.oracle.blackbox import RankLog, read_notes

    first = [RankLog.from_events(0, [{"event": "file_written", "file": "ckpt.pt", "step": step, "phase": "save"}
                                     for step in (4, 8)])]
    restart = [RankLog.from_events(0, [{"event": "file_read", "file": "ckpt.pt"}])]
    assert read_notes(first, restart, 8) == ["read before its first step: ckpt.pt (step 8)"]
    assert read_notes(first, restart, 4)[1] == ("the restart's state is that of step 4, yet the files it read were "
                                                "last written by the save of step 8")
    nothing = [RankLog.from_events(0, [])]
    assert "memory-mapped reads" in read_notes(first, nothing, 4)[0]


def test_a_sample_of_crash_states_spreads_from_the_first_to_the_last():
    from resilience.run.script_explore import spread

    assert spread(list(range(25)), 10) == [0, 3, 5, 8, 11, 13, 16, 19, 21, 24]
    assert spread(list(range(8)), 10) == list(range(8))  # fewer than the budget: every one
    assert spread(list(range(3)), 1) == [0]

"""Topology fuzzing: the fast tier over restore models, the process tier over real ranks, the CLI."""
from __future__ import annotations

import pytest
import yaml
from hypothesis import settings

from resilience.commands.cli import main
from resilience.core.case import VerdictKind
from resilience.core.topology import Topology
from resilience.fuzz.models import model_for, verdict
from resilience.fuzz.search import process_property, run_fast, scenario_document
from resilience.run.harness import Harness
from resilience.scenario.loader import load_document

LOCAL_RANK_BUG = "tests.strategies_under_test:LoadsByLocalRank"


def factory(strategy, **options):
    return lambda distinct: model_for(strategy, distinct, options)


def test_a_strategy_loading_by_local_rank_is_caught_and_shrunk_to_two_ranks():
    found, checked, _ = run_fast(factory(LOCAL_RANK_BUG), "shared")
    assert found is not None and found.verdict is VerdictKind.SILENT
    assert (found.save.world_size, found.restart.world_size, found.restart.nodes) == (2, 2, 2)
    assert found.save.nodes == 1 and checked > 0


def test_megatron_never_restores_silently_on_shared_storage_in_thousands_of_rank_maps():
    found, checked, seconds = run_fast(factory("megatron", data_parallel_random_init=True), "shared")
    assert found is None, str(found)
    assert checked >= 10_000  # the ci profile: 300 examples of 256 restart topologies
    print(f"megatron: {checked} save/restart pairs in {seconds:.1f} s")


def test_known_weaknesses_of_the_naive_schemes_are_found():
    per_rank, _, _ = run_fast(factory("torch.per_rank"), None)
    assert per_rank is not None and per_rank.save.storage == "node_local"
    rank0, _, _ = run_fast(factory("torch.rank0"), "shared")
    assert rank0 is not None and rank0.save.tp == 2 and rank0.save.world_size == 2
    megatron, _, _ = run_fast(factory("megatron"), "shared")  # RNG of DP rank 0 only, without random init
    assert megatron is not None and megatron.distinct_streams and megatron.restart.dp == 2


def test_the_restore_model_agrees_with_the_real_strategy_on_the_shrunk_counterexample(tmp_path):
    save = Topology(tp=2, pp=1, dp=1, node_ids=(0,))
    restart = Topology(tp=2, pp=1, dp=1, node_ids=(0, 1))
    predicted, _ = verdict(save, restart, model_for(LOCAL_RANK_BUG))
    document = scenario_document(LOCAL_RANK_BUG, {}, save, restart, False, "the shrunk counterexample")
    result = Harness(work_root=tmp_path).run(load_document(document, "tests/fuzz.scenario.yaml").cases[0])
    assert predicted is VerdictKind.SILENT and result.verdict.kind is VerdictKind.SILENT


@pytest.mark.slow
def test_process_tier_runs_megatron_in_real_ranks_and_matches_the_model(tmp_path):
    verdicts = []

    def run(document):
        case = load_document(document, "tests/fuzz.scenario.yaml").cases[0]
        kind = Harness(work_root=tmp_path).run(case).verdict.kind
        verdicts.append(kind)
        return kind

    test = process_property("megatron", {"data_parallel_random_init": True},
                            factory("megatron", data_parallel_random_init=True), run, max_world=4)
    settings(settings.get_profile("ci"), max_examples=2)(test)()
    assert len(verdicts) == 2 and set(verdicts) <= {VerdictKind.RECOVERED, VerdictKind.LOUD}


def test_cli_writes_a_replayable_scenario(tmp_path, capsys):
    assert main(["fuzz", "--strategy", LOCAL_RANK_BUG, "--storage", "shared", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "counterexample: SILENT" in out and "replay: python -m resilience run" in out
    (written,) = tmp_path.glob("*.scenario.yaml")
    case = load_document(yaml.safe_load(written.read_text()), str(written)).cases[0]
    assert case.placement.world_size == 2 and case.restart.placement.nodes == 2


def test_cli_refuses_the_fast_tier_for_a_strategy_without_a_restore_model(capsys):
    assert main(["fuzz", "--strategy", "deepspeed.zero1"]) == 2
    assert "has no restore model" in capsys.readouterr().out

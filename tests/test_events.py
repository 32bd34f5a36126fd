"""Event files followed while they grow: what a supervisor sees equals what a whole read sees."""
from __future__ import annotations

import json

from resilience.core.events import EventFollower, EventLog, read_events


def test_the_follower_reads_appended_events_once_and_a_line_only_once_complete(tmp_path):
    paths = [tmp_path / "rank0.events.jsonl", tmp_path / "rank1.events.jsonl"]
    follow = EventFollower(lambda: paths)
    assert follow() == []  # no file yet
    first = EventLog(paths[0], 0)
    first.emit("phase_begin")
    first.emit("loss", step=1, loss=0.5)
    assert [e["event"] for e in follow()] == ["phase_begin", "loss"]
    with open(paths[1], "a", encoding="utf-8") as f:  # a line still being written
        f.write(json.dumps({"event": "fault_fired", "rank": 1})[:-3])
    assert len(follow()) == 2
    with open(paths[1], "a", encoding="utf-8") as f:
        f.write('1}\n{"event": "done", "rank": 1}\n')
    first.emit("done")
    events = follow()
    assert sorted(e["event"] for e in events) == ["done", "done", "fault_fired", "loss", "phase_begin"]
    assert follow() == events  # nothing new, nothing read twice
    whole = [e for path in paths for e in read_events(path)]
    assert sorted(map(json.dumps, events)) == sorted(map(json.dumps, whole))
    first.close()


def test_a_killed_ranks_cut_last_line_is_skipped_as_a_whole_read_skips_it(tmp_path):
    path = tmp_path / "rank0.events.jsonl"
    path.write_text('{"event": "phase_begin", "rank": 0}\n{"event": "lo\n{"event": "done", "rank": 0}\n')
    assert [e["event"] for e in EventFollower(lambda: [path])()] == ["phase_begin", "done"]
    assert [e["event"] for e in read_events(path)] == ["phase_begin", "done"]

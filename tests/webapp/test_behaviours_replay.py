"""A reward replay seen through a behaviour: the replayed advantages of its rollouts, before and
after, through the API and on the replay page."""

from __future__ import annotations

from tests.webapp import replay_fixtures as fx
from webapp.behaviours import services


def test_it_reports_how_a_replay_changes_a_behaviours_advantages(api, client_as, personas):
    from webapp.replays import services as replays

    run = fx.diagram_run(personas["trainer"])
    fx.ingest(
        run,
        [
            fx.group_record(s, f"g{s}", [fx.EXTRA_NODE, fx.MISSING_EDGE, fx.MISSING_NODE, fx.PROSE])
            for s in range(4)
        ],
    )
    b = services.define(run.environment, name="adds a monitor", query={"q": "monitor"})
    replay = replays.create_replay(
        run,
        {"versions": [{"version": "semantic_coverage@no_extras"}], "selection": {"mode": "all"}},
    )
    replays.work(replay.id, "test-worker")
    doc = api(personas["viewer"]).get(f"/api/v1/replays/{replay.id}/behaviours/").json()
    (row,) = doc["behaviours"]
    assert row["behaviour"] == b.id and row["matches"] == 4 and row["replayed"] == 16
    assert row["advantage"]["before"] > 0 and row["advantage"]["after"] < row["advantage"]["before"]
    assert row["summary"].startswith("'adds a monitor': mean advantage of its 4 replayed rollouts")
    page = client_as("viewer").get(f"/behaviours/replays/{replay.id}/").content.decode()
    assert 'id="replay-behaviour-table"' in page and "adds a monitor" in page

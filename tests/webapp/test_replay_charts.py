"""Replay chart dicts: every name escaped, histogram bins are categories (a
click never navigates)."""

from webapp.replays import charts


def _row(name, replayed=True, weight=1.0):
    side = {"mean": 0.5, "within_std": 0.1, "zero_std_frac": 0.2, "share": 0.5}
    return {
        "name": name,
        "replayed": replayed,
        "weight": weight,
        "old": side,
        "new": side,
        "hist": {"edges": [0.0, 0.5, 1.0], "old": [1, 2], "new": [2, 1]},
    }


def test_it_escapes_component_names_everywhere_in_the_figures():
    hostile = '<img src=x onerror="alert(1)">'
    figs = charts.figures({"components": [_row(hostile), _row("aggregate reward", weight=None)]})
    text = repr(figs)
    assert "<img" not in text and '&lt;img src=x onerror="alert(1)"&gt;' in text
    assert set(figs) == {"share", "zero-std", "within-std", "hist-0", "hist-1"}
    assert figs["hist-0"]["data"][0]["x"] == ["0.00–0.50", "0.50–1.00"]
    assert [t["x"] for t in figs["share"]["data"]] == [['&lt;img src=x onerror="alert(1)"&gt;']] * 2
    assert figs["hist-0"]["layout"]["title"]["text"].startswith("&lt;img")

"""Property-based fuzzing of the write API: POST /api/v1/runs/{id}/groups/, /metrics/ and /runs/.

Every generated body goes through DRF with a real token, in process. For each case:
- never a 500 (the test client re-raises a view's exception, so a crash fails the case loudly);
- a refusal is a 4xx whose errors each name a field ("body" for what is not even JSON);
- a refused batch stores nothing at all, even when all but one of its groups were valid (row counts
  of Group / Rollout / RewardScore / GroupComponentStat / StepMetric / Run before and after);
- an accepted batch stores exactly what the response says, and the explorer can read it back.

Bodies: random JSON, and valid batches with exactly one mutation (wrong types, NaN / Infinity
tokens, 1e309, 20-digit and 5000-digit integers, negative and duplicate indexes, unknown components,
nesting 100k deep, 10k-character keys, NUL bytes and lone surrogates, missing and extra fields,
...). The number of malformed cases each test generated is asserted and written to
test-artifacts/fuzz_counts.json.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training.records import GROUP_FIELDS, ROLLOUT_FIELDS

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("correct", "format", "penalty")  # the env3 fixture's components
FUZZ = settings(
    deadline=None,
    database=None,
    print_blob=True,  # derandomize: the CI profile
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
TALLY: Counter = Counter()  # test name -> malformed (4xx) cases, accumulated over the examples
_fresh = itertools.count()

TABLES = (
    "rollouts_group",
    "rollouts_rollout",
    "rollouts_rewardscore",
    "rollouts_groupcomponentstat",
    "runs_stepmetric",
    "runs_run",
    "rollouts_rewardcomponent",
    "rollouts_environment",
)


def counts() -> tuple[int, ...]:
    """Every table the write API touches, in one round trip."""
    with connection.cursor() as cur:
        cur.execute("SELECT " + ", ".join(f"(SELECT COUNT(*) FROM {t})" for t in TABLES))
        return tuple(cur.fetchone())


def _record(name: str, n: int) -> None:
    TALLY[name] += n
    out = ROOT / "test-artifacts" / "fuzz_counts.json"
    out.parent.mkdir(exist_ok=True)
    try:
        saved = json.loads(out.read_text())
    except (OSError, ValueError):
        saved = {}
    saved[name] = TALLY[name]
    out.write_text(json.dumps(saved, indent=1, sort_keys=True))


# --------------------------------------------------------------------------------------- strategies

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
random_json = st.recursive(
    json_scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20,
)
# Values that are the wrong type for nearly every field (some are right for a few:
# the response decides).
wrong_values = st.sampled_from(
    [
        None,
        True,
        False,
        -1,
        0,
        2**31,
        2**63,
        1.5,
        -0.0,
        "",
        "x",
        "12",
        [],
        [1],
        {},
        {"a": 1},
        [{"role": "user"}],
        {"value": "1"},
    ]
)
weird_text = st.sampled_from(
    [
        "\x00",
        "a\x00b",
        "\ud800",
        "x\udfffy",
        "\u202e\u200b",
        "😀" * 50,
        "\n\r\t",
        "' OR 1=1 --",
        "<script>alert(1)</script>",
        "%s%n",
        "\\u0000",
        "NaN",
        "k" * 10_000,
    ]
)


@st.composite
def valid_rollout(draw: Any, index: int) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(COMPONENTS), unique=True, max_size=3))
    rewards: dict[str, Any] = {}
    for n in names:
        v = draw(st.one_of(st.floats(-1, 1, allow_nan=False), st.none(), st.integers(-3, 3)))
        rewards[n] = {"value": v, "reason": draw(st.text(max_size=5))} if draw(st.booleans()) else v
    r: dict[str, Any] = {"index": index, "rewards": rewards}
    if draw(st.booleans()):
        r["completion"] = draw(st.text(max_size=30))
    else:
        reply = draw(st.text(max_size=20))
        r["transcript"] = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": reply},
        ]
    if draw(st.booleans()):
        r["length"] = draw(st.integers(0, 4096))
    return r


@st.composite
def valid_batch(draw: Any) -> dict[str, Any]:
    groups = []
    for gi in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 4))
        groups.append(
            {
                "step": draw(st.integers(0, 50)),
                "key": f"k{gi}",
                "prompt": draw(st.sampled_from(["Solve it", [{"role": "user", "content": "hi"}]])),
                "rollouts": [draw(valid_rollout(i)) for i in range(n)],
            }
        )
    return {"groups": groups}


REQUIRED = {
    "group": ("step", "key", "prompt", "rollouts"),
    "rollout": ("index", "completion", "transcript"),
}


# One function per mutation: each edits the drawn batch, group `g` or rollout `r` in place and may
# add raw text substitutions (tokens JSON cannot carry) to `raw`.


def _wrong_type(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    where = draw(st.sampled_from([g, r, body]))
    fields = GROUP_FIELDS if where is g else ROLLOUT_FIELDS if where is r else ("groups",)
    where[draw(st.sampled_from(fields))] = draw(wrong_values)


def _nan_token(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    token = draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
    target = draw(st.sampled_from(["reward", "advantage", "rewards", "step"]))
    if target == "rewards":
        r["rewards"]["correct"] = "__TOKEN__"
    elif target == "step":
        g["step"] = "__TOKEN__"
    else:
        r[target] = "__TOKEN__"
    raw['"__TOKEN__"'] = token


def _huge_number(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    value = draw(
        st.sampled_from(
            [
                "1e309",
                "-1e309",
                "1e308",
                "-1e308",
                "4e307",
                "123456789012345678901",
                "9" * 5000,
                "1" + "0" * 400 + ".5",
                "5e-324",
            ]
        )
    )
    target = draw(st.sampled_from(["step", "index", "length", "reward", "advantage", "rewards"]))
    if target == "step":
        g["step"] = "__NUM__"
    elif target == "rewards":
        r["rewards"]["format"] = "__NUM__"
    else:
        r[target] = "__NUM__"
    raw['"__NUM__"'] = value


def _negative(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    target = draw(st.sampled_from(["step", "index", "length"]))
    (g if target == "step" else r)[target] = -draw(st.integers(1, 2**40))


def _duplicate_index(
    draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]
) -> None:
    g["rollouts"].append(dict(g["rollouts"][0]))


def _duplicate_key(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    body["groups"].append(json.loads(json.dumps(g)))


def _unknown_component(
    draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]
) -> None:
    r["rewards"][draw(st.sampled_from(["nope", "", "correct ", "CORRECT", "x" * 300]))] = 0.5


def _deep_prompt(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    g["prompt"] = "__DEEP__"
    depth = draw(st.sampled_from([64, 500, 990, 5_000, 100_000]))
    raw['"__DEEP__"'] = "[" * depth + "]" * depth


def _long_key(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    target = draw(st.sampled_from(["group_key", "component", "extra"]))
    long = "k" * 10_000
    if target == "group_key":
        g["key"] = long
    elif target == "component":
        r["rewards"][long] = 1.0
    else:
        r[long] = 1  # an unknown field: ignored, the batch stays valid


def _weird_text(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    text = draw(weird_text)
    target = draw(
        st.sampled_from(
            [
                "prompt",
                "key",
                "completion",
                "finish_reason",
                "parse_error",
                "reason",
                "state",
                "tool_name",
            ]
        )
    )
    if target in ("prompt", "key"):
        g[target] = text
    elif target == "completion":
        r.pop("transcript", None)
        r["completion"] = text
    elif target == "reason":
        r["rewards"]["correct"] = {"value": 1.0, "reason": text}
    elif target == "state":
        r["state"] = {text: [text]}
    elif target == "tool_name":
        r.pop("completion", None)
        r["transcript"] = [{"role": "tool", "name": text, "content": text}]
    else:
        r[target] = text


def _missing_field(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    level = draw(st.sampled_from(["group", "rollout"]))
    target = g if level == "group" else r
    for f in REQUIRED[level]:
        if f in target and draw(st.booleans()):
            del target[f]
    if level == "group" and all(f in g for f in REQUIRED["group"]):
        del g["key"]
    if level == "rollout" and "index" in r and ("completion" in r or "transcript" in r):
        del r["index"]


def _extra_field(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    where = draw(st.sampled_from([g, r, body]))
    where[draw(st.text(min_size=1, max_size=12))] = draw(random_json)


def _partial_advantage(
    draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]
) -> None:
    g["rollouts"].append({"index": 99, "completion": "x"})
    g["rollouts"][0]["advantage"] = 0.5


def _not_a_list(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    g["rollouts"] = draw(st.sampled_from([[], {}, "r", None, [None], [[]], [1]]))


def _bad_role(draw: Any, body: dict[str, Any], g: dict, r: dict, raw: dict[str, str]) -> None:
    r.pop("completion", None)
    r["transcript"] = [
        {"role": draw(st.sampled_from(["hacker", "", None, 1, "USER"])), "content": "x"}
    ]


MUTATE = {
    "wrong_type": _wrong_type,
    "nan_token": _nan_token,
    "huge_number": _huge_number,
    "negative": _negative,
    "duplicate_index": _duplicate_index,
    "duplicate_key": _duplicate_key,
    "unknown_component": _unknown_component,
    "deep_prompt": _deep_prompt,
    "long_key": _long_key,
    "weird_text": _weird_text,
    "missing_field": _missing_field,
    "extra_field": _extra_field,
    "partial_advantage": _partial_advantage,
    "not_a_list": _not_a_list,
    "bad_role": _bad_role,
}


@st.composite
def mutated_batch(draw: Any) -> tuple[dict[str, Any], dict[str, str], str]:
    """A valid batch, then exactly one mutation. Returns (body, raw text substitutions, label)."""
    body = draw(valid_batch())
    kind = draw(st.sampled_from(list(MUTATE)))
    g = draw(st.sampled_from(body["groups"]))
    r = draw(st.sampled_from(g["rollouts"]))
    raw: dict[str, str] = {}
    MUTATE[kind](draw, body, g, r, raw)
    return body, raw, kind


def _serialise(body: Any, raw: dict[str, str]) -> bytes:
    for grp in (
        body.get("groups", [])
        if isinstance(body, dict) and isinstance(body.get("groups"), list)
        else []
    ):
        if isinstance(grp, dict) and isinstance(grp.get("key"), str):
            grp["key"] = (
                # Fresh keys: a stored group never hides a partial write
                f"{next(_fresh)}-{grp['key']}"
            )
    text = json.dumps(body, ensure_ascii=True)
    for placeholder, token in raw.items():
        text = text.replace(placeholder, token)
    return text.encode()


# ------------------------------------------------------------------------------------------- checks


def check_case(client: Any, url: str, data: bytes, name: str, readback: str | None = None) -> int:
    """POST one body; assert the invariants. Returns 1 when the body was refused
    (a malformed case)."""
    before = counts()
    res = client.post(url, data=data, content_type="application/json")
    after = counts()
    assert res.status_code < 500, res.content[:500]
    if res.status_code >= 400:
        assert res.status_code in (400, 413), (res.status_code, res.content[:300])
        errors = res.json()["errors"]
        assert errors and all(isinstance(e.get("field"), str) and e["field"] for e in errors), (
            errors[:3]
        )
        assert after == before, f"a refused body changed the database: {before} -> {after}"
        return 1
    out = res.json()
    if "groups" in out and "rollouts" in out:
        assert after[0] - before[0] == out["groups"] and after[1] - before[1] == out["rollouts"], (
            out,
            before,
            after,
        )
    if readback:
        assert client.get(readback).status_code == 200
    return 0


@pytest.fixture
def trainer_api(api, personas):
    return api(personas["trainer"])


@settings(FUZZ, max_examples=400)
@given(case=mutated_batch())
def test_it_refuses_every_mutated_batch_whole_and_names_the_field(trainer_api, run, case):
    body, raw, kind = case
    malformed = check_case(
        trainer_api,
        f"/api/v1/runs/{run.id}/groups/",
        _serialise(body, raw),
        kind,
        readback=f"/api/v1/runs/{run.id}/rollouts/?sort=reward&limit=5",
    )
    TALLY[f"groups:{kind}:{'refused' if malformed else 'accepted'}"] += 1
    _record("groups_mutated", malformed)


def test_it_generated_enough_malformed_batches():
    # Runs after the property test above (file order); guards against a strategy that
    # quietly went valid.
    if TALLY["groups_mutated"] == 0:
        pytest.skip("the mutated-batch property test did not run in this session")
    assert TALLY["groups_mutated"] >= 250, dict(TALLY)
    refused_kinds = {
        k.split(":")[1] for k in TALLY if k.startswith("groups:") and k.endswith(":refused")
    }
    assert len(refused_kinds) >= 10, (
        refused_kinds
    )  # hypothesis need not draw every kind each session


raw_bodies = st.one_of(
    random_json.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"{",
            b"null",
            b"NaN",
            b'{"groups": NaN}',
            b'{"groups": [Infinity]}',
            b"\xff\xfe",
            b'{"groups": [' + b"[" * 50_000 + b"]" * 50_000 + b"]}",
            b'{"groups": 1' + b"0" * 6000 + b"}",
            b'{"groups": "\\ud800"}',
            b'{"groups": [{"key": "\\u0000"}]}',
            b'{"a":1,"a":2}',
        ]
    ),
)


@settings(FUZZ, max_examples=150)
@given(data=raw_bodies)
def test_it_answers_random_bodies_with_a_field_error(trainer_api, run, data):
    _record(
        "groups_random", check_case(trainer_api, f"/api/v1/runs/{run.id}/groups/", data, "random")
    )


metric_bodies = st.one_of(
    random_json.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda step, name, v: json.dumps(
            {"metrics": [{"step": step, "values": {name: v}}]}
        ).encode(),
        st.one_of(st.integers(-5, 2**40), wrong_values),
        st.one_of(st.text(max_size=5), weird_text),
        st.one_of(st.floats(), wrong_values),
    ),
    st.sampled_from(
        [
            b'{"metrics": [{"step": 1, "values": {"loss": NaN}}]}',
            b'{"metrics": [{"step": 99999999999999, "values": {"loss": 1}}]}',
            b'{"metrics": [{"step": 1, "values": {"loss": 1e309}}]}',
            b'{"metrics": [{"step": 1, "values": {"\\u0000": 1}}]}',
        ]
    ),
)


@settings(FUZZ, max_examples=100)
@given(data=metric_bodies)
def test_it_refuses_malformed_metrics_naming_the_field(trainer_api, run, data):
    _record("metrics", check_case(trainer_api, f"/api/v1/runs/{run.id}/metrics/", data, "metrics"))


@st.composite
def run_bodies(draw: Any) -> bytes:
    if draw(st.booleans()):
        return json.dumps(draw(random_json)).encode()
    comp = {
        "name": draw(
            st.one_of(st.sampled_from(["correct", "a b", "", "x" * 300, "ok/1"]), weird_text)
        ),
        "weight": draw(st.one_of(st.floats(-2, 2), wrong_values)),
        "kind": draw(st.sampled_from(["outcome", "penalty", "bogus", None, 3])),
    }
    body = {
        "name": draw(st.one_of(st.text(max_size=10), weird_text, wrong_values)),
        "kind": draw(st.sampled_from(["import", "grpo", "nope", None, 1])),
        "config": draw(
            st.one_of(st.dictionaries(st.text(max_size=4), random_json, max_size=2), wrong_values)
        ),
        "environment": draw(
            st.one_of(st.just({"name": "fuzz-env", "components": [comp]}), wrong_values)
        ),
    }
    text = json.dumps(body)
    if draw(st.booleans()):
        text = text.replace('"weight": ', '"weight": NaN, "w": ', 1)
    return text.encode()


@settings(FUZZ, max_examples=100)
@given(data=run_bodies())
def test_it_refuses_malformed_run_specs_naming_the_field(trainer_api, db, data):
    _record("runs", check_case(trainer_api, "/api/v1/runs/", data, "runs"))


def test_it_reports_fuzz_counts(capsys):
    groups = {k: v for k, v in sorted(TALLY.items()) if ":" in k}
    totals = {k: v for k, v in sorted(TALLY.items()) if ":" not in k}
    with capsys.disabled():
        print("\nAPI fuzz cases (malformed = refused with a field error, nothing stored):")
        for k, v in totals.items():
            print(f"  {k:<20} {v:>6}")
        print(f"  {'total':<20} {sum(totals.values()):>6}")
        for k, v in groups.items():
            print(f"    {k:<40} {v:>5}")
    assert math.isfinite(sum(totals.values()))


def test_it_stores_an_overflowing_aggregate_as_unknown_and_still_serves_it(trainer_api, run):
    # Found by the fuzzer: 1e308 is finite, but a weighted sum or a std of such values overflows to
    # inf, which was stored and then made every explorer page a 500 (inf is not JSON).
    group = {
        "step": 0,
        "key": "overflow",
        "prompt": "p",
        "rollouts": [
            {
                "index": 0,
                "completion": "a",
                "rewards": {"correct": 1.5e308, "format": 1e308},
            },  # sum: 2e308
            {"index": 1, "completion": "b", "rewards": {"correct": -1e308}, "reward": 1e308},
        ],
    }
    res = trainer_api.post(f"/api/v1/runs/{run.id}/groups/", {"groups": [group]}, format="json")
    assert res.status_code == 201
    page = trainer_api.get(f"/api/v1/runs/{run.id}/rollouts/?sort=correct")
    assert page.status_code == 200
    assert {r["index"]: r["reward"] for r in page.json()["rollouts"]} == {0: None, 1: 1e308}

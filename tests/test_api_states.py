"""``GET /v1/meta/states``: the job states and their groups, as ``ddpq.core.states`` has them.

The web page takes its groups from here instead of keeping lists of its own.
"""

from __future__ import annotations

from pathlib import Path

from ddpq.core import states
from ddpq.core.states import JobState
from tests.inprocess import make_client


def test_the_states_are_what_core_states_says(tmp_path: Path) -> None:
    with make_client(tmp_path / "home") as c:
        r = c.get("/v1/meta/states")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["states"] == [s.value for s in JobState]
    groups = {"active": states.ACTIVE, "waiting": states.WAITING, "terminal": states.TERMINAL}
    assert set(body) == {"states", *groups}
    for name, group in groups.items():
        assert set(body[name]) == {s.value for s in group}, name
        # In the order of the states, so an answer is the same at every call.
        assert body[name] == [s for s in body["states"] if s in body[name]], name


def test_the_states_need_no_token_and_are_documented(tmp_path: Path) -> None:
    with make_client(tmp_path / "home", auth=True) as c:
        assert c.get("/v1/jobs").status_code == 401
        assert c.get("/v1/meta/states").status_code == 200
        doc = c.get("/openapi.json").json()
    answer = doc["paths"]["/v1/meta/states"]["get"]["responses"]["200"]
    schema = answer["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/StatesOut"}
    fields = doc["components"]["schemas"]["StatesOut"]["properties"]
    assert set(fields) == {"states", "active", "waiting", "terminal"}
    for field in fields.values():
        assert field["items"] == {"$ref": "#/components/schemas/JobState"}
    assert doc["components"]["schemas"]["JobState"]["enum"] == [s.value for s in JobState]

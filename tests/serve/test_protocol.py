"""The env server's HTTP and WebSocket protocols against a real server, good input and bad."""

from __future__ import annotations

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from .servers import GAME, TEXT, Served

AUTH = {"Authorization": "Bearer sekret"}


def test_http_session_lifecycle(text_server: Served) -> None:
    url = text_server.url
    with httpx.Client(base_url=url, headers=AUTH) as http:
        opened = http.post("/v1/sessions", json={"env_id": GAME}).json()
        sid = opened["session_id"]
        assert opened["max_turns"] == 8
        reset = http.post(f"/v1/sessions/{sid}/reset", json={"task_index": 0}).json()
        assert "Guess it" in reset["observation"] and reset["episode"]["turn"] == 0
        step = http.post(f"/v1/sessions/{sid}/step", json={"action": "25"}).json()
        assert step["observation"] in ("higher", "lower") or step["terminated"]
        assert [m["role"] for m in step["messages"]][:1] == ["assistant"]
        state = http.get(f"/v1/sessions/{sid}").json()
        assert state["episode"]["turn"] == 1
        assert http.delete(f"/v1/sessions/{sid}").json() == {"closed": True}
        gone = http.post(f"/v1/sessions/{sid}/step", json={"action": "1"})
        assert gone.status_code == 404 and "no session" in gone.json()["error"]["message"]
    assert text_server.manager.sessions == {}


def test_token_checked_per_request(text_server: Served) -> None:
    url = text_server.url
    assert httpx.get(f"{url}/health").status_code == 200  # liveness needs no token
    refused = httpx.post(f"{url}/v1/sessions", json={"env_id": TEXT})
    assert refused.status_code == 401 and refused.json()["error"]["kind"] == "auth"
    wrong = httpx.get(f"{url}/v1/info", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.get(f"{url}/v1/info?token=sekret").json()["max_sessions"] == 4
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    assert "/v1/sessions/{session_id}/step" in paths and f"/openenv/{TEXT}/reset" in paths


def test_http_bad_input(text_server: Served) -> None:
    with httpx.Client(base_url=text_server.url, headers=AUTH) as http:
        typo = http.post("/v1/sessions", json={"env_id": "corral/arithmetc-v0"})
        assert typo.status_code == 404
        assert "Did you mean 'corral/arithmetic-v0'" in typo.json()["error"]["message"]
        bad = http.post("/v1/sessions", content=b"{not json", headers={
            "Content-Type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["kind"] == "protocol"
        extra = http.post("/v1/sessions", json={"env": TEXT})
        assert extra.status_code == 400 and "env_id" in extra.json()["error"]["message"]
        sid = http.post("/v1/sessions", json={"env_id": TEXT}).json()["session_id"]
        early = http.post(f"/v1/sessions/{sid}/step", json={"action": "1"})
        assert early.status_code == 409 and "reset" in early.json()["error"]["message"]
        http.post(f"/v1/sessions/{sid}/reset", json={"seed": 1})
        assert http.post(f"/v1/sessions/{sid}/step", json={"action": "1"}).json()["terminated"]
        after = http.post(f"/v1/sessions/{sid}/step", json={"action": "2"})
        assert after.status_code == 409 and "episode is over" in after.json()["error"]["message"]
        out_of_range = http.post(f"/v1/sessions/{sid}/reset", json={"task_index": 10**9})
        assert out_of_range.status_code == 400 and "out of range" in out_of_range.text
        http.delete(f"/v1/sessions/{sid}")
    assert text_server.manager.sessions == {}


def test_a_bad_task_index_or_seed_is_malformed_on_both_protocols(text_server: Served) -> None:
    """docs/serving.md: "400 malformed, ... 409 agent error". A reset's task_index out of range
    (either end) was 409, an agent error; it is a malformed request that names the range."""
    size = httpx.get(f"{text_server.url}/v1/envs/{TEXT}", headers=AUTH).json()["num_tasks"]
    valid = f"task_index must be 0 to {size - 1}"
    with httpx.Client(base_url=text_server.url, headers=AUTH) as http:
        sid = http.post("/v1/sessions", json={"env_id": TEXT}).json()["session_id"]
        for body, needle in (({"task_index": size}, valid), ({"task_index": -1}, valid),
                             ({"task_index": 10**9, "split": "train"}, valid),
                             ({"seed": "zero"}, "seed"), ({"seed": [1]}, "seed"),
                             ({"seed": 1.5}, "seed")):
            answer = http.post(f"/v1/sessions/{sid}/reset", json=body)
            error = answer.json()["error"]
            assert answer.status_code == 400, (body, answer.text)
            assert (error["kind"], error["type"]) == ("protocol", "ProtocolError"), error
            assert needle in error["message"], (body, error)
        # the session is as it was: the next (good) reset works
        ok = http.post(f"/v1/sessions/{sid}/reset", json={"task_index": size - 1})
        assert ok.status_code == 200, ok.text
        http.delete(f"/v1/sessions/{sid}")
    assert text_server.manager.sessions == {}


async def test_a_bad_task_index_over_the_websocket(text_server: Served) -> None:
    """The same answer over `/v1/ws` as over HTTP: kind "protocol", type "ProtocolError"."""
    size = httpx.get(f"{text_server.url}/v1/envs/{TEXT}", headers=AUTH).json()["num_tasks"]
    ws_url = text_server.url.replace("http", "ws") + "/v1/ws"
    async with connect(ws_url, additional_headers=AUTH) as ws:
        assert (await _ask(ws, orjson.dumps({"op": "open", "env_id": TEXT})))["ok"]
        for index in (size, -1):
            reply = await _ask(ws, orjson.dumps({"op": "reset", "task_index": index}))
            assert not reply["ok"], reply
            error = reply["error"]
            assert (error["kind"], error["type"]) == ("protocol", "ProtocolError"), error
            assert f"task_index must be 0 to {size - 1}" in error["message"], error
        reply = await _ask(ws, orjson.dumps({"op": "reset", "seed": "zero"}))
        assert reply["error"]["kind"] == "protocol" and "seed" in reply["error"]["message"]
        assert (await _ask(ws, orjson.dumps({"op": "reset", "task_index": 0})))["ok"]
        assert (await _ask(ws, b'{"op": "close"}'))["ok"]
    assert text_server.manager.sessions == {}


def test_a_body_that_is_not_json_says_so(text_server: Served) -> None:
    """`curl -d 'not json'` to /v1/sessions or a session's reset/step: a 400 in the documented
    error shape whose message says the body is not valid JSON, and where it was sent (it was
    "body: Input should be a valid dictionary ..." or "0: JSON decode error")."""
    with httpx.Client(base_url=text_server.url, headers=AUTH) as http:
        sid = http.post("/v1/sessions", json={"env_id": TEXT}).json()["session_id"]
        for path in ("/v1/sessions", f"/v1/sessions/{sid}/reset", f"/v1/sessions/{sid}/step"):
            for content_type in ("application/x-www-form-urlencoded",  # what curl -d sends
                                 "application/json", None):
                headers = {"Content-Type": content_type} if content_type else {}
                answer = http.post(path, content=b"not json", headers=headers)
                assert answer.status_code == 400, (path, content_type, answer.text)
                error = answer.json()["error"]
                assert {"kind", "type", "message"} <= set(error), error
                assert (error["kind"], error["type"]) == ("protocol", "ProtocolError"), error
                assert "the body is not valid JSON" in error["message"], error
                assert f"POST {path}" in error["message"], error
        # JSON sent without saying so: the message says what to add
        unlabelled = http.post("/v1/sessions", content=orjson.dumps({"env_id": TEXT}),
                               headers={"Content-Type": "text/plain"})
        assert unlabelled.status_code == 400
        assert "Content-Type: application/json" in unlabelled.json()["error"]["message"]
        http.delete(f"/v1/sessions/{sid}")
    assert text_server.manager.sessions == {}


async def test_a_websocket_text_message_that_is_not_json(text_server: Served) -> None:
    ws_url = text_server.url.replace("http", "ws") + "/v1/ws"
    async with connect(ws_url, additional_headers=AUTH) as ws:
        reply = await _ask(ws, "not json")  # a text frame (bytes go as a binary frame)
        assert not reply["ok"] and reply["error"]["kind"] == "protocol", reply
        assert reply["error"]["type"] == "ProtocolError" and "not JSON" in \
            reply["error"]["message"], reply
        assert (await _ask(ws, '{"op": "info"}'))["ok"]  # the connection goes on


def test_http_operations_without_a_body(text_server: Served) -> None:
    """docs/serving.md lists `.../finish` with no body, and every field of `reset` is optional:
    a bodiless POST is the empty request (it was 400 "body: Field required")."""
    with httpx.Client(base_url=text_server.url, headers=AUTH) as http:
        sid = http.post("/v1/sessions", json={"env_id": TEXT}).json()["session_id"]
        reset = http.post(f"/v1/sessions/{sid}/reset")
        assert reset.status_code == 200 and reset.json()["episode"]["turn"] == 0, reset.text
        finish = http.post(f"/v1/sessions/{sid}/finish")
        assert finish.status_code == 200 and finish.json()["episode"]["done"], finish.text
        assert http.post("/v1/sessions").status_code == 400  # env_id is required
        http.delete(f"/v1/sessions/{sid}")
    assert text_server.manager.sessions == {}


def test_unknown_paths_answer_the_error_body(text_server: Served) -> None:
    """docs/serving.md: errors are `{"error": {"kind", "type", "message"}}`, 404 for an unknown
    env: the OpenEnv endpoint of an env not served here answered `{"detail": "Not Found"}`."""
    with httpx.Client(base_url=text_server.url, headers=AUTH) as http:
        for method, path, status in (("POST", "/openenv/corral/countdown-v0/reset", 404),
                                     ("GET", "/v1/nowhere", 404), ("GET", "/v1/sessions", 405)):
            answer = http.request(method, path, json={})
            assert answer.status_code == status, (path, answer.text)
            error = answer.json()["error"]
            assert error["kind"] == "protocol" and path in error["message"], error
        assert TEXT in http.post("/openenv/corral/countdown-v0/reset", json={}).text


async def _ask(ws: object, message: bytes | str) -> dict:
    await ws.send(message)  # type: ignore[attr-defined]
    return orjson.loads(await ws.recv())  # type: ignore[attr-defined]


async def test_websocket_protocol_and_bad_messages(text_server: Served) -> None:
    ws_url = text_server.url.replace("http", "ws") + "/v1/ws"
    async with connect(ws_url, additional_headers=AUTH) as ws:
        for raw, needle in [(b"{oops", "not JSON"), (b"[1, 2]", '{"op"'),
                            (b'{"op": "stpe"}', "Did you mean 'step'"),
                            (b'{"op": "open"}', "env_id"),
                            (b'{"op": "reset"}', "no session on this connection"),
                            (b'{"op": "open", "env_id": "corral/gess-number-v0"}',
                             "Did you mean 'corral/guess-number-v0'")]:
            reply = await _ask(ws, raw)
            assert not reply["ok"] and needle in reply["error"]["message"], reply
        opened = await _ask(ws, orjson.dumps({"op": "open", "env_id": TEXT}))
        assert opened["ok"]
        reply = await _ask(ws, orjson.dumps({"op": "step", "action": {"name": 3}}))
        assert reply["error"]["kind"] == "protocol"
        reset = await _ask(ws, orjson.dumps({"op": "reset", "task_index": 2}))
        question = reset["result"]["observation"]
        step = await _ask(ws, orjson.dumps({"op": "step", "action": "no idea"}))
        assert step["result"]["terminated"] and step["result"]["reward"] == 0.0
        again = await _ask(ws, orjson.dumps({"op": "step", "action": "7"}))
        assert again["error"]["kind"] == "agent" and again["error"]["type"] == "AgentError"
        sid = opened["result"]["session_id"]
        # a session opened on this connection is not anyone else's to drive
        stolen = httpx.post(f"{text_server.url}/v1/sessions/{sid}/reset", json={},
                            headers=AUTH)
        assert stolen.status_code == 403 and "another connection" in stolen.text
        assert question and (await _ask(ws, b'{"op": "close"}'))["ok"]
    with pytest.raises(InvalidStatus, match="403"):  # no token: refused at the handshake
        async with connect(ws_url):
            pass
    assert text_server.manager.sessions == {}

"""Moonshot's Batch API in the emulator (`/moonshot/v1`): files, batches, their lifecycle, faults, billing and time.

Most tests drive the app in process with an injected clock (`create_app(..., clock=...)`), so hours of the real
service pass in no time; one runs the subprocess emulator at a small speed on the wall clock.
"""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from eagledata.emulator import create_app, parse_config, run_emulator
from eagledata.emulator.toolcalls import planned_calls, task_rounds
from eagledata.errors import InputError
from eagledata.records import ToolCall
from eagledata.text import IM_END, output_ids, prompt_ids

AUTH = {"Authorization": "Bearer sk-moonshot"}
SMALL = {"reasoning_median": 40, "reasoning_sigma": 0.3, "content_median": 10, "content_sigma": 0.3, "max_total": 300}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
TASK = "weather in city 0"  # the model's plan for it: round 1 calls get_weather twice, round 2 once
T0 = 1000.0


def line(i: int, content: str | None = None, model: str = "kimi-k2.5", **body) -> dict:
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content or f"question {i}"}],
                     "max_tokens": 2000, **body}}


def jsonl(lines: list) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)) + "\n" for x in lines).encode()


class Batches:
    """The app in process on a clock the test moves (`advance`), with the Moonshot client calls as methods."""

    def __init__(self, tok, **config):
        self.t = T0
        raw = {"seed": 0, "speed": 1, "content": SMALL, "tool_follow_rate": 0, **config}
        self.app = create_app(parse_config(raw), tok, clock=lambda: self.t)
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                        base_url="http://emu/moonshot/v1/", headers=AUTH)

    def call(self, method: str, path: str, **kw) -> httpx.Response:
        return self.loop.run_until_complete(self.client.request(method, path, **kw))

    def ok(self, method: str, path: str, **kw):
        r = self.call(method, path, **kw)
        assert r.status_code == 200, r.text
        return r.json()

    def upload(self, data: bytes, filename: str = "in.jsonl", purpose: str = "batch") -> httpx.Response:
        return self.call("POST", "files", files={"file": (filename, data, "application/jsonl")},
                         data={"purpose": purpose})

    def create(self, file_id: str, window: str = "24h", **kw) -> httpx.Response:
        return self.call("POST", "batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                  "completion_window": window, **kw})

    def submit(self, lines: list, window: str = "24h") -> dict:
        f = self.upload(jsonl(lines))
        assert f.status_code == 200, f.text
        r = self.create(f.json()["id"], window)
        assert r.status_code == 200, r.text
        return r.json()

    def batch(self, batch_id: str) -> dict:
        return self.ok("GET", f"batches/{batch_id}")

    def at(self, seconds: float) -> None:
        """The clock at T0 + seconds (batches made at T0)."""
        self.t = T0 + seconds

    def content(self, file_id: str) -> list[dict]:
        r = self.call("GET", f"files/{file_id}/content")
        assert r.status_code == 200, r.text
        return [json.loads(x) for x in r.text.splitlines()]

    def admin(self, method: str, path: str):
        return self.call(method, f"http://emu/admin/{path}").json()

    def balance(self) -> float:
        return self.ok("GET", "users/me/balance")["data"]["available_balance"]

    def lines(self, batch_id: str) -> list[tuple[str, str]]:
        return [(x["custom_id"], x["status"]) for x in self.admin("GET", "batch_lines")["data"]
                if x["batch_id"] == batch_id]

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


@pytest.fixture
def make(tok):
    made: list[Batches] = []

    def build(**config) -> Batches:
        made.append(Batches(tok, **config))
        return made[-1]

    yield build
    for b in made:
        b.close()


def usd(usage: dict, prompt: float = 0.36, completion: float = 1.80) -> float:
    return usage["prompt_tokens"] * prompt / 1e6 + usage["completion_tokens"] * completion / 1e6


# -- the whole lifecycle --------------------------------------------------------------------------
def test_lifecycle_answers_are_the_first_party_model_s_with_ground_truth(make, tok):
    assert task_rounds(TASK, ["get_weather"], True) == [("get_weather", "get_weather"), ("get_weather",)]
    loop = [{"role": "user", "content": TASK},
            {"role": "assistant", "content": "", "reasoning_content": "I should look up PLANNED",
             "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"}]
    lines = [line(0), line(1, thinking={"type": "disabled"}), line(2, max_tokens=5),
             line(3, TASK, tools=TOOLS), line(4, tools=TOOLS, thinking={"type": "enabled"})]
    lines[4]["body"]["messages"] = loop
    emu = make()
    b = emu.submit(lines)
    assert b["id"].startswith("batch_") and b["object"] == "batch" and b["status"] == "validating"
    assert b["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert b["expires_at"] - b["created_at"] == 24 * 3600 and b["in_progress_at"] is None
    assert b["endpoint"] == "/v1/chat/completions" and b["completion_window"] == "24h"
    emu.at(29.9)
    assert emu.batch(b["id"])["status"] == "validating"
    emu.at(30)
    b = emu.batch(b["id"])
    assert b["status"] == "in_progress" and b["in_progress_at"] == b["created_at"] + 30
    assert b["request_counts"] == {"total": 5, "completed": 0, "failed": 0}
    emu.at(630 + 1.0)  # the queue, then one line every 0.5 s
    assert emu.batch(b["id"])["request_counts"] == {"total": 5, "completed": 2, "failed": 0}
    assert emu.lines(b["id"]) == [("req-0", "answered"), ("req-1", "answered"), ("req-2", "pending"),
                                  ("req-3", "pending"), ("req-4", "pending")]
    emu.at(630 + 2.5)
    b = emu.batch(b["id"])
    assert b["status"] == "finalizing" and b["output_file_id"] is None and b["completed_at"] is None
    emu.at(630 + 2.5 + 30)
    b = emu.batch(b["id"])
    assert b["status"] == "completed" and b["error_file_id"] is None
    assert b["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert b["completed_at"] - b["finalizing_at"] == 30 and b["finalizing_at"] == b["created_at"] + 632
    assert b["failed_at"] is None and b["expired_at"] is None
    out = emu.content(b["output_file_id"])
    assert [x["custom_id"] for x in out] == ["req-0", "req-1", "req-2", "req-3", "req-4"]
    truth = {g["generation_id"]: g for g in emu.admin("GET", "ground_truth")["data"]}
    assert len(truth) == 5
    charged = 0.0
    for x, sent in zip(out, lines):
        assert x["id"].startswith("batch_req_") and x["error"] is None and x["response"]["status_code"] == 200
        body = x["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == "kimi-k2.5"
        assert body["id"].startswith("chatcmpl-") and body["created"] >= b["in_progress_at"]
        assert emu.admin("GET", f"ground_truth?id={body['id']}")["data"] == truth[body["id"]]
        gt, choice, usage = truth[body["id"]], body["choices"][0], body["usage"]
        msg = choice["message"]
        assert gt["output_ids"] and choice["finish_reason"] == gt["finish_reason"] and msg["role"] == "assistant"
        thinking = sent["body"].get("thinking", {}).get("type", "enabled") == "enabled"
        calls = [ToolCall.from_api(c) for c in msg.get("tool_calls", [])]
        assert output_ids(tok, msg["reasoning_content"], msg["content"], choice["finish_reason"], thinking=thinking,
                          tool_calls=calls) == gt["output_ids"]
        p = prompt_ids(tok, sent["body"]["messages"], thinking=thinking, tools=sent["body"].get("tools"))
        assert usage == {"prompt_tokens": len(p), "completion_tokens": len(gt["output_ids"]),
                         "total_tokens": len(p) + len(gt["output_ids"])}
        charged += usd(usage)
    plain, off, cut, calling, looped = ([x["response"]["body"]["choices"][0] for x in out])
    gt = truth[out[0]["response"]["body"]["id"]]
    assert plain["finish_reason"] == "stop" and plain["message"]["reasoning_content"].startswith("Okay, ")
    assert tok.decode(gt["output_ids"]) == (plain["message"]["reasoning_content"] + "</think>"
                                           + plain["message"]["content"] + "<|im_end|>")
    assert off["message"]["reasoning_content"] == ""
    assert tok.decode(truth[out[1]["response"]["body"]["id"]]["output_ids"]) == off["message"]["content"] + "<|im_end|>"
    cut_ids = truth[out[2]["response"]["body"]["id"]]["output_ids"]
    assert cut["finish_reason"] == "length" and len(cut_ids) == 5 and IM_END not in cut_ids
    assert out[2]["response"]["body"]["usage"]["completion_tokens"] == 5
    assert calling["finish_reason"] == "tool_calls" and "tool_calls" not in plain["message"]
    assert [c["id"] for c in calling["message"]["tool_calls"]] == ["functions.get_weather:0", "functions.get_weather:1"]
    assert [c["type"] for c in calling["message"]["tool_calls"]] == ["function", "function"]
    assert planned_calls(loop, TOOLS) == ("get_weather",)
    assert [c["id"] for c in looped["message"]["tool_calls"]] == ["functions.get_weather:1"]
    assert "I should look up PLANNED" in tok.decode(prompt_ids(tok, loop, tools=TOOLS))  # the prompt keeps it
    assert emu.balance() == pytest.approx(100.0 - charged, abs=1e-12)
    stats = emu.admin("GET", "stats")["batch"]
    assert stats["batches"] == {"completed": 1} and stats["files"] == 2
    assert stats["lines"] == {"answered": 5, "failed": 0, "expired": 0, "cancelled": 0, "pending": 0}
    assert stats["charged_usd"] == pytest.approx(charged, abs=1e-12)
    files = emu.ok("GET", "files")
    assert files["object"] == "list"
    assert sorted(f["purpose"] for f in files["data"]) == ["batch", "batch_output"]
    out_file = emu.ok("GET", f"files/{b['output_file_id']}")
    assert out_file["bytes"] == len(emu.call("GET", f"files/{b['output_file_id']}/content").content)
    assert emu.call("GET", f"files/{b['input_file_id']}/content").content == jsonl(lines)


def test_speed_scales_every_duration(make):
    emu = make(speed=0.01)  # 30 s validating → 0.3 s, queue 600 s → 6 s, a line every 0.005 s, finalizing 0.3 s
    b = emu.submit([line(i) for i in range(4)], window="12h")
    assert b["expires_at"] - b["created_at"] == int(12 * 3600 * 0.01)
    for t, status, done in ((0.29, "validating", 0), (0.31, "in_progress", 0), (6.3 + 0.0101, "in_progress", 2),
                            (6.3 + 0.02, "finalizing", 4), (6.3 + 0.3 - 0.01, "finalizing", 4),
                            (6.3 + 0.33, "completed", 4)):
        emu.at(t)
        got = emu.batch(b["id"])
        assert (got["status"], got["request_counts"]["completed"]) == (status, done), t
    fast = make(speed=0)  # no delay: done when created
    b = fast.submit([line(i) for i in range(3)])
    assert b["status"] == "completed" and b["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert len(fast.content(b["output_file_id"])) == 3


# -- validation -----------------------------------------------------------------------------------
def test_each_validation_error_fails_the_batch_with_its_line(make):
    bad = [line(0), "{not json", {"custom_id": "req-2", "method": "POST", "url": "/v1/chat/completions"},
           {**line(3), "method": "GET"}, {**line(4), "url": "/v1/embeddings"}, {**line(0), "custom_id": "req-0"},
           line(6, model="kimi-k2.6"), line(7, model="moonshot-v1-8k"), line(8, temperature=0.6),
           line(9, top_p=0.9), line(10, n=2), line(11, presence_penalty=0.1), line(12, frequency_penalty=0.1),
           line(13, thinking={"type": "auto"}), line(14, thinking=True), "", line(16)]
    emu = make()
    b = emu.submit(bad)
    emu.at(29)
    assert emu.batch(b["id"])["status"] == "validating"
    emu.at(30)
    b = emu.batch(b["id"])
    assert b["status"] == "failed" and b["failed_at"] == b["created_at"] + 30 and b["in_progress_at"] is None
    assert b["errors"]["object"] == "list"
    assert [(e["line"], e["code"], e["param"]) for e in b["errors"]["data"]] == [
        (2, "invalid_json_line", None), (3, "missing_required_parameter", "body"), (4, "invalid_method", "method"),
        (5, "invalid_url", "url"), (6, "duplicate_custom_id", "custom_id"), (7, "mismatched_model", "body.model"),
        (8, "model_not_found", "body.model"), (9, "invalid_parameter", "body.temperature"),
        (10, "invalid_parameter", "body.top_p"), (11, "invalid_parameter", "body.n"),
        (12, "invalid_parameter", "body.presence_penalty"), (13, "invalid_parameter", "body.frequency_penalty"),
        (14, "invalid_parameter", "body.thinking"), (15, "invalid_parameter", "body.thinking")]
    assert all(e["message"].startswith(f"line {e['line']}: ") for e in b["errors"]["data"])
    assert b["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert b["output_file_id"] is None and b["error_file_id"] is None
    emu.at(10 * 3600)
    assert emu.admin("GET", "ground_truth")["data"] == [] and emu.balance() == 100.0
    assert {s for _, s in emu.lines(b["id"])} == {"failed"}
    assert all(x["generation_id"] is None for x in emu.admin("GET", "batch_lines")["data"])
    k26 = make().submit([line(0, model="kimi-k2.6"), line(1, model="kimi-k2.6", thinking={"type": "disabled"})])
    assert k26["status"] == "validating"


def test_each_upload_and_create_error(make):
    emu = make(batch={"max_file_bytes": 200, "max_files": 2})
    good = jsonl([line(0)])
    assert len(good) <= 200
    for data, name, purpose, says in ((good, "in.jsonl", "fine-tune", "purpose"), (good, "in.json", "batch", ".jsonl"),
                                      (b"", "in.jsonl", "batch", "empty"),
                                      (jsonl([line(0), line(1)]), "in.jsonl", "batch", "over the limit of 200")):
        r = emu.upload(data, name, purpose)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert says in r.json()["error"]["message"]
    first = emu.upload(good).json()
    assert first["id"].startswith("file-") and first["object"] == "file" and first["purpose"] == "batch"
    assert first["bytes"] == len(good) and first["filename"] == "in.jsonl" and first["status"] == "ok"
    assert emu.upload(good).status_code == 200
    full = emu.upload(good)
    assert full.status_code == 400 and "already holds 2" in full.json()["error"]["message"]
    assert emu.ok("DELETE", f"files/{first['id']}") == {"id": first["id"], "object": "file", "deleted": True}
    for method, path in (("GET", f"files/{first['id']}"), ("DELETE", f"files/{first['id']}"),
                         ("GET", f"files/{first['id']}/content"), ("GET", "batches/batch_nope"),
                         ("POST", "batches/batch_nope/cancel")):
        r = emu.call(method, path)
        assert r.status_code == 404 and r.json()["error"]["type"] == "resource_not_found_error", (method, path)
    fid = emu.upload(good).json()["id"]
    assert emu.create("file-nope").status_code == 404
    for window in ("11h", "8d", "169h", "24m", "1w", "", None):
        r = emu.create(fid, window)
        assert r.status_code == 400 and "completion_window" in r.json()["error"]["message"], window
    r = emu.call("POST", "batches", json={"input_file_id": fid, "endpoint": "/v1/embeddings",
                                          "completion_window": "24h"})
    assert r.status_code == 400 and "endpoint" in r.json()["error"]["message"]
    assert emu.create(fid, metadata={"k": 1}).status_code == 400
    for window in ("12h", "1d", "3d", "7d", "168h"):
        r = emu.create(fid, window, metadata={"run": "test"})
        assert r.status_code == 200 and r.json()["metadata"] == {"run": "test"}, window


def test_401_without_a_key_and_with_a_wrong_one(make):
    emu = make()
    for headers in ({"Authorization": ""}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer "}):
        r = emu.call("GET", "batches", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_authentication_error", headers
    assert emu.call("GET", "batches").status_code == 200  # any key
    keyed = make(api_key="sk-right")
    assert keyed.call("GET", "users/me/balance").status_code == 401
    r = keyed.call("GET", "users/me/balance", headers={"Authorization": "Bearer sk-right"})
    assert r.json() == {"code": 0, "data": {"available_balance": 100.0, "voucher_balance": 0, "cash_balance": 100.0},
                        "scode": "0x0", "status": True}


def test_list_is_newest_first_and_pages(make):
    emu = make()
    ids = []
    for i in range(5):
        emu.t = T0 + i
        ids.append(emu.submit([line(i)])["id"])
    page = emu.ok("GET", "batches", params={"limit": 2})
    assert [b["id"] for b in page["data"]] == ids[:2:-1][:2] == [ids[4], ids[3]]
    assert page["object"] == "list" and page["has_more"] is True
    assert (page["first_id"], page["last_id"]) == (ids[4], ids[3])
    page = emu.ok("GET", "batches", params={"limit": 2, "after": page["last_id"]})
    assert [b["id"] for b in page["data"]] == [ids[2], ids[1]] and page["has_more"] is True
    page = emu.ok("GET", "batches", params={"limit": 2, "after": page["last_id"]})
    assert [b["id"] for b in page["data"]] == [ids[0]] and page["has_more"] is False
    assert len(emu.ok("GET", "batches")["data"]) == 5
    assert emu.call("GET", "batches", params={"limit": 0}).status_code == 400


# -- stops and faults -------------------------------------------------------------------------------
def test_expired_batch_keeps_its_completed_lines(make):
    emu = make()
    b = emu.submit([line(i) for i in range(6)])
    emu.at(630 + 1.5)  # three lines answered
    got = emu.call("POST", f"http://emu/admin/batches/{b['id']}/expire").json()
    assert got["status"] == "expired" and got["expired_at"] == got["created_at"] + 631
    assert got["request_counts"] == {"total": 6, "completed": 3, "failed": 3}
    out, err = emu.content(got["output_file_id"]), emu.content(got["error_file_id"])
    assert [x["custom_id"] for x in out] == ["req-0", "req-1", "req-2"]
    assert [x["custom_id"] for x in err] == ["req-3", "req-4", "req-5"]
    assert all(x["response"] is None and x["error"]["code"] == "batch_expired" and x["error"]["message"] for x in err)
    emu.at(5000)
    assert emu.batch(b["id"])["request_counts"]["completed"] == 3  # nothing more is answered
    assert emu.lines(b["id"]) == [*((f"req-{i}", "answered") for i in range(3)),
                                  *((f"req-{i}", "expired") for i in range(3, 6))]
    charged = sum(usd(x["response"]["body"]["usage"]) for x in out)
    assert emu.balance() == pytest.approx(100.0 - charged, abs=1e-12)
    assert emu.call("POST", f"http://emu/admin/batches/{b['id']}/expire").status_code == 400


def test_expire_rate_stalls_part_way_and_the_window_ends_it(make):
    emu = make(batch={"expire_rate": 1.0})
    b = emu.submit([line(i) for i in range(8)], window="12h")
    emu.at(12 * 3600 - 1)
    got = emu.batch(b["id"])
    assert got["status"] == "in_progress"
    done = got["request_counts"]["completed"]
    assert 0 <= done < 8
    emu.at(12 * 3600)
    got = emu.batch(b["id"])
    assert got["status"] == "expired" and got["expired_at"] == got["expires_at"]
    assert got["request_counts"] == {"total": 8, "completed": done, "failed": 8 - done}
    assert [x["custom_id"] for x in emu.content(got["error_file_id"])] == [f"req-{i}" for i in range(done, 8)]
    again = make(batch={"expire_rate": 1.0})  # seeded: the same stall
    b2 = again.submit([line(i) for i in range(8)], window="12h")
    again.at(12 * 3600)
    assert again.batch(b2["id"])["request_counts"]["completed"] == done
    slow = make(batch={"lines_per_s": 0.001})  # 8 lines at 1000 s each do not fit 12 h after the queue
    b3 = slow.submit([line(i) for i in range(50)], window="12h")
    slow.at(12 * 3600)
    got = slow.batch(b3["id"])
    assert got["status"] == "expired" and got["request_counts"]["completed"] == int((12 * 3600 - 630) / 1000)


def test_cancel_keeps_the_answered_lines_and_charges_nothing_more(make):
    emu = make()
    b = emu.submit([line(i) for i in range(6)])
    emu.at(630 + 1.0)
    got = emu.ok("POST", f"batches/{b['id']}/cancel")
    assert got["status"] == "cancelling" and got["cancelling_at"] == got["created_at"] + 631
    assert got["cancelled_at"] is None and got["output_file_id"] is None
    assert emu.ok("POST", f"batches/{b['id']}/cancel")["status"] == "cancelling"
    emu.at(630 + 1.0 + 29)
    assert emu.batch(b["id"])["status"] == "cancelling"
    emu.at(630 + 1.0 + 30)
    got = emu.batch(b["id"])
    assert got["status"] == "cancelled" and got["cancelled_at"] == got["cancelling_at"] + 30
    assert got["request_counts"] == {"total": 6, "completed": 2, "failed": 4}
    out, err = emu.content(got["output_file_id"]), emu.content(got["error_file_id"])
    assert [x["custom_id"] for x in out] == ["req-0", "req-1"]
    assert [(x["custom_id"], x["response"], x["error"]["code"]) for x in err] == [
        (f"req-{i}", None, "batch_cancelled") for i in range(2, 6)]
    assert emu.lines(b["id"]) == [("req-0", "answered"), ("req-1", "answered"),
                                  *((f"req-{i}", "cancelled") for i in range(2, 6))]
    assert emu.balance() == pytest.approx(100.0 - sum(usd(x["response"]["body"]["usage"]) for x in out), abs=1e-12)
    assert len(emu.admin("GET", "ground_truth")["data"]) == 2
    r = emu.call("POST", f"batches/{b['id']}/cancel")
    assert r.status_code == 400 and "cancelled" in r.json()["error"]["message"]
    early = emu.submit([line(i) for i in range(3)])
    got = emu.ok("POST", f"batches/{early['id']}/cancel")  # while validating: nothing runs, no file
    emu.at(100_000)
    got = emu.batch(early["id"])
    assert got["status"] == "cancelled" and got["output_file_id"] is None and got["error_file_id"] is None
    assert got["request_counts"] == {"total": 0, "completed": 0, "failed": 0}


def test_line_errors_go_to_the_error_file_uncharged_and_repeat_with_the_seed(make):
    def run() -> tuple[list[str], list[str], float, float]:
        emu = make(seed=7, batch={"line_error_rate": 0.5})
        b = emu.submit([line(i) for i in range(12)])
        emu.at(10_000)
        got = emu.batch(b["id"])
        out, err = emu.content(got["output_file_id"]), emu.content(got["error_file_id"])
        assert got["status"] == "completed"
        assert got["request_counts"] == {"total": 12, "completed": len(out), "failed": len(err)}
        for x in err:
            assert x["error"] is None and x["response"]["status_code"] == 500 and x["id"].startswith("batch_req_")
            error = x["response"]["body"]["error"]
            assert error["type"] == "server_error" and error["message"]
        statuses = dict(emu.lines(b["id"]))
        assert {x["custom_id"] for x in err} == {k for k, s in statuses.items() if s == "failed"}
        assert len(emu.admin("GET", "ground_truth")["data"]) == len(out)
        return ([x["custom_id"] for x in out], [x["custom_id"] for x in err], emu.balance(),
                100.0 - sum(usd(x["response"]["body"]["usage"]) for x in out))

    ok, failed, balance, expected = run()
    assert 0 < len(failed) < 12 and len(ok) + len(failed) == 12
    assert balance == pytest.approx(expected, abs=1e-12)
    assert run()[:2] == (ok, failed)


def test_balance_charged_at_the_batch_price_and_running_out(make):
    prices = {"prompt_price": 0.5, "completion_price": 2.0}
    emu = make(batch={"balance": 0.0004, **prices})
    b = emu.submit([line(i) for i in range(10)])
    emu.at(10_000)
    got = emu.batch(b["id"])
    out, err = emu.content(got["output_file_id"]), emu.content(got["error_file_id"])
    costs = [usd(x["response"]["body"]["usage"], 0.5, 2.0) for x in out]
    assert 0 < len(out) < 10 and sum(costs[:-1]) < 0.0004 <= sum(costs)  # answered while the balance lasted
    assert [x["custom_id"] for x in out + err] == [f"req-{i}" for i in range(10)]
    assert all(x["response"]["status_code"] == 429 for x in err)
    assert {x["response"]["body"]["error"]["type"] for x in err} == {"exceeded_current_quota_error"}
    assert emu.balance() == pytest.approx(0.0004 - sum(costs), abs=1e-15)
    assert emu.admin("GET", "stats")["batch"]["lines"]["failed"] == 10 - len(out)


def test_reset_clears_the_batch_state(make):
    emu = make(speed=0)
    b = emu.submit([line(0)])
    assert emu.admin("GET", "stats")["batch"]["files"] == 2
    assert emu.call("POST", "http://emu/admin/reset").json() == {"ok": True}
    assert emu.ok("GET", "files")["data"] == [] and emu.ok("GET", "batches")["data"] == []
    assert emu.call("GET", f"batches/{b['id']}").status_code == 404
    assert emu.admin("GET", "batch_lines")["data"] == [] and emu.balance() == 100.0
    assert emu.call("POST", "http://emu/admin/reset", content=json.dumps({"batch": {"balance": 5}})).status_code == 200
    assert emu.balance() == 5.0


def test_config_errors_name_the_batch_field():
    for field, raw in {"batch.lines_per_s": {"lines_per_s": 0}, "batch.max_files": {"max_files": "many"},
                       "batch.line_error_rate": {"line_error_rate": 1.5}, "batch.nope": {"nope": 1},
                       "batch.models": {"models": []}, "batch.balance": {"balance": -1}}.items():
        with pytest.raises(InputError) as e:
            parse_config({"batch": raw})
        assert e.value.field == field and field in str(e.value)
    cfg = parse_config({"batch": {"queue_s": 5, "max_file_bytes": 10}})
    assert (cfg.batch.queue_s, cfg.batch.max_file_bytes, cfg.batch.validating_s) == (5.0, 10, 30.0)
    assert (cfg.batch.prompt_price, cfg.batch.completion_price, cfg.batch.balance) == (0.36, 1.80, 100.0)


# -- over a real socket ------------------------------------------------------------------------------
def test_subprocess_emulator_serves_the_batch_api(tokenizer_dir):
    with run_emulator(speed=0.001, content=SMALL) as emu:  # validating 0.03 s, queue 0.6 s, finalizing 0.03 s
        base = emu.base_url.replace("/api/v1", "/moonshot/v1")
        with httpx.Client(base_url=base, headers=AUTH, timeout=30) as c:
            f = c.post("/files", files={"file": ("in.jsonl", jsonl([line(i) for i in range(3)]))},
                       data={"purpose": "batch"}).json()
            b = c.post("/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                         "completion_window": "24h"}).json()
            assert b["status"] == "validating"
            seen = []
            deadline = time.monotonic() + 20
            while b["status"] not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
                time.sleep(0.02)
                b = c.get(f"/batches/{b['id']}").json()
                seen.append(b["status"])
            assert b["status"] == "completed" and seen.index("in_progress") < seen.index("completed")
            out = [json.loads(x) for x in c.get(f"/files/{b['output_file_id']}/content").text.splitlines()]
            assert [x["custom_id"] for x in out] == ["req-0", "req-1", "req-2"]
            body = out[0]["response"]["body"]
            assert emu.ground_truth(body["id"])["output_ids"][-1] == IM_END
            assert body["usage"]["completion_tokens"] == len(emu.ground_truth(body["id"])["output_ids"])
            lines = httpx.get(f"{emu.admin_url}/batch_lines").json()["data"]
            assert sorted(x["generation_id"] for x in lines) == sorted(x["response"]["body"]["id"] for x in out)
            assert emu.stats()["batch"]["batches"] == {"completed": 1}
        assert "Traceback" not in emu.log(), emu.log()

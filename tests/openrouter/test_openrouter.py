import json

import httpx
import pytest

from eagledata.openrouter import Kind, build_request, classify_exception, classify_response
from eagledata.records import Answer


def ok_body(**message):
    msg = {"role": "assistant", "content": "Answer.", "reasoning": "Think."}
    msg.update(message)
    return {"id": "gen-1", "provider": "DeepInfra", "model": "moonshotai/kimi-k2.5-0127",
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18,
                      "completion_tokens_details": {"reasoning_tokens": 3}, "cost": 2.5e-5}}


def classify(status, body, headers=None):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return classify_response(status, httpx.Headers(headers or {}), raw)


def err(code, message="x", **metadata):
    return {"error": {"code": code, "message": message, "metadata": metadata or None}}


def test_success_fields():
    out = classify(200, ok_body())
    c = out.completion
    assert out.kind is Kind.OK
    assert c.answer == Answer("Think.", "Answer.", "stop")
    assert (c.provider, c.model, c.generation_id) == ("DeepInfra", "moonshotai/kimi-k2.5-0127", "gen-1")
    u = c.usage
    assert (u.prompt_tokens, u.completion_tokens, u.reasoning_tokens, u.cost) == (10, 8, 3, 2.5e-5)


def test_reasoning_details_only_and_inline_think():
    details = [{"type": "reasoning.text", "text": "Step 1. "}, {"type": "reasoning.encrypted", "data": "xx"},
               {"type": "reasoning.text", "text": "Step 2."}]
    c = classify(200, ok_body(reasoning=None, reasoning_details=details)).completion
    assert c.answer.reasoning == "Step 1. Step 2."
    c = classify(200, ok_body(reasoning=None, content="<think>inline</think>\\nAnswer.")).completion
    assert (c.answer.reasoning, c.answer.content, c.reasoning_inline) == ("inline", "\\nAnswer.", True)


@pytest.mark.parametrize("status, body, headers, kind, cls", [
    (429, err(429, "Rate limit exceeded"), {"Retry-After": "3"}, Kind.RETRY, "rate_limit"),
    (429, err(429, "Provider returned error", provider_name="Chutes", raw="busy"), {}, Kind.RETRY,
     "upstream_rate_limit"),
    (402, err(402, "in-flight budget exceeded"), {"Retry-After": "2"}, Kind.RETRY, "budget_inflight"),
    (402, err(402, "This request requires more credits, or fewer max_tokens"), {}, Kind.OUT_OF_MONEY, "no_credits"),
    (502, err(502), {}, Kind.RETRY, "bad_gateway"),
    (503, err(503), {}, Kind.RETRY, "unavailable"),
    (408, err(408), {}, Kind.RETRY, "timeout"),
    (404, err(404, "No endpoints found matching your data policy"), {}, Kind.RETRY, "no_endpoint"),
    (400, err(400, "This endpoint's maximum context length is 262144 tokens"), {}, Kind.FAILED, "bad_request"),
    (401, err(401, "No auth credentials found"), {}, Kind.FATAL, "auth"),
    (200, err(502, "upstream died"), {}, Kind.RETRY, "error_in_body"),
    (200, {**ok_body(), "choices": [{"message": {"content": ""}, "finish_reason": "error",
                                     "error": {"code": 502, "message": "boom"}}]}, {}, Kind.RETRY, "error_in_choice"),
    (200, ok_body(content="", reasoning=""), {}, Kind.RETRY, "empty"),
    (200, ok_body(content=None, reasoning="only thinking"), {}, Kind.RETRY, "empty"),
    (200, b'{"id": "gen-1", "choices": [{"mess', {}, Kind.RETRY, "malformed"),
    (200, b"", {}, Kind.RETRY, "malformed"),
    (500, b"<html>oops</html>", {}, Kind.RETRY, "server_error"),
])
def test_error_classes(status, body, headers, kind, cls):
    out = classify(status, body, headers)
    assert (out.kind, out.error_class) == (kind, cls)
    if "Retry-After" in headers:
        assert out.retry_after == float(headers["Retry-After"])


def test_cut_inside_reasoning_is_an_answer():
    body = ok_body(content="", reasoning="long thought")
    body["choices"][0]["finish_reason"] = "length"
    out = classify(200, body)
    assert out.kind is Kind.OK and out.completion.answer.finish_reason == "length"


def test_exceptions():
    assert classify_exception(httpx.ReadTimeout("t")).error_class == "client_timeout"
    assert classify_exception(httpx.RemoteProtocolError("reset")).error_class == "connection"
    assert classify_exception(httpx.DecodingError("bad gzip")).kind is Kind.RETRY


def test_request_body():
    body = build_request("moonshotai/kimi-k2.5", [{"role": "user", "content": "q"}], max_tokens=100,
                         temperature=0.6, provider={"ignore": ["fireworks"], "sort": "price"})
    assert body["reasoning"] == {"enabled": True} and body["provider"]["ignore"] == ["fireworks"]
    assert body["max_tokens"] == 100 and body["stream"] is False
    local = build_request("kimi", [], max_tokens=5, temperature=None, provider=None, backend="local")
    assert local["return_token_ids"] is True and "provider" not in local and "temperature" not in local


def test_api_key_from_the_environment_only_and_none_for_a_local_backend(monkeypatch):
    from eagledata.errors import InputError
    from eagledata.openrouter import resolve_api_key
    from eagledata.openrouter.client import make_client

    monkeypatch.delenv("EAGLEDATA_NO_SUCH_KEY", raising=False)
    remote = "http://gpu-node-7:8000/v1"
    assert resolve_api_key(remote, "EAGLEDATA_NO_SUCH_KEY", backend="local") is None  # no dummy key needed
    assert "authorization" not in make_client(remote, None).headers
    with pytest.raises(InputError, match="set the environment variable EAGLEDATA_NO_SUCH_KEY"):
        resolve_api_key("https://openrouter.ai/api/v1", "EAGLEDATA_NO_SUCH_KEY")
    assert resolve_api_key("http://127.0.0.1:8765/api/v1", "EAGLEDATA_NO_SUCH_KEY")  # the emulator wants one
    monkeypatch.setenv("EAGLEDATA_NO_SUCH_KEY", "sk-local")
    assert resolve_api_key(remote, "EAGLEDATA_NO_SUCH_KEY", backend="local") == "sk-local"  # vLLM --api-key
    assert make_client(remote, "sk-local").headers["authorization"] == "Bearer sk-local"


# -- answers served without a reasoning parser (answers.repair_reasoning) ---------------------------------
def _served(content, finish="stop", reasoning=None, reasoning_tokens=3, completion_tokens=8, **message):
    body = ok_body(content=content, reasoning=reasoning, **message)
    body["choices"][0]["finish_reason"] = finish
    body["usage"]["completion_tokens"] = completion_tokens
    body["usage"]["completion_tokens_details"]["reasoning_tokens"] = reasoning_tokens
    return classify(200, body)


def test_bare_close_is_repaired_exactly():
    """`reasoning</think>answer` in content, no reasoning field: split at the first `</think>`, kept, named."""
    out = _served("Think it over.</think>The answer, with a literal </think> in it.")
    c = out.completion
    assert out.kind is Kind.OK and c.repaired == "bare_close"
    assert c.answer == Answer("Think it over.", "The answer, with a literal </think> in it.", "stop")
    # the model's own empty reasoning, served bare, counted 0: still exact
    c = _served("</think>Hi.", reasoning_tokens=0).completion
    assert (c.answer.reasoning, c.answer.content, c.repaired) == ("", "Hi.", "bare_close")
    # a provider that serves reasoning: content with a literal `</think>` is text, nothing repaired
    c = _served("A literal </think> tag.", reasoning="Real reasoning.").completion
    assert (c.answer.reasoning, c.answer.content, c.repaired) == ("Real reasoning.", "A literal </think> tag.", "")
    # inline `<think>…</think>` keeps its own rule, even with empty reasoning inside
    c = _served("<think></think>Hi.", reasoning_tokens=0).completion
    assert (c.answer.reasoning, c.answer.content, c.repaired) == ("", "Hi.", "")


def test_a_cut_bare_answer_is_reasoning_only_when_the_count_says_so():
    # every output token counted as reasoning: the cut fell inside the reasoning
    c = _served("Still thinking about", finish="length", reasoning_tokens=8, completion_tokens=8).completion
    assert (c.answer.reasoning, c.answer.content, c.repaired) == ("Still thinking about", "", "bare_close_cut")
    # no reasoning counted: the model's own empty <think></think>, cut in its answer (as served)
    c = _served("1, 2, 3, 4", finish="length", reasoning_tokens=0, completion_tokens=8).completion
    assert (c.answer.reasoning, c.answer.content, c.repaired) == ("", "1, 2, 3, 4", "")


def test_reasoning_billed_but_not_served_is_refused():
    """reasoning_tokens > 0 and no reasoning text anywhere: the ids cannot be rebuilt; retried, billed, named."""
    for out in (_served("Answer."), _served("1, 2, 3", finish="length", reasoning_tokens=5, completion_tokens=9)):
        assert (out.kind, out.error_class, out.provider) == (Kind.RETRY, "reasoning_missing", "DeepInfra")
        assert out.completion is not None and out.completion.usage.cost == 2.5e-5  # what it cost is known
    from eagledata.generation.policy import rule
    assert rule(_served("Answer.")).cost == "known"
    # empty reasoning counted 0 is the model's own <think></think>: valid
    out = _served("Answer.", reasoning_tokens=0)
    assert out.kind is Kind.OK and out.completion.answer == Answer("", "Answer.", "stop")


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_base_url_is_an_input_error_naming_it(monkeypatch):
    """Issue 44 bug 7: a raw httpx.ConnectError that named neither the URL nor the setting."""
    from eagledata.aio import run_sync
    from eagledata.errors import InputError
    from eagledata.openrouter import fetch_catalog, read_account
    from eagledata.openrouter.client import make_client

    port = _closed_port()
    url = f"http://127.0.0.1:{port}/api/v1"
    with pytest.raises(InputError) as e:
        fetch_catalog(url, "moonshotai/kimi-k2.5")
    assert str(e.value) == (f"field 'base_url': cannot reach {url} (GET models/moonshotai/kimi-k2.5/endpoints: "
                            f"All connection attempts failed); if it is the emulator, start it first: "
                            f"eagledata-emulator --port {port}")

    async def account(base_url):
        async with make_client(base_url, "k") as client:
            return await read_account(client)

    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    with pytest.raises(InputError, match=r"^field 'base_url': cannot reach https://nowhere\.invalid/api/v1 \(GET key: "
                                         r"[^)]+\)$"):  # a host that is not local: no emulator hint
        run_sync(account("https://nowhere.invalid/api/v1"), "account")
    with pytest.raises(InputError, match=r"^field 'base_url': cannot reach localhost:8000/api/v1 \(GET key: .*\); "
                                         r"a base_url starts with http:// or https://$"):
        run_sync(account("localhost:8000/api/v1"), "account")

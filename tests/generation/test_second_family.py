"""A local server's answers for a target without a reasoning section (SmolLM2's ChatML): the record keeps the text as
served and the server's ids, K2.5's shape rules (an inline `<think>` split off, a bare `</think>` taken for the end
of reasoning) do not touch it, and the sampling sent is kept in `meta.sampling`. The same body for K2.5 is still
repaired as before."""
from __future__ import annotations

import json

import pytest

from eagledata.generation.conversations.recording import build_record
from eagledata.generation.conversations.turns import Conversation
from eagledata.openrouter import classify_response
from eagledata.prompts import normalize_prompt
from eagledata.text import load_tokenizer, output_ids, prompt_ids


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    return load_tokenizer(smollm2_dir)


def vllm_body(tok, content: str, finish: str = "stop") -> bytes:
    """A vLLM chat-completions body with `return_token_ids` (no reasoning parser): content as text, its ids."""
    ids = tok.encode_ordinary(content) + ([tok.structure.end_of_turn] if finish == "stop" else [])
    return json.dumps({"id": "chatcmpl-1", "model": "smollm2", "prompt_token_ids": None,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                            "reasoning_content": None},
                                    "finish_reason": finish, "token_ids": ids}],
                       "usage": {"prompt_tokens": 30, "completion_tokens": len(ids)}}).encode()


@pytest.mark.parametrize("content", ["Use </think> to close a tag; done.", "  <think>not reasoning</think>text",
                                     "plain answer"])
def test_a_target_without_reasoning_records_the_answer_as_served(smol, content):
    turn = Conversation.of(normalize_prompt({"id": "q", "messages": [{"role": "user", "content": "Tags?"}]})).turn()
    outcome = classify_response(200, {}, vllm_body(smol, content))
    c = outcome.completion
    assert c is not None
    r = build_record(smol, turn=turn, dataset="sharegpt", prompt_ids=prompt_ids(smol, turn.messages), completion=c,
                     attempts=1, sampling={"temperature": 0.0})
    assert (r.reasoning, r.content, r.finish_reason) == ("", content, "stop")
    assert r.output_ids == c.output_token_ids == output_ids(smol, "", content, "stop")
    assert r.meta["retokenized_agreement"] == 1.0 and r.meta["ids_source"] == "server"
    assert r.meta["sampling"] == {"temperature": 0.0}
    assert r.meta["fidelity"]["repaired"] == "" and "reasoning_inline" not in r.meta


def test_k25_still_repairs_a_bare_close(tok):
    """The same shape for K2.5 (its generation prompt opened `<think>`): the first `</think>` ends the reasoning."""
    turn = Conversation.of(normalize_prompt({"id": "q", "messages": [{"role": "user", "content": "Tags?"}]})).turn()
    body = json.loads(vllm_body(tok, "It asks about tags.</think>Answer."))
    c = classify_response(200, {}, json.dumps(body).encode()).completion
    r = build_record(tok, turn=turn, dataset="D", prompt_ids=[1], completion=c, attempts=1)
    assert (r.reasoning, r.content) == ("It asks about tags.", "Answer.")
    assert r.meta["fidelity"]["repaired"] == "bare_close"

"""Moonshot's Batch API, emulated: one line's answer. The first-party model's, made by the realtime endpoints'
content code (`content.generate`, the tool plan) with no provider quirk, its ids kept in the emulator's ground truth
under the completion's id; priced at the batch price."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .batch_requests import BatchError, new_id
from .catalog import Quirks, per_token
from .config import BatchConfig
from .content import content_rng, generate
from .requests import ApiError, ChatRequest, parse_chat
from .service import Emulator
from .toolcalls import plan

CONTEXT = 262_144  # the served models' context length (prompt + max_tokens)


def chat_request(body: dict, models: list[str]) -> ChatRequest:
    """The line's body as a chat request (the realtime parser's checks; `thinking` is Moonshot's switch)."""
    plain = {k: v for k, v in body.items() if k not in ("thinking", "reasoning", "stream", "provider")}
    try:
        req = parse_chat(plain, tuple(models))
    except ApiError as e:
        raise BatchError(400, e.message) from None
    return replace(req, thinking=(body.get("thinking") or {}).get("type", "enabled") == "enabled")


def answer(em: Emulator, cfg: BatchConfig, body: dict, *, batch_id: str, custom_id: str | None,
           created: int) -> tuple[dict, float]:
    """The chat completion for one line's `body` and what it costs; a 400 (`BatchError`) for a body the model
    cannot take."""
    req = chat_request(body, cfg.models)
    try:
        p_ids = em.prompt_ids(req)
    except ApiError as e:
        raise BatchError(400, e.message) from None
    room = CONTEXT - len(p_ids)
    if room <= 0 or (req.max_tokens or 0) > room:
        raise BatchError(400, f"Invalid request: your request exceeded model token limit: {CONTEXT} "
                              f"({len(p_ids)} prompt tokens + max_tokens {req.max_tokens})")
    phash = em.request_hash(req)
    attempt = em.attempts[phash]
    em.attempts[phash] += 1
    rng = content_rng(em.cfg.seed, phash, attempt, req.seed)
    calls = None if req.tools is None else plan(req.messages, req.tools, req.parallel_tool_calls, req.tool_choice,
                                                em.follow(req), em.cfg.tool_style)
    gen = generate(em.tok, rng, em.cfg.content, Quirks(), req.max_tokens or room, thinking=req.thinking, calls=calls)
    n_prompt, n_out = len(p_ids), len(gen.output_ids)  # usage counts a final <|im_end|>
    cost = n_prompt * float(per_token(cfg.prompt_price)) + n_out * float(per_token(cfg.completion_price))
    gid = new_id("chatcmpl-")
    model = body["model"]
    message: dict[str, Any] = {"role": "assistant", "content": gen.content, "reasoning_content": gen.reasoning}
    if gen.tool_calls:
        message["tool_calls"] = [c.to_api() for c in gen.tool_calls]
    em.keep_truth({"generation_id": gid, "prompt_hash": phash, "attempt": attempt, "provider": "Moonshot AI",
                   "model": model, "route": "batch", "batch_id": batch_id, "custom_id": custom_id,
                   "prompt_tokens": n_prompt, **({"prompt_ids": p_ids} if em.cfg.record_prompt_ids else {}),
                   **gen.to_dict(), "fault": None, "cost": cost})
    return {"id": gid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": gen.finish_reason}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}}, cost

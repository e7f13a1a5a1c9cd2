"""Moonshot's Batch API, emulated: what a batch's input file holds, the checks its validation makes (the first
error per line, `{code, message, param, line}`), and the API's errors in Moonshot's shape."""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

ENDPOINT = "/v1/chat/completions"
FIXED_SAMPLING = ("kimi-k2.5", "kimi-k2.6")  # models whose sampling parameters cannot be set
FIXED_PARAMETERS = ("temperature", "top_p", "n", "presence_penalty", "frequency_penalty")
THINKING = ("enabled", "disabled")
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_authentication_error", 404: "resource_not_found_error",
               429: "exceeded_current_quota_error", 500: "server_error"}
_WINDOW = re.compile(r"^([1-9][0-9]*)([hd])$")


class BatchError(Exception):
    """An error answered in Moonshot's shape `{"error": {message, type}}` with an HTTP status."""

    def __init__(self, status: int, message: str, kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, kind or ERROR_TYPES.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type}}


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def window_hours(text: Any) -> int:
    """`completion_window` ("12h" … "7d", "24h", "3d") in hours; a 400 outside 12 h – 7 d."""
    m = _WINDOW.match(text) if isinstance(text, str) else None
    hours = int(m.group(1)) * (24 if m.group(2) == "d" else 1) if m else 0
    if not 12 <= hours <= 168:
        raise BatchError(400, f"completion_window must be between 12h and 7d (e.g. '24h', '3d'), got {text!r}")
    return hours


@dataclass
class Line:
    number: int  # 1-based line of the input file
    custom_id: str | None
    body: dict | None
    fault: bool = False  # drawn at creation (`line_error_rate`): answered with a 500 body
    status: str = "pending"  # pending | answered | failed | expired | cancelled
    generation_id: str | None = None


def validate_lines(data: bytes, models: list[str]) -> tuple[list[Line], list[dict]]:
    """The input file's lines and its validation errors (`{code, message, param, line}`, the first per line)."""
    lines: list[Line] = []
    errors: list[dict] = []
    seen: set[str] = set()
    model: str | None = None
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue

        def bad(code: str, message: str, param: str | None = None, line: int = number) -> None:
            errors.append({"code": code, "message": f"line {line}: {message}", "param": param, "line": line})

        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            obj = None
        if not isinstance(obj, dict):
            lines.append(Line(number, None, None))
            bad("invalid_json_line", "is not a valid JSON object")
            continue
        cid, body = obj.get("custom_id"), obj.get("body")
        lines.append(Line(number, cid if isinstance(cid, str) else None, body if isinstance(body, dict) else None))
        missing = next((k for k in ("custom_id", "method", "url", "body") if obj.get(k) is None), None)
        if missing:
            bad("missing_required_parameter", f"'{missing}' is required", missing)
        elif not isinstance(cid, str) or not cid:
            bad("invalid_parameter", "'custom_id' must be a non-empty string", "custom_id")
        elif cid in seen:
            bad("duplicate_custom_id", f"custom_id {cid!r} is used by an earlier line", "custom_id")
        elif obj["method"] != "POST":
            bad("invalid_method", f"method must be 'POST', got {obj['method']!r}", "method")
        elif obj["url"] != ENDPOINT:
            bad("invalid_url", f"url must be '{ENDPOINT}', got {obj['url']!r}", "url")
        elif not isinstance(body, dict):
            bad("invalid_parameter", "'body' must be a JSON object", "body")
        elif not isinstance(body.get("model"), str) or not body["model"]:
            bad("missing_required_parameter", "'body.model' is required", "body.model")
        elif body["model"] not in models:
            bad("model_not_found", f"model {body['model']!r} is not served by the Batch API "
                                   f"(served: {', '.join(models)})", "body.model")
        elif model is not None and body["model"] != model:
            bad("mismatched_model", f"all lines of a batch must name one model: {body['model']!r} after {model!r}",
                "body.model")
        elif body["model"] in FIXED_SAMPLING and (p := next((k for k in FIXED_PARAMETERS
                                                              if body.get(k) is not None), None)):
            bad("invalid_parameter", f"'{p}' cannot be set for {body['model']}", f"body.{p}")
        elif (thinking := body.get("thinking")) is not None and not (
                isinstance(thinking, dict) and set(thinking) == {"type"} and thinking["type"] in THINKING):
            bad("invalid_parameter", "'thinking' must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}",
                "body.thinking")
        if isinstance(cid, str) and cid:
            seen.add(cid)
        if isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"] in models:
            model = model or body["model"]
    if not lines:
        errors.append({"code": "empty_file", "message": "the input file has no requests", "param": None,
                       "line": None})
    return lines, errors

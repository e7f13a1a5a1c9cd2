"""A prompt of an agent dataset: tool calls answered by the dataset's own results (tool-call tests)."""

TOOLS = [{"type": "function", "function": {"name": n, "description": n, "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}} for n in ("get_weather", "search")]


def call(cid: str, name: str, args: str = '{"q": "x"}') -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def dataset() -> dict:
    """Two parallel weather calls, then a search, then a plain answer; a second user turn answered plainly."""
    return {"id": "agent-1", "tools": TOOLS, "messages": [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Weather in Paris and Lyon, then news?"},
        {"role": "assistant", "content": "OLD", "tool_calls": [call("call_a", "get_weather"),
                                                              call("call_b", "get_weather")]},
        {"role": "tool", "tool_call_id": "call_b", "content": "Lyon: rain"},  # answered out of order
        {"role": "tool", "tool_call_id": "call_a", "content": "Paris: sun"},
        {"role": "assistant", "content": "OLD", "tool_calls": [call("call_c", "search")]},
        {"role": "tool", "tool_call_id": "call_c", "content": "news: none"},
        {"role": "assistant", "content": "OLD final"},
        {"role": "user", "content": "Thanks. And tomorrow?"},
        {"role": "assistant", "content": "OLD tomorrow"}]}

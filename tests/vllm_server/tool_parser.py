"""vLLM's own `kimi_k2` tool parser on texts given as JSON on stdin: `{"tools": [...], "texts": [...]}`; prints one
JSON line per text, `{tools_called, content, calls: [{id, name, arguments}]}`, as the server would serve them.

Runs in the vLLM environment (`tests/test_vllm_real.py` calls it with `vllm_python()`). The parser reads only the
special tokens' ids from its tokenizer, so a stand-in with K2.5's ids for them is enough: no model, no remote code.
"""
import json
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers.kimi_k2_tool_parser import KimiK2ToolParser

SPECIAL = {"<think>": 163606, "</think>": 163607, "<|im_end|>": 163586, "<|tool_calls_section_begin|>": 163595,
           "<|tool_calls_section_end|>": 163596, "<|tool_call_begin|>": 163597, "<|tool_call_argument_begin|>": 163598,
           "<|tool_call_end|>": 163599}


class SpecialsOnly:
    """What the parser asks of a tokenizer: the vocabulary's ids of the special tokens it splits on."""

    def get_vocab(self) -> dict[str, int]:
        return dict(SPECIAL)

    vocab = property(get_vocab)


def main() -> None:
    given = json.load(sys.stdin)
    parser = KimiK2ToolParser(SpecialsOnly())
    request = ChatCompletionRequest(model="kimi", messages=[{"role": "user", "content": "-"}], tools=given["tools"])
    for text in given["texts"]:
        out = parser.extract_tool_calls(text, request)
        print(json.dumps({"tools_called": out.tools_called, "content": out.content,
                          "calls": [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                                    for c in out.tool_calls]}, ensure_ascii=False))


if __name__ == "__main__":
    main()

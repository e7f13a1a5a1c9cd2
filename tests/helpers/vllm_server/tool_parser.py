"""vLLM's own `kimi_k2` tool parser on texts given as JSON on stdin: `{"tools": [...], "specials": {token: id},
"texts": [...]}`; prints one JSON line per text, `{tools_called, content, calls: [{id, name, arguments}]}`, as the
server would serve them.

Runs in the vLLM environment (`tests/training/test_vllm_real.py` calls it with `vllm_python()`). The parser reads
only the special tokens' ids from its tokenizer, so a stand-in holding K2.5's (the test sends them) is enough: no
model, no remote code.
"""
import json
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers.kimi_k2_tool_parser import KimiK2ToolParser


class SpecialsOnly:
    """What the parser asks of a tokenizer: the vocabulary's ids of the special tokens it splits on."""

    def __init__(self, specials: dict[str, int]):
        self.specials = specials

    def get_vocab(self) -> dict[str, int]:
        return dict(self.specials)

    vocab = property(get_vocab)


def main() -> None:
    given = json.load(sys.stdin)
    parser = KimiK2ToolParser(SpecialsOnly(given["specials"]))
    request = ChatCompletionRequest(model="kimi", messages=[{"role": "user", "content": "-"}], tools=given["tools"])
    for text in given["texts"]:
        out = parser.extract_tool_calls(text, request)
        print(json.dumps({"tools_called": out.tools_called, "content": out.content,
                          "calls": [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                                    for c in out.tool_calls]}, ensure_ascii=False))


if __name__ == "__main__":
    main()

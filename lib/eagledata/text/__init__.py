"""Text ↔ token ids for the model: its tokenizer (Kimi's tiktoken files, or a HF checkpoint's tokenizer.json)
with its structural ids, the chat template and the output-id recipe, and the round-trip validation that proves a
record's ids say exactly what its text says."""
from .config import TokenizerReportConfig
from .hf_tokenizer import HFTokenizer
from .roundtrip import Case, Report, load_truth, plot_token_lengths, sample_cases, validate
from .sequences import (
                        agreement,
                        conversation_ids,
                        load_renderer,
                        output_ids,
                        output_ids_batch,
                        parse_output_ids,
                        prompt_ids,
                        render_chat,
)
from .structure import Structure, ToolSection
from .tokenizer import END_THINK, IM_END, KimiTokenizer, Tokenizer, load_tokenizer

__all__ = ["END_THINK", "IM_END", "Case", "HFTokenizer", "KimiTokenizer", "Report", "Structure", "Tokenizer",
           "ToolSection", "agreement", "conversation_ids", "load_renderer", "load_tokenizer", "load_truth",
           "output_ids", "output_ids_batch", "parse_output_ids", "plot_token_lengths", "prompt_ids", "render_chat",
           "sample_cases", "TokenizerReportConfig", "validate"]

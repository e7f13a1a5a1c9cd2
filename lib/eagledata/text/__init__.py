"""Text ↔ token ids for the target model: the Kimi tokenizer, the chat template and the output-id recipe,
and the round-trip validation that proves a record's ids say exactly what its text says."""
from .config import TokenizerReportConfig
from .roundtrip import Case, Report, load_truth, plot_token_lengths, sample_cases, validate
from .sequences import (
                        agreement,
                        conversation_ids,
                        output_ids,
                        output_ids_batch,
                        parse_output_ids,
                        prompt_ids,
                        render_chat,
)
from .tokenizer import END_THINK, IM_END, KimiTokenizer, Tokenizer, load_tokenizer

__all__ = ["END_THINK", "IM_END", "Case", "KimiTokenizer", "Report", "Tokenizer", "agreement", "conversation_ids",
           "load_tokenizer", "load_truth", "output_ids", "output_ids_batch", "parse_output_ids", "plot_token_lengths",
           "prompt_ids", "render_chat", "sample_cases", "TokenizerReportConfig", "validate"]

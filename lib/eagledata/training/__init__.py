"""Training data for the drafter: records assembled into one training set (dedupe, truncation, length
policy, SpecForge/speculators exports), and the verifier model's EAGLE-3 hidden states over the exact ids."""
from .assembly import Assembly, AssemblyPolicy, Sample, assemble, plot_sequence_lengths
from .config import ExtractionJob, HiddenStatesConfig
from .exports import export_specforge, export_speculators, read_samples
from .job import ExtractOptions, ExtractResult, extract, extract_with_vllm, extract_with_vllm_async, torchrun_world
from .layers import eagle3_layers
from .loader import HiddenStates, plot_state_norms, summary
from .models import find_decoder, load_model
from .storage import finalize

__all__ = ["Assembly", "AssemblyPolicy", "ExtractOptions", "ExtractResult", "ExtractionJob", "HiddenStates",
           "HiddenStatesConfig", "Sample", "assemble", "eagle3_layers", "export_specforge", "export_speculators",
           "extract", "extract_with_vllm", "extract_with_vllm_async", "finalize", "find_decoder", "load_model",
           "plot_sequence_lengths", "plot_state_norms", "read_samples", "summary", "torchrun_world"]

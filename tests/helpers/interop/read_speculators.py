"""Read an exported set exactly as speculators' trainer does, and dump what it yields.

Runs in the interop environment (`make test-interop`: speculators 0.9.0, transformers<=5.19), never in the
project's own: `python read_speculators.py DATA_PATH OUT.pt [VERIFIER [DRAFT_VOCAB_SIZE ...]]`. Every row goes
through `speculators.train.data.ArrowDataset(max_len, datapath, on_missing="raise")`, the class its trainer builds
for `--data-path` with the file backend; each item is then packed by the trainer's own `CollateFn` with the EAGLE-3
`shift_batch`, to show the batch it would train on. The set's `token_freq.pt` is loaded as the trainer loads it
(`torch.load(weights_only=True)`) beside the one speculators' own `save_token_frequency_distribution` counts from
the same Arrow rows. With VERIFIER (a checkpoint directory), the trainer's `parse_vocab_mappings` builds the draft
vocabulary (d2t/t2d) from `<DATA_PATH>/token_freq.pt` for each DRAFT_VOCAB_SIZE (default 32000), as
`speculators train --draft-vocab-size N` does.
"""
import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from speculators.models.eagle3.data import shift_batch
from speculators.train.data import ArrowDataset, CollateFn
from speculators.train.recovery import SampleUnavailable


def token_freq(data_path: str) -> dict:
    """Ours as the trainer loads it, and speculators' own count of the same rows (into a temp folder: its function
    reuses an existing file without recounting)."""
    from datasets import load_from_disk
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    ours = Path(data_path) / "token_freq.pt"
    with tempfile.TemporaryDirectory() as tmp:
        save_token_frequency_distribution(load_from_disk(data_path), Path(tmp) / "token_freq.pt")
        theirs = torch.load(Path(tmp) / "token_freq.pt", weights_only=True)
    return {"ours": torch.load(ours, weights_only=True) if ours.is_file() else None, "speculators": theirs}


def vocab_mappings(data_path: str, verifier: str, sizes: list[int]) -> dict:
    """The trainer's own path from `--draft-vocab-size N` to d2t/t2d (`speculators.train.cli.parse_vocab_mappings`,
    no d2t/t2d given: it reads `<data-path>/token_freq.pt`)."""
    from speculators.train.cli import parse_vocab_mappings

    out = {}
    for n in sizes:
        args = argparse.Namespace(d2t_path=None, t2d_path=None, data_path=data_path, draft_vocab_size=n,
                                  token_freq_path=None, verifier_name_or_path=verifier, trust_remote_code=False)
        d2t, t2d, size = parse_vocab_mappings(args)
        out[n] = {"d2t": d2t, "t2d": t2d, "draft_vocab_size": size}
    return out


def main(data_path: str, out: str, verifier: str | None = None, sizes: list[int] | None = None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a token-id mismatch is only a warning upstream: make it fail here
        ds = ArrowDataset(max_len=8192, datapath=data_path, on_missing="raise")
        items = []
        for i in range(len(ds)):
            item = ds[i]
            if isinstance(item, SampleUnavailable):
                raise SystemExit(f"row {i}: sample unavailable ({item})")
            items.append({k: v.clone() for k, v in item.items()})
    hidden = items[0]["verifier_last_hidden_states"].shape[-1]
    batch = CollateFn(8192, hidden, preprocess=shift_batch)(items)
    dump = {"ids": [str(x) for x in ds.data.with_format(None)["id"]], "items": items,
            "approx_lengths": ds.approx_lengths,
            "batch_shapes": {k: list(v.shape) for k, v in batch.items() if isinstance(v, torch.Tensor)},
            "token_freq": token_freq(data_path)}
    if verifier:
        dump["vocab_mappings"] = vocab_mappings(data_path, verifier, sizes or [32000])
    torch.save(dump, out)
    from importlib.metadata import version

    print(json.dumps({"rows": len(ds), "speculators": version("speculators")}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None, [int(n) for n in sys.argv[4:]])

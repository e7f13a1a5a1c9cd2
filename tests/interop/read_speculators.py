"""Read an exported set exactly as speculators' trainer does, and dump what it yields.

Runs in the interop environment (`make test-interop`: speculators 0.9.0, transformers<=5.19), never in the
project's own: `python read_speculators.py DATA_PATH OUT.pt`. Every row goes through
`speculators.train.data.ArrowDataset(max_len, datapath, on_missing="raise")`, the class its trainer builds for
`--data-path` with the file backend; each item is then packed by the trainer's own `CollateFn` with the EAGLE-3
`shift_batch`, to show the batch it would train on.
"""
import json
import sys
import warnings

import torch
from speculators.models.eagle3.data import shift_batch
from speculators.train.data import ArrowDataset, CollateFn
from speculators.train.recovery import SampleUnavailable


def main(data_path: str, out: str) -> None:
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
    torch.save({"ids": [str(x) for x in ds.data.with_format(None)["id"]], "items": items,
                "approx_lengths": ds.approx_lengths,
                "batch_shapes": {k: list(v.shape) for k, v in batch.items() if isinstance(v, torch.Tensor)}}, out)
    from importlib.metadata import version

    print(json.dumps({"rows": len(ds), "speculators": version("speculators")}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

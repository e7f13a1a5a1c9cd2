"""`torchrun --nproc-per-node N -m eagledata.hidden_states --samples speculators.jsonl --name NAME --model M …`

Data parallel, one model copy per GPU (or `--device-map auto` in one process for a model that needs several).
The export's `<samples>.assembly.json` (written beside it by `export_speculators`: the providers its assembly
left out, and why) goes into the manifest under `assembly`, as the notebook's run records it.
Flags are the fields of `eagledata.training.ExtractionJob` (`--help` lists them; `--layout` picks eagledata,
speculators or specforge); the extraction itself lives in `eagledata.training`. Each rank prints one JSON line
with what it did.

`--backend vllm --server URL` takes the states from a running `vllm serve` with speculators' hidden-states
extraction instead (one process, no torchrun, no model loaded here); `python -m eagledata.hidden_states
serve-command --model DIR --tp 8` prints that server's command line.

`python -m eagledata.hidden_states convert --layout speculators SRC DST` rewrites a finished set in a
trainer's layout without recompute, and prints one JSON line.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Sequence

from .errors import build_settings, command_prog, run_command

PROG = ("eagledata-hidden-states", "eagledata.hidden_states")  # the console script, the module



def emit(report: dict) -> None:
    """The command's result as one JSON line, in one write: the ranks of a torchrun share stdout, and a line written
    in two pieces (text, then newline: what print does on an unbuffered stream) can interleave with another's."""
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()

def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["convert"]:
        return convert_main(argv[1:])
    if argv[:1] == ["serve-command"]:
        return serve_command_main(argv[1:])
    import torch

    from .training import ExtractionJob, read_samples, torchrun_world
    from .training.exports import read_provenance

    parser = argparse.ArgumentParser(prog=command_prog(*PROG), description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", required=True, help="speculators export: {id, input_ids, loss_mask} per line")
    ExtractionJob.add_arguments(parser)
    args = parser.parse_args(argv)
    job = build_settings(parser, lambda: ExtractionJob.from_args(args))
    rank, world_size = torchrun_world()
    if job.backend == "vllm":
        def run_vllm() -> None:
            r = job.run(read_samples(args.samples), assembly=read_provenance(args.samples))
            emit({"backend": "vllm", "extracted": r.extracted, "skipped": r.skipped, "tokens": r.tokens,
                  "seconds": round(r.seconds, 3), "complete": r.complete})

        return run_command(parser.prog, run_vllm)
    device = job.resolved_device()

    def run() -> None:
        try:
            result = job.run(read_samples(args.samples), device=_init_distributed(device, rank, world_size, job.tp),
                             progress=rank == 0, assembly=read_provenance(args.samples))
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        emit({"rank": rank, "world_size": world_size, "extracted": result.extracted, "skipped": result.skipped,
              "tokens": result.tokens, "tp": result.tp, "weight_bytes": result.weight_bytes,
              "seconds": round(result.seconds, 3), "complete": result.complete})

    return run_command(parser.prog, run)


def convert_main(argv: Sequence[str]) -> int:
    from .training.convert import convert
    from .training.scoring import ExcludeSamples
    from .training.storage import LAYOUTS

    parser = argparse.ArgumentParser(prog=f"{command_prog(*PROG)} convert",
                                     description="Rewrite a finished hidden-states set in another layout "
                                                 "(no recompute; resumes)")
    parser.add_argument("--layout", required=True, choices=list(LAYOUTS))
    parser.add_argument("source", help="a finished set: <output_dir>/hidden_states/<name>")
    parser.add_argument("destination", help="the directory the trainer will be pointed at")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes writing in parallel (default: cores + 1, at most 16; one for a small set)")
    parser.add_argument("--exclude-providers", nargs="+", default=(), metavar="PROVIDER",
                        help="leave out every sample these providers served (the audit's suspects)")
    parser.add_argument("--max-sample-nll", type=float, default=None,
                        help="leave out samples whose mean NLL per scored token under the verifier is above this")
    parser.add_argument("--exclude-ids", nargs="+", default=(), metavar="ID", help="leave out these samples")
    parser.add_argument("--reason", default="", help="why, in words (recorded in the manifest's `excluded`)")
    args = parser.parse_args(argv)
    exclude = None
    if args.exclude_providers or args.max_sample_nll is not None or args.exclude_ids:
        exclude = build_settings(parser, lambda: ExcludeSamples(tuple(args.exclude_providers), args.max_sample_nll,
                                                                tuple(args.exclude_ids), args.reason))

    def run() -> None:
        r = convert(args.source, args.destination, args.layout, workers=args.workers, exclude=exclude)
        emit({"directory": str(r.directory), "layout": args.layout, "converted": r.converted,
              "excluded": (r.manifest.get("excluded") or {}).get("samples", 0), "skipped": r.skipped,
              "workers": r.workers, "seconds": round(r.seconds, 3),
              "mb_per_s": round(r.bytes_written / 1e6 / r.seconds, 1) if r.seconds else None})

    return run_command(parser.prog, run)


def serve_command_main(argv: Sequence[str]) -> int:
    """Print the `vllm serve` line for `--backend vllm` (run it on the GPU node)."""
    import shlex

    from .training import ExtractionJob, ExtractOptions
    from .training.vllm_backend import VllmOptions

    parser = argparse.ArgumentParser(prog=f"{command_prog(*PROG)} serve-command",
                                     description=serve_command_main.__doc__)
    parser.add_argument("--model", required=True, help="the checkpoint directory the server loads")
    parser.add_argument("--tp", type=int, default=1, help="--tensor-parallel-size (default: 1)")
    parser.add_argument("--layers", type=int, nargs=3, default=None,
                        help="three HF hidden_states indices (default: the EAGLE-3 rule {2, L//2, L-3})")
    parser.add_argument("--shared-storage-path", default=VllmOptions().shared_storage_path,
                        help="where the connector writes; readable at the same path where eagledata runs")
    args = parser.parse_args(argv)
    job = build_settings(parser, lambda: ExtractionJob(model=args.model, tp=args.tp, backend="vllm",
                                                       options=ExtractOptions(layers=args.layers),
                                                       vllm=VllmOptions(shared_storage_path=args.shared_storage_path)))

    def run() -> None:
        print(shlex.join(job.vllm_command()), flush=True)

    return run_command(parser.prog, run)


def _init_distributed(device: str, rank: int, world_size: int, tp: int = 1) -> str:
    """Under torchrun: this rank's GPU and a process group (nccl on GPUs, gloo on CPU).

    With dp > 1 data-parallel copies of a tp > 1 tensor-parallel model, each copy gets a process group of
    its own (ranks dp_rank*tp … dp_rank*tp + tp-1, rendezvous on MASTER_PORT + 1 + dp_rank): transformers'
    tensor parallelism spans the default group's whole world, and replicas in one world would need its
    FSDP wrappers, which do not run a decoder called on its own. The copies share nothing but the files.
    """
    import torch

    if world_size > 1:
        cuda = device.startswith("cuda")
        if cuda:
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}"
            torch.cuda.set_device(device)
        backend = "nccl" if cuda else "gloo"
        if 1 < tp < world_size and world_size % tp == 0:
            port = int(os.environ["MASTER_PORT"]) + 1 + rank // tp
            store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], port, tp, is_master=rank % tp == 0)
            torch.distributed.init_process_group(backend, store=store, rank=rank % tp, world_size=tp)
        else:
            torch.distributed.init_process_group(backend)
    return device


if __name__ == "__main__":
    code = main()
    gc.freeze()  # exiting: the interpreter's last collection would walk all that is left (0.5 s after a conversion)
    sys.exit(code)

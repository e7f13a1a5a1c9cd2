"""Hidden states from a serving engine: a `vllm serve` running speculators' hidden-states extraction, driven
over HTTP, its states stored by the same writers (layouts, resume, manifest) as the transformers path.

The transformers path cannot hold Kimi-K2.5 (it dequantizes the INT4 experts: README, "At the real
target's scale"); vLLM keeps them packed. This module is the client side of speculators 0.9.0's route, read
from its code (not copied):

- **The server** (speculators `scripts/launch_vllm.py`, `hs_connectors.transfer.FileBackend
  .build_kv_transfer_config`): `vllm serve MODEL --speculative-config '{"method": "extract_hidden_states",
  "num_speculative_tokens": 1, "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids":
  IDS}}}' --kv-transfer-config '{"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
  "kv_connector_extra_config": {"shared_storage_path": DIR}}'`. IDS defaults to `[2, L//2, L-3, L]`
  (`--include-last-layer` appends L). `vllm_serve_command` builds that line.
- **One request per sample** (`data_generation/vllm_client.generate_hidden_states_async`): `POST
  /v1/completions` with `prompt` = the token ids, `max_tokens` = 1 and `return_token_ids` = true (the
  OpenAI client's `extra_body` puts it at the top level of the JSON): a prefill.
- **The answer** (`vllm_client.extract_output`): `choices[0].prompt_token_ids` must equal the ids sent;
  top-level `kv_transfer_params` names the file, under `hidden_states_path` (speculators also accepts
  `handle`).
- **The file** (vLLM `distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py`:
  `request_finished`, `_write_tensors`, `load_hidden_states`, `cleanup_hidden_states`): safetensors at
  `DIR/<request id>.safetensors` with `hidden_states` [T, len(IDS), H] in the model dtype and `token_ids`
  int64 [T]. It may still be being written when the answer arrives: the connector holds an exclusive
  `flock` on `<file>.lock` until it is complete, so a reader takes a shared lock first. The reader owns the
  file afterwards (speculators `cli/generate_offline_data._worker` moves it away; vLLM's
  `cleanup_hidden_states` deletes file and lock): we read it and delete both.
- **Layer numbering** (vLLM `models/deepseek_v2.DeepseekV2Model.forward`, speculators
  `models/utils.resolve_target_layer_ids`): id `i < L` is `hidden_states + residual` entering decoder layer
  `i`, which is HF `hidden_states[i]` (our manifest `layers`); id `L` is the last layer's output **before**
  the final norm. vLLM collects them in layer order, once per layer, so the ids must be distinct and
  increasing (speculators refuses duplicates too). speculators' trainer splits the file into
  `hidden_states[:, :-1]` (aux) and `[:, -1]` (its `verifier_norm` then normalizes it: `train/data.py`,
  `models/eagle3/core.py`), so the engine's last state is `pre_norm`. A layout that wants `post_norm`
  gets the checkpoint's final RMSNorm applied here (`FinalNorm`).
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence
from urllib.parse import urlsplit, urlunsplit

import torch

from ..aio import run_sync
from ..errors import InputError
from ..layout import HiddenStateFiles, hidden_state_files
from ..settings import Settings, setting
from ..status import StatusLog, duration, ensure_log_handler, eta_s, widget_frontend
from .assembly import Sample

if TYPE_CHECKING:
    import httpx

    from .extraction import ExtractOptions, ExtractResult

log = logging.getLogger("eagledata.hidden_states")

Backend = Literal["transformers", "vllm"]
ENGINE_FINAL = "pre_norm"  # vLLM's id L: the last decoder layer's output, before the final norm
ENGINE_DTYPE = torch.bfloat16  # what the printed command serves (`--dtype bfloat16`) and every file must hold
CONNECTOR = "ExampleHiddenStatesConnector"
DEFAULT_SHARED_STORAGE_PATH = "/tmp/hidden_states"  # speculators' FileBackend default
LOCK_POLL_S = 0.01


class EngineError(RuntimeError):
    """The server failed or answered something the hidden-states connector never writes (a command exits 1)."""


# -- layer numbering (pure) ----------------------------------------------------------------------
def engine_layer_ids(layers: Sequence[int], num_layers: int) -> list[int]:
    """Manifest `layers` (HF `hidden_states` indices of the 3 aux states) -> vLLM's
    `eagle_aux_hidden_state_layer_ids`: the same numbers, then `num_layers` for the pre-norm final state."""
    ids = [int(i) for i in layers]
    if len(ids) != 3 or not all(0 <= i < num_layers for i in ids):
        raise InputError(f"layers must be three HF hidden_states indices in 0..{num_layers - 1}, got {ids}",
                         field="layers")
    if any(a >= b for a, b in zip(ids, ids[1:])):
        raise InputError(f"the vllm backend needs distinct, increasing layers (vLLM captures each layer once, in "
                         f"layer order), got {ids}", field="layers")
    return [*ids, num_layers]


def manifest_layers(layer_ids: Sequence[int], num_layers: int) -> tuple[int, int, int]:
    """vLLM's `eagle_aux_hidden_state_layer_ids` (3 aux ids + `num_layers`) -> manifest `layers`."""
    ids = [int(i) for i in layer_ids]
    if len(ids) != 4 or ids[-1] != num_layers:
        raise InputError(f"expected 3 aux layer ids then {num_layers} (the final state), got {ids}",
                         field="layer_ids")
    aux = ids[:3]
    engine_layer_ids(aux, num_layers)  # same checks as the forward direction
    return aux[0], aux[1], aux[2]


def vllm_serve_command(model: str | Path, layer_ids: Sequence[int], *, tp: int = 1,
                       shared_storage_path: str | Path = DEFAULT_SHARED_STORAGE_PATH, port: int = 8000,
                       extra: Sequence[str] = ()) -> list[str]:
    """The `vllm serve` line (argv) speculators' `scripts/launch_vllm.py` runs, for the GPU node.

    `shared_storage_path` must be visible at the same path where eagledata runs (the answer names a file in
    it). `extra`: more vLLM flags (`--trust-remote-code`, `--max-model-len N`, …)."""
    speculative = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                   "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}}}
    transfer = {"kv_connector": CONNECTOR, "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(shared_storage_path)}}
    return ["vllm", "serve", str(model), "--tensor-parallel-size", str(tp),
            "--dtype", str(ENGINE_DTYPE).replace("torch.", ""), "--port", str(port),
            "--speculative-config", json.dumps(speculative), "--kv-transfer-config", json.dumps(transfer), *extra]


def public_url(url: str) -> str:
    """The server URL without credentials, query or fragment: what a manifest or a log line may show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def api_base(server: str) -> str:
    """`http://host:8000` or `http://host:8000/v1` -> the OpenAI base `…/v1`."""
    base = server.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


# -- the final norm, for layouts that want post-norm -----------------------------------------------------
NORM_KEY = re.compile(r"(?:^|\.)model\.norm\.weight$")


@dataclass(frozen=True)
class FinalNorm:
    """The decoder's final RMSNorm, read from the checkpoint, applied as transformers does (statistics in
    fp32, the normalized state cast back to the input dtype, then times the weight)."""

    weight: torch.Tensor
    eps: float
    key: str

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(h.dtype) * x.to(h.dtype)

    @classmethod
    def from_checkpoint(cls, model: str | Path, config: dict[str, Any]) -> "FinalNorm":
        from safetensors import safe_open

        directory = Path(str(model))
        index = directory / "model.safetensors.index.json"
        if index.is_file():
            where = json.loads(index.read_text())["weight_map"]
        else:
            where = {}
            for path in sorted(directory.glob("*.safetensors")):
                with safe_open(str(path), framework="pt") as f:
                    where.update({k: path.name for k in f.keys()})
        keys = [k for k in where if NORM_KEY.search(k)]
        if len(keys) != 1:
            raise InputError(f"final=post_norm with the vllm backend applies the checkpoint's final norm, but "
                             f"{directory} has {len(keys)} candidates for it ({keys[:4]}); give the checkpoint "
                             f"directory, or use final=pre_norm", field="final")
        with safe_open(str(directory / where[keys[0]]), framework="pt") as f:
            weight = f.get_tensor(keys[0])
        text = config.get("text_config") or config
        return cls(weight, float(text.get("rms_norm_eps", 1e-6)), keys[0])


# -- settings ----------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class EngineOptions(Settings):
    """How to reach the server and how hard to push it (backend = vllm only)."""

    server: str | None = setting(None, "vllm backend: the server's URL, e.g. http://gpu-node:8000/v1")
    server_api_key_env: str = setting("VLLM_API_KEY", "vllm backend: the key (vllm serve --api-key) is read from "
                                                      "this variable when set, never stored")
    server_concurrency: int = setting(32, "vllm backend: requests in flight")
    server_timeout_s: float = setting(120.0, "vllm backend: one request, and the wait for its file")
    server_attempts: int = setting(4, "vllm backend: tries per sample on connection errors, 5xx and 429")
    server_retry_s: float = setting(1.0, "vllm backend: backoff base (x2 per attempt, at most 30 s)")
    shared_storage_path: str = setting(DEFAULT_SHARED_STORAGE_PATH, "vllm backend: the connector's folder in "
                                       "the serve command; must be readable here at the same path")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("server_concurrency", "server_attempts"):
            if getattr(self, name) < 1:
                raise InputError(f"must be a positive integer, got {getattr(self, name)!r}", field=name)
        for name in ("server_timeout_s", "server_retry_s"):
            if not getattr(self, name) > 0:
                raise InputError(f"must be > 0, got {getattr(self, name)!r}", field=name)


# -- one sample ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Expect:
    """What every file must hold: `num_states` per token of `hidden_size`, in ENGINE_DTYPE."""

    num_states: int
    hidden_size: int
    norm: FinalNorm | None  # applied to the last state when the layout wants post-norm


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


async def _complete(client: httpx.AsyncClient, model: str, sample: Sample, opts: EngineOptions) -> dict[str, Any]:
    """One prefill (speculators' request), retried on connection errors, 5xx and 429 with backoff."""
    import httpx  # here, not at the top: the rest of `eagledata.training` (a conversion, say) loads without it

    body = {"model": model, "prompt": sample.input_ids, "max_tokens": 1, "return_token_ids": True}
    why = ""
    for attempt in range(1, opts.server_attempts + 1):
        wait = min(30.0, opts.server_retry_s * 2 ** (attempt - 1))
        try:
            r = await client.post("completions", json=body)
        except httpx.TransportError as e:
            why = f"{type(e).__name__}: {e}"
        else:
            if r.status_code == 200:
                try:
                    return r.json()
                except ValueError:
                    raise EngineError(f"sample {sample.id!r}: the answer is not JSON: {r.text[:200]!r}") from None
            if r.status_code in (401, 403):
                raise EngineError(f"sample {sample.id!r}: HTTP {r.status_code} from the server: set "
                                  f"${opts.server_api_key_env} to the key vllm serve was started with")
            if r.status_code != 429 and r.status_code < 500:
                raise EngineError(f"sample {sample.id!r}: the server refused it: HTTP {r.status_code}: "
                                  f"{r.text[:300]}")
            why = f"HTTP {r.status_code}"
            asked = _retry_after(r)
            wait = min(30.0, wait if asked is None else asked)
        if attempt < opts.server_attempts:
            log.warning("sample %r: %s; retry %d/%d in %.2f s", sample.id, why, attempt, opts.server_attempts - 1,
                        wait)
            await asyncio.sleep(wait)
    raise EngineError(f"sample {sample.id!r}: no answer after {opts.server_attempts} attempts; last: {why}")


def states_path(answer: dict[str, Any], sample: Sample) -> str:
    """The file the connector names, after checking the answer echoes the sample's ids."""
    try:
        echoed = answer["choices"][0].get("prompt_token_ids")
    except (KeyError, IndexError, TypeError, AttributeError):
        echoed = None
    if echoed is None:
        raise EngineError(f"sample {sample.id!r}: the answer has no choices[0].prompt_token_ids (a vLLM that "
                          "supports return_token_ids is needed)")
    if list(echoed) != list(sample.input_ids):
        at = next((i for i, (a, b) in enumerate(zip(echoed, sample.input_ids)) if a != b),
                  min(len(echoed), len(sample.input_ids)))
        raise EngineError(f"sample {sample.id!r}: the server's prompt_token_ids differ from the sample's "
                          f"input_ids from position {at} ({len(echoed)} vs {len(sample.input_ids)} tokens)")
    params = answer.get("kv_transfer_params") or {}
    path = params.get("hidden_states_path") or params.get("handle")
    if not path:
        raise EngineError(f"sample {sample.id!r}: the answer has no kv_transfer_params.hidden_states_path: is the "
                          f"server running with --kv-transfer-config naming {CONNECTOR}?")
    return str(path)


def _wait_for_writer(path: str, timeout_s: float) -> None:
    """Block until the connector's exclusive lock on `<path>.lock` is released (absent lock: written)."""
    try:
        fd = os.open(path + ".lock", os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EngineError(f"{path}: the connector still writes it after {timeout_s:.0f} s") from None
                time.sleep(LOCK_POLL_S)
    finally:
        os.close(fd)


def read_states(path: str, sample: Sample, expect: Expect, timeout_s: float) -> torch.Tensor:
    """[T, 4, H] of one sample from the connector's file (which is then deleted, with its lock)."""
    from safetensors.torch import load_file

    if not os.path.exists(path) and not os.path.exists(path + ".lock"):
        raise EngineError(f"sample {sample.id!r}: the connector wrote {path}, which this machine cannot see: run "
                          "eagledata where the server's shared_storage_path is mounted at the same path")
    _wait_for_writer(path, timeout_s)
    if not os.path.exists(path):
        raise EngineError(f"sample {sample.id!r}: the connector released {path}.lock without writing the file "
                          "(see the server's log)")
    data = load_file(path)
    for p in (path + ".lock", path):
        if os.path.exists(p):
            os.remove(p)
    hs, ids = data.get("hidden_states"), data.get("token_ids")
    if hs is None or ids is None:
        raise EngineError(f"sample {sample.id!r}: {path} holds {sorted(data)}, not hidden_states and token_ids")
    if ids.tolist() != list(sample.input_ids):
        raise EngineError(f"sample {sample.id!r}: {path} holds states of other token ids")
    shape = (len(sample), expect.num_states, expect.hidden_size)
    if tuple(hs.shape) != shape or hs.dtype != ENGINE_DTYPE:
        raise EngineError(f"sample {sample.id!r}: {path} holds {hs.dtype} {list(hs.shape)}, expected {ENGINE_DTYPE} "
                          f"{list(shape)}: was the server started with the printed command?")
    if not bool(torch.isfinite(hs).all()):
        raise EngineError(f"sample {sample.id!r}: {path} holds non-finite states")
    if expect.norm is not None:
        hs = hs.clone()
        hs[:, 3] = expect.norm(hs[:, 3])
    return hs


async def served_model(client: httpx.AsyncClient, server: str) -> str:
    """The id the server serves (requests must name it), and a reachability check before any work."""
    import httpx

    try:
        r = await client.get("models")
    except httpx.TransportError as e:
        raise EngineError(f"cannot reach {public_url(server)}: {type(e).__name__}: {e}") from None
    if r.status_code in (401, 403):
        raise EngineError(f"{public_url(server)}: HTTP {r.status_code}: set the key vllm serve was started with")
    try:
        listed = r.json().get("data") or [] if r.status_code == 200 else []
    except ValueError:
        listed = []
    if not listed:
        raise EngineError(f"{public_url(server)}/models: HTTP {r.status_code}, no model listed (still loading?)")
    return str(listed[0]["id"])


# -- the run ------------------------------------------------------------------------------------------------
def model_config(model: str | Path) -> dict[str, Any]:
    """config.json of the served checkpoint (K2.5's published values for its hub id: nothing to download)."""
    from .memory import kimi_k25_config
    from .quantized import read_config

    if str(model) == "moonshotai/Kimi-K2.5" and not Path(str(model), "config.json").is_file():
        return kimi_k25_config()
    return read_config(model)


def check_backend(files: HiddenStateFiles, backend: Backend) -> None:
    """A set is made by one backend: resuming it with the other would mix their roundings and conventions."""
    if files.plan.is_file():
        old = json.loads(files.plan.read_text()).get("backend", "transformers")
        if old != backend:
            raise InputError(f"{files.directory} was made by the {old} backend, not {backend}; use another name",
                             files.plan, field="backend")


async def extract_with_engine_async(samples: Sequence[Sample], output_dir: str | Path, name: str, model: str | Path,
                                    *, engine: EngineOptions, options: "ExtractOptions | None" = None,
                                    tokenizer_fingerprint: str = "", records_hashes: dict[str, str] | None = None,
                                    progress: bool = True, status_interval_s: float = 10.0) -> "ExtractResult":
    """Hidden states of `samples` from the server at `engine.server` into `<output_dir>/hidden_states/<name>/`,
    resuming what is stored: the transformers path's writers, plan check and manifest, with
    `backend: vllm` in the plan and an `engine` record in the manifest."""
    from .extraction import ExtractOptions, ExtractResult, check_samples, plan_doc, resolve_layers  # (a cycle)
    from .storage import check_plan, check_stored, finalize, get_layout, read_parts

    options = options or ExtractOptions()
    if not engine.server:
        raise InputError("the vllm backend needs the server's URL", field="server")
    config = model_config(model)
    text = config.get("text_config") or config
    num_layers, hidden_size, vocab = int(text["num_hidden_layers"]), int(text["hidden_size"]), int(text["vocab_size"])
    layout = get_layout(options.layout)
    layout.check_storage(options.storage)
    check_samples(samples, vocab)
    layers = resolve_layers(options.layers, num_layers)
    layer_ids = engine_layer_ids(layers, num_layers)
    final = options.resolved_final()
    norm = FinalNorm.from_checkpoint(model, config) if final == "post_norm" else None
    files = hidden_state_files(name, output_dir)
    plan = {**plan_doc(str(model), f"vllm:{(config.get('architectures') or ['?'])[0]}", num_layers, hidden_size, vocab,
                       layers, options, ENGINE_DTYPE), "backend": "vllm"}
    files.directory.mkdir(parents=True, exist_ok=True)
    files.parts.mkdir(exist_ok=True)
    check_backend(files, "vllm")
    check_plan(files, plan)
    writer = layout.writer(files, files.parts / f"vllm-{uuid.uuid4().hex[:8]}.jsonl", options.storage,
                           options.shard_bytes, hidden_size, {s.id: i for i, s in enumerate(samples)})
    done = read_parts(files)
    check_stored(files, writer, samples, done)
    todo = [s for s in samples if s.id not in done]
    if not todo and files.manifest.is_file():  # finished earlier: nothing to ask the server, nothing to rewrite
        writer.close()
        return ExtractResult(directory=files.directory, rank=0, world_size=1, extracted=0, skipped=len(samples),
                             tokens=0, seconds=0.0, complete=True, manifest=json.loads(files.manifest.read_text()))
    expect = Expect(len(layer_ids), hidden_size, norm)
    total = sum(len(s) for s in todo)
    key = os.environ.get(engine.server_api_key_env)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    start = time.perf_counter()
    state = {"tokens": 0, "samples": 0}
    bar = status = None
    if progress and widget_frontend():
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="tok", desc=f"vllm {name}")
    elif progress:
        ensure_log_handler()
        status = StatusLog(status_interval_s, "eagledata.hidden_states")

    def line() -> str:
        elapsed = time.perf_counter() - start
        share = 100 * state["tokens"] / total if total else 100.0
        return (f"hidden states {name} via {public_url(engine.server)}: {state['tokens']:,}/{total:,} tokens "
                f"({share:.1f}%), {state['samples']:,}/{len(todo):,} samples | "
                f"{state['tokens'] / max(elapsed, 1e-9):,.0f} tok/s | ETA {duration(eta_s(state['tokens'], total, elapsed))}")

    queue = iter(todo)  # shared by the workers: each sample is taken once

    async def worker(client: httpx.AsyncClient, served: str) -> None:
        for sample in queue:
            answer = await _complete(client, served, sample, engine)
            path = states_path(answer, sample)
            states = await asyncio.to_thread(read_states, path, sample, expect, engine.server_timeout_s)
            # in the loop's thread, never concurrently: the writer is not thread-safe (it writes in its own thread)
            writer.add([sample], states)
            state["tokens"] += len(sample)
            state["samples"] += 1
            if bar is not None:
                bar.update(len(sample))
            if status is not None:
                status.maybe(line)

    import httpx

    served = ""
    limits = httpx.Limits(max_connections=engine.server_concurrency, max_keepalive_connections=engine.server_concurrency)
    try:
        async with httpx.AsyncClient(base_url=api_base(engine.server) + "/", headers=headers, limits=limits,
                                     timeout=engine.server_timeout_s) as client:
            served = await served_model(client, engine.server)
            tasks = [asyncio.create_task(worker(client, served)) for _ in range(min(engine.server_concurrency,
                                                                                     len(todo)))]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                writer.flush()  # keep what finished: a rerun resumes after it
                raise
        writer.flush()
    finally:
        writer.close()
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    if status is not None:
        status.emit(line() + f" | ended after {duration(seconds)}")
    record = {"backend": "vllm", "server": public_url(engine.server), "served_model": served, "connector": CONNECTOR,
              "layer_ids": layer_ids, "last_state": ENGINE_FINAL,
              "final_norm": f"applied by eagledata ({norm.key}, eps {norm.eps})" if norm else None}
    manifest = finalize(files, samples, tokenizer_fingerprint=tokenizer_fingerprint, records_hashes=records_hashes,
                        extra={"engine": record})
    return ExtractResult(directory=files.directory, rank=0, world_size=1, extracted=len(todo),
                         skipped=len(samples) - len(todo), tokens=total, seconds=seconds,
                         complete=manifest is not None, manifest=manifest)


def extract_with_engine(*args: Any, **kwargs: Any) -> "ExtractResult":
    """`extract_with_engine_async` from plain code (in Jupyter: `await extract_with_engine_async(...)`)."""
    return run_sync(extract_with_engine_async(*args, **kwargs), "extract_with_engine_async")

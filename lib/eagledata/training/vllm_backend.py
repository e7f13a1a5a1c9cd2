"""The vLLM backend: hidden states from a `vllm serve` running speculators' hidden-states extraction, driven over
HTTP and yielded sample by sample to the job (`job.run_extraction`), which stores them as it stores the
transformers backend's (layouts, resume, manifest). The HTTP transport is injectable (`transport`: tests pass
one that counts or rewrites answers), as generation injects its completion function.

The transformers path cannot hold Kimi-K2.5 (it dequantizes the INT4 experts: README, "At the real
verifier's scale"); vLLM keeps them packed. This module is the client side of speculators 0.9.0's route, read
from its code (not copied):

- **The server** (speculators `scripts/launch_vllm.py`, `hs_connectors.transfer.FileBackend
  .build_kv_transfer_config`): `vllm serve MODEL --speculative-config '{"method": "extract_hidden_states",
  "num_speculative_tokens": 1, "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids":
  IDS}}}' --kv-transfer-config '{"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
  "kv_connector_extra_config": {"shared_storage_path": DIR}}'`. IDS defaults to `[2, L//2, L-3, L]`
  (`--include-last-layer` appends L). `vllm_serve_command` builds that line; `layers.vllm_layer_ids` the ids.
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
  increasing (speculators refuses duplicates too; `layers.vllm_layer_ids`). speculators' trainer splits the
  file into `hidden_states[:, :-1]` (aux) and `[:, -1]` (its `verifier_norm` then normalizes it:
  `train/data.py`, `models/eagle3/core.py`), so the server's last state is `pre_norm`. A layout that wants
  `post_norm` gets the checkpoint's final RMSNorm applied here (`FinalNorm`).
- **The verifier's log-probabilities** (the audit's `score`; vLLM `entrypoints/openai/completion/protocol.py`,
  `gpu_model_runner._get_prompt_logprobs_dict`): the same request adds `prompt_logprobs: 0`; the answer's
  `choices[0].prompt_logprobs` holds, per position after the first, the sent token's raw float32 log-probability
  (`scored_logprobs`). Such a request skips vLLM's prefix cache and makes it compute the lm_head at every position.
- **Several servers**: one client and `server_concurrency` workers per server, all taking samples from one queue.

Checked against a real vLLM 0.32.0 on CPU by `make test-vllm` (tests/training/test_vllm_real.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import torch

from ..errors import InputError
from ..retry import retry_delay_s
from ..settings import Settings, setting
from .assembly import Sample
from .layers import vllm_layer_ids
from .memory import model_config
from .source import StatesBatch, VerifierInfo, scored_positions
from .storage import FinalState

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("eagledata.hidden_states")

VLLM_FINAL = "pre_norm"  # vLLM's id L: the last decoder layer's output, before the final norm
VLLM_DTYPE = torch.bfloat16  # what the printed command serves (`--dtype bfloat16`) and every file must hold
CONNECTOR = "ExampleHiddenStatesConnector"
DEFAULT_SHARED_STORAGE_PATH = "/tmp/hidden_states"  # speculators' FileBackend default
LOCK_POLL_S = 0.01
RETRY_CAP_S = 30.0


class VllmError(RuntimeError):
    """The server failed or answered something the hidden-states connector never writes (a command exits 1)."""


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
            "--dtype", str(VLLM_DTYPE).replace("torch.", ""), "--port", str(port),
            "--speculative-config", json.dumps(speculative), "--kv-transfer-config", json.dumps(transfer), *extra]


def public_url(url: str | Sequence[str]) -> str:
    """The server URL without credentials, query or fragment: what a manifest or a log line may show (several
    servers: each, comma-separated)."""
    if not isinstance(url, str):
        return ", ".join(public_url(u) for u in url)
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
    def from_checkpoint(cls, model: str | Path, config: dict[str, Any]) -> FinalNorm:
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
class VllmOptions(Settings):
    """How to reach the server and how hard to push it (backend = vllm only)."""

    # One URL or several (a list; several values on the command line): one vllm serve each, all kept busy. The
    # help stays one URL's: it is the notebook's parameters cell, which its owner regenerates.
    server: str | list[str] | None = setting(
        None, "vllm backend: the server's URL, e.g. http://gpu-node:8000/v1; several (a list, or several values "
              "on the command line): one vllm serve each, every one kept busy", cli_many=True)
    server_api_key_env: str = setting("VLLM_API_KEY", "vllm backend: the key (vllm serve --api-key) is read from "
                                                      "this variable when set, never stored")
    server_concurrency: int = setting(32, "vllm backend: requests in flight, per server")
    server_timeout_s: float = setting(120.0, "vllm backend: one request, and the wait for its file")
    server_attempts: int = setting(4, "vllm backend: tries per sample on connection errors, 5xx and 429")
    server_retry_s: float = setting(1.0, "vllm backend: backoff base (jittered, x2 per attempt, at most 30 s; "
                                         "a 429's Retry-After instead)")
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
        servers = self.servers()
        if not all(servers) or len(set(map(api_base, servers))) != len(servers):
            raise InputError(f"the servers must be distinct, non-empty URLs, got {self.server!r}", field="server")

    def servers(self) -> list[str]:
        """The server URLs, one or several (none when unset)."""
        if self.server is None:
            return []
        return [self.server] if isinstance(self.server, str) else list(self.server)


# -- one sample ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Expect:
    """What every file must hold: `num_states` per token of `hidden_size`, in VLLM_DTYPE."""

    num_states: int
    hidden_size: int
    norm: FinalNorm | None  # applied to the last state when the layout wants post-norm


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


async def complete(client: httpx.AsyncClient, model: str, sample: Sample, opts: VllmOptions,
                   score: bool = False) -> dict[str, Any]:
    """One prefill (speculators' request), retried on connection errors, 5xx and 429 by the shared rule
    (`eagledata.retry`: jittered backoff, a 429's Retry-After). `score`: the same request also asks for the
    log-probability of every prompt token (`prompt_logprobs: 0`: the sent token's only, no alternatives)."""
    import httpx  # here, not at the top: the rest of `eagledata.training` (a conversion, say) loads without it

    body = {"model": model, "prompt": sample.input_ids, "max_tokens": 1, "return_token_ids": True}
    if score:
        body["prompt_logprobs"] = 0
    why, asked, rate_limited = "", None, 0
    for attempt in range(1, opts.server_attempts + 1):
        try:
            r = await client.post("completions", json=body)
        except httpx.TransportError as e:
            why, asked, rate_limited = f"{type(e).__name__}: {e}", None, 0
        else:
            if r.status_code == 200:
                try:
                    return r.json()
                except ValueError:
                    raise VllmError(f"sample {sample.id!r}: the answer is not JSON: {r.text[:200]!r}") from None
            if r.status_code in (401, 403):
                raise VllmError(f"sample {sample.id!r}: HTTP {r.status_code} from the server: set "
                                f"${opts.server_api_key_env} to the key vllm serve was started with")
            if r.status_code != 429 and r.status_code < 500:
                raise VllmError(f"sample {sample.id!r}: the server refused it: HTTP {r.status_code}: "
                                f"{r.text[:300]}")
            why, asked = f"HTTP {r.status_code}", _retry_after(r)
            rate_limited = rate_limited + 1 if r.status_code == 429 else 0
        if attempt < opts.server_attempts:
            wait = retry_delay_s(asked, attempt, rate_limited, base_s=opts.server_retry_s, cap_s=RETRY_CAP_S)
            log.warning("sample %r: %s; retry %d/%d in %.2f s", sample.id, why, attempt, opts.server_attempts - 1,
                        wait)
            await asyncio.sleep(wait)
    raise VllmError(f"sample {sample.id!r}: no answer after {opts.server_attempts} attempts; last: {why}")


def states_path(answer: dict[str, Any], sample: Sample) -> str:
    """The file the connector names, after checking the answer echoes the sample's ids."""
    try:
        echoed = answer["choices"][0].get("prompt_token_ids")
    except (KeyError, IndexError, TypeError, AttributeError):
        echoed = None
    if echoed is None:
        raise VllmError(f"sample {sample.id!r}: the answer has no choices[0].prompt_token_ids (a vLLM that "
                        "supports return_token_ids is needed)")
    if list(echoed) != list(sample.input_ids):
        at = next((i for i, (a, b) in enumerate(zip(echoed, sample.input_ids)) if a != b),
                  min(len(echoed), len(sample.input_ids)))
        raise VllmError(f"sample {sample.id!r}: the server's prompt_token_ids differ from the sample's "
                        f"input_ids from position {at} ({len(echoed)} vs {len(sample.input_ids)} tokens)")
    params = answer.get("kv_transfer_params") or {}
    path = params.get("hidden_states_path") or params.get("handle")
    if not path:
        raise VllmError(f"sample {sample.id!r}: the answer has no kv_transfer_params.hidden_states_path: is the "
                        f"server running with --kv-transfer-config naming {CONNECTOR}?")
    return str(path)


def scored_logprobs(answer: dict[str, Any], sample: Sample) -> torch.Tensor:
    """float32 [len(scored_positions(sample))]: the verifier's log p(token[j] | tokens[:j]) at each scored position,
    from `choices[0].prompt_logprobs` (vLLM: entry 0 is None, entry j a dict keyed by token id, as a string in
    JSON, of `{"logprob", "rank", "decoded_token"}`; with `prompt_logprobs: 0` it holds the sent token alone).
    vLLM's default `logprobs_mode` (`raw_logprobs`) makes these the model's log_softmax in float32 at temperature
    1, before any logits processor (`gpu_model_runner._get_prompt_logprobs_dict`, `Sampler.compute_logprobs`)."""
    try:
        entries = answer["choices"][0].get("prompt_logprobs")
    except (KeyError, IndexError, TypeError, AttributeError):
        entries = None
    if not isinstance(entries, list):
        raise VllmError(f"sample {sample.id!r}: the answer has no choices[0].prompt_logprobs (the request asked for "
                        "prompt_logprobs: 0; a vLLM whose completions API returns them is needed)")
    if len(entries) != len(sample):
        raise VllmError(f"sample {sample.id!r}: prompt_logprobs has {len(entries)} entries for {len(sample)} tokens")
    out = []
    for j in scored_positions(sample):
        entry = entries[j]
        token = sample.input_ids[j]
        found = entry.get(str(token), entry.get(token)) if isinstance(entry, dict) else None
        value = found.get("logprob") if isinstance(found, dict) else None
        if not isinstance(value, (int, float)):
            raise VllmError(f"sample {sample.id!r}: prompt_logprobs[{j}] has no logprob for the sent token {token} "
                            f"(got {str(entry)[:120]})")
        out.append(float(value))
    return torch.tensor(out, dtype=torch.float32)


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
                    raise VllmError(f"{path}: the connector still writes it after {timeout_s:.0f} s") from None
                time.sleep(LOCK_POLL_S)
    finally:
        os.close(fd)


def read_states(path: str, sample: Sample, expect: Expect, timeout_s: float) -> torch.Tensor:
    """[T, 4, H] of one sample from the connector's file (which is then deleted, with its lock)."""
    from safetensors.torch import load_file

    if not os.path.exists(path) and not os.path.exists(path + ".lock"):
        raise VllmError(f"sample {sample.id!r}: the connector wrote {path}, which this machine cannot see: run "
                        "eagledata where the server's shared_storage_path is mounted at the same path")
    _wait_for_writer(path, timeout_s)
    if not os.path.exists(path):
        raise VllmError(f"sample {sample.id!r}: the connector released {path}.lock without writing the file "
                        "(see the server's log)")
    data = load_file(path)
    for p in (path + ".lock", path):
        if os.path.exists(p):
            os.remove(p)
    hs, ids = data.get("hidden_states"), data.get("token_ids")
    if hs is None or ids is None:
        raise VllmError(f"sample {sample.id!r}: {path} holds {sorted(data)}, not hidden_states and token_ids")
    if ids.tolist() != list(sample.input_ids):
        raise VllmError(f"sample {sample.id!r}: {path} holds states of other token ids")
    shape = (len(sample), expect.num_states, expect.hidden_size)
    if tuple(hs.shape) != shape or hs.dtype != VLLM_DTYPE:
        raise VllmError(f"sample {sample.id!r}: {path} holds {hs.dtype} {list(hs.shape)}, expected {VLLM_DTYPE} "
                        f"{list(shape)}: was the server started with the printed command?")
    if not bool(torch.isfinite(hs).all()):
        raise VllmError(f"sample {sample.id!r}: {path} holds non-finite states")
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
        raise VllmError(f"cannot reach {public_url(server)}: {type(e).__name__}: {e}") from None
    if r.status_code in (401, 403):
        raise VllmError(f"{public_url(server)}: HTTP {r.status_code}: set the key vllm serve was started with")
    try:
        listed = r.json().get("data") or [] if r.status_code == 200 else []
    except ValueError:
        listed = []
    if not listed:
        raise VllmError(f"{public_url(server)}/models: HTTP {r.status_code}, no model listed (still loading?)")
    return str(listed[0]["id"])


# -- the source ---------------------------------------------------------------------------------------------
_DONE = object()  # a worker's end, in the results queue


@dataclass
class VllmSource:
    """States from the server(s) at `options.server`, one request per sample, `server_concurrency` in flight on
    each server: every server's workers take the next sample from one shared queue, so a faster server takes
    more and none idles while samples are left.

    `model` must be the checkpoint directory (its config.json, and its final norm for a post-norm layout) or
    K2.5's hub id. `transport`: the httpx transport the clients send through (None: httpx's own network one)."""

    model: str | Path
    options: VllmOptions
    transport: httpx.AsyncBaseTransport | None = None
    backend: ClassVar[str] = "vllm"
    weight_bytes: ClassVar[int] = 0  # the server holds them
    config: dict[str, Any] = field(default_factory=dict, init=False)
    layer_ids: list[int] = field(default_factory=list, init=False)
    expect: Expect | None = field(default=None, init=False)
    score: bool = field(default=False, init=False)
    record: dict[str, Any] = field(default_factory=dict, init=False)  # the manifest's `engine` record

    def __post_init__(self) -> None:
        if not self.options.servers():
            raise InputError("the vllm backend needs the server's URL", field="server")

    def vocab_size(self) -> int:
        self.config = self.config or model_config(str(self.model))
        return int((self.config.get("text_config") or self.config)["vocab_size"])

    def open(self) -> VerifierInfo:
        """The verifier from config.json alone: the server is first asked when there is work (`batches`)."""
        self.config = self.config or model_config(str(self.model))
        text = self.config.get("text_config") or self.config
        return VerifierInfo(model=str(self.model), decoder=f"vllm:{(self.config.get('architectures') or ['?'])[0]}",
                      num_layers=int(text["num_hidden_layers"]), hidden_size=int(text["hidden_size"]),
                      vocab_size=int(text["vocab_size"]), compute_dtype=VLLM_DTYPE, plan_extra={"backend": "vllm"})

    def client(self, server: str | None = None) -> httpx.AsyncClient:
        """The client every request to `server` (default: the first) goes through; `limits` size httpx's own
        pool (an injected transport brings its own; either way the workers keep at most `server_concurrency`
        requests in flight there)."""
        import httpx

        opts = self.options
        key = os.environ.get(opts.server_api_key_env)
        return httpx.AsyncClient(base_url=api_base(server or opts.servers()[0]) + "/", transport=self.transport,
                                 headers={"Authorization": f"Bearer {key}"} if key else {},
                                 limits=httpx.Limits(max_connections=opts.server_concurrency,
                                                     max_keepalive_connections=opts.server_concurrency),
                                 timeout=opts.server_timeout_s)

    def prepare(self, layers: tuple[int, int, int], final: FinalState, score: bool = False) -> None:
        """vLLM's layer ids (distinct and increasing) and, for a post-norm layout, the checkpoint's final norm:
        refused here, before the job writes a plan. `score`: each request also asks for the prompt's
        log-probabilities, handed on per sample (`StatesBatch.logprobs`)."""
        text = self.config.get("text_config") or self.config
        self.layer_ids = vllm_layer_ids(layers, int(text["num_hidden_layers"]))
        norm = FinalNorm.from_checkpoint(self.model, self.config) if final == "post_norm" else None
        self.expect = Expect(len(self.layer_ids), int(text["hidden_size"]), norm)
        self.score = score

    async def batches(self, todo: Sequence[Sample]) -> AsyncGenerator[StatesBatch, None]:
        """Each sample of `todo` with its [T, 4, H] states (and, when scoring, its scored tokens'
        log-probabilities), in the order they finish. A worker's error ends the stream after the samples that
        finished before it (the job stores those: a rerun sends only the rest, to however many servers)."""
        opts, expect, score = self.options, self.expect, self.score
        assert expect is not None, "prepare() first"
        servers = opts.servers()
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(self.client(server)) for server in servers]
            served = [await served_model(client, server) for client, server in zip(clients, servers)]
            if len(set(served)) > 1:
                raise VllmError(f"the servers serve different models: "
                                f"{dict(zip(map(public_url, servers), served))}; start each with the same checkpoint")
            norm = expect.norm
            self.record = {"backend": "vllm", "server": public_url(servers), "served_model": served[0],
                           "connector": CONNECTOR, "layer_ids": self.layer_ids, "last_state": VLLM_FINAL,
                           "final_norm": f"applied by eagledata ({norm.key}, eps {norm.eps})" if norm else None}
            if len(servers) > 1:
                self.record["servers"] = [public_url(u) for u in servers]
            queue = iter(todo)  # shared by the workers of every server: each sample is taken once
            results: asyncio.Queue = asyncio.Queue()

            async def worker(client: httpx.AsyncClient, model: str) -> None:
                try:
                    for sample in queue:
                        answer = await complete(client, model, sample, opts, score)
                        path = states_path(answer, sample)
                        logprobs = [scored_logprobs(answer, sample)] if score else None
                        states = await asyncio.to_thread(read_states, path, sample, expect, opts.server_timeout_s)
                        results.put_nowait(StatesBatch([sample], states, logprobs))
                except Exception as e:  # noqa: BLE001 - handed to the consumer, which raises it
                    results.put_nowait(e)
                else:
                    results.put_nowait(_DONE)

            each = min(opts.server_concurrency, max(1, -(-len(todo) // len(servers))))
            workers = [asyncio.create_task(worker(client, model))
                       for client, model in zip(clients, served) for _ in range(each)]
            try:
                running = len(workers)
                while running:
                    item = await results.get()
                    if item is _DONE:
                        running -= 1
                    elif isinstance(item, Exception):
                        raise item
                    else:
                        yield item
            finally:
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)

    def manifest_extra(self) -> dict[str, Any]:
        return {"engine": self.record}

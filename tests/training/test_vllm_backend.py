"""The vllm backend (eagledata.training.vllm_backend) against a fake vLLM on 127.0.0.1.

The fake answers as `vllm serve` with speculators' hidden-states extraction does (`--speculative-config
extract_hidden_states` + `ExampleHiddenStatesConnector`): `/v1/completions` with a prompt of token ids and
`max_tokens=1` writes `<dir>/<request id>.safetensors` holding `hidden_states` [T, len(ids), H] (bf16) and
`token_ids` int64 [T], under an exclusive flock on `<file>.lock` that is released only once the file is
complete (after the answer is sent, as the connector's thread pool does), and answers with
`choices[0].prompt_token_ids` and `kv_transfer_params.hidden_states_path`. Its states come from the tiny
transformers model, numbered as vLLM numbers them: id i < L is the state entering layer i, id L the last
layer's output before the final norm.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import torch

from eagledata.errors import InputError
from eagledata.files import write_jsonl
from eagledata.training import ExtractionJob, ExtractOptions, HiddenStates, Sample, extract, extract_with_vllm
from eagledata.training.layers import eagle3_layers, manifest_layers, vllm_layer_ids
from eagledata.training.models import find_decoder
from eagledata.training.scoring import read_scores
from eagledata.training.tiny import build_tiny_model
from eagledata.training.vllm_backend import FinalNorm, VllmError, VllmOptions, public_url, vllm_serve_command

L, H = 8, 64
LAYERS = eagle3_layers(L)  # (2, 4, 5)
IDS = [*LAYERS, L]


MODEL_LOCK = threading.Lock()  # two fake servers in two threads may run one model: its hooks are not reentrant


class FakeVllm:
    """A Starlette app that answers like vLLM with the hidden-states connector, counting what it is asked."""

    def __init__(self, model: torch.nn.Module, layer_ids: list[int], storage: Path, served: str = "tiny-served"):
        self.model, self.layer_ids, self.storage, self.served = model, layer_ids, storage, served
        self.decoder = find_decoder(model)
        self.prompts: list[list[int]] = []  # every completion request, faults included
        self.faults: list[int] = []  # statuses to answer first, one per request
        self.wrong_echo: set[int] = set()  # prompts (by first token) whose ids come back altered
        self.write_delay_s = 0.02
        self.auth: str | None = None
        self.scored: list[bool] = []  # per completion request: did it ask for prompt_logprobs

    def prompt_logprobs(self, ids: list[int]) -> list[dict[str, dict] | None]:
        """vLLM's `prompt_logprobs` with `prompt_logprobs: 0`: None, then the sent token's log_softmax (float32)."""
        with MODEL_LOCK, torch.inference_mode():
            logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), -1)
        return [None] + [{str(t): {"logprob": float(logp[j - 1, t]), "rank": 1, "decoded_token": None}}
                         for j, t in enumerate(ids) if j]

    def states(self, ids: list[int]) -> torch.Tensor:
        """[T, len(layer_ids), H] in bf16, vLLM's numbering (one forward at a time: fakes may share a model)."""
        with MODEL_LOCK:
            return self._states(ids)

    def _states(self, ids: list[int]) -> torch.Tensor:
        last: list[torch.Tensor] = []
        hook = self.decoder.layers[-1].register_forward_hook(
            lambda m, a, out: last.append(out[0] if isinstance(out, (tuple, list)) else out))
        try:
            with torch.inference_mode():
                hs = self.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        finally:
            hook.remove()
        cols = [last[0][0] if i == L else hs[i][0] for i in self.layer_ids]
        return torch.stack(cols, 1).to(torch.bfloat16)

    def app(self):
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": self.served, "object": "model"}]})

        async def completions(request: Request) -> JSONResponse:
            if self.auth is not None and request.headers.get("authorization") != f"Bearer {self.auth}":
                return JSONResponse({"error": {"message": "Unauthorized"}}, status_code=401)
            body = await request.json()
            prompt = list(body["prompt"])
            self.prompts.append(prompt)
            assert body["model"] == self.served and body["max_tokens"] == 1 and body["return_token_ids"] is True
            assert body.get("prompt_logprobs") in (None, 0)
            self.scored.append("prompt_logprobs" in body)
            if self.faults:
                status = self.faults.pop(0)
                return JSONResponse({"error": {"message": f"fault {status}"}}, status_code=status,
                                    headers={"Retry-After": "0"} if status == 429 else {})
            if prompt[0] == -1:
                return JSONResponse({"error": {"message": "bad prompt"}}, status_code=400)
            req_id = f"cmpl-{uuid.uuid4().hex}"
            path = self.storage / f"{req_id}.safetensors"
            self.storage.mkdir(parents=True, exist_ok=True)
            lock = os.open(str(path) + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock, fcntl.LOCK_EX)  # held until the file is complete, as the connector does
            states = self.states(prompt)

            def write() -> None:
                from safetensors.torch import save_file

                try:
                    time.sleep(self.write_delay_s)
                    save_file({"hidden_states": states, "token_ids": torch.tensor(prompt, dtype=torch.int64)},
                              str(path))
                finally:
                    os.close(lock)

            threading.Thread(target=write, daemon=True).start()
            echoed = [prompt[0] + 1, *prompt[1:]] if prompt[0] in self.wrong_echo else prompt
            return JSONResponse({
                "id": req_id, "object": "text_completion", "created": int(time.time()), "model": self.served,
                "choices": [{"index": 0, "text": "x", "finish_reason": "length", "logprobs": None,
                             "prompt_token_ids": echoed, "token_ids": [0],
                             **({"prompt_logprobs": self.prompt_logprobs(prompt)} if self.scored[-1] else {})}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1},
                "kv_transfer_params": {"hidden_states_path": str(path)}})

        return Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])])


class Served:
    """uvicorn serving a FakeVllm on 127.0.0.1 (a free port) in a thread."""

    def __init__(self, fake: FakeVllm):
        import uvicorn

        self.fake = fake
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(fake.app(), log_level="warning", access_log=False,
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60  # a hang guard: it starts in well under a second
        while not self.server.started:
            assert time.monotonic() < deadline, "fake vLLM did not start"
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama")
    model = build_tiny_model("llama", directory, hidden_size=H, num_layers=L)
    return directory, model


@pytest.fixture
def server(checkpoint, tmp_path):
    served = Served(FakeVllm(checkpoint[1], IDS, tmp_path / "connector"))
    yield served
    served.close()


@pytest.fixture(scope="module")
def samples():
    rng = random.Random(7)
    out = []
    for i in range(10):
        n = rng.randint(5, 60)
        ids = [rng.randrange(1, 163_840) for _ in range(n)]
        out.append(Sample(f"s{i}", "B1", ids, [0] * (n // 3) + [1] * (n - n // 3), False))
    return out


def vllm_run(samples, out, checkpoint, url, name="set", vllm=None, transport=None, **opts):
    vllm = vllm or VllmOptions(server=url, server_retry_s=0.01)
    return extract_with_vllm(samples, out, name, checkpoint, vllm=vllm, options=ExtractOptions(**opts),
                             progress=False, transport=transport)


class CountingTransport(httpx.AsyncBaseTransport):
    """The network transport, counting the completion requests in flight (injected: nothing is patched)."""

    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()
        self.now = self.most = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        counted = request.url.path.endswith("/completions")
        self.now += counted
        self.most = max(self.most, self.now)
        try:
            return await self.inner.handle_async_request(request)
        finally:
            self.now -= counted

    async def aclose(self) -> None:
        await self.inner.aclose()


class RewritingTransport(httpx.AsyncBaseTransport):
    """The network transport, with each completion answer's JSON passed through `rewrite` (injected)."""

    def __init__(self, rewrite):
        self.inner, self.rewrite = httpx.AsyncHTTPTransport(), rewrite

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/completions") or response.status_code != 200:
            return response
        body = json.loads(await response.aread())
        await response.aclose()
        return httpx.Response(200, json=self.rewrite(body))

    async def aclose(self) -> None:
        await self.inner.aclose()


# -- pure parts ----------------------------------------------------------------------------------
def test_layer_ids_map_between_the_manifest_and_vllm():
    assert vllm_layer_ids((2, 30, 58), 61) == [2, 30, 58, 61]  # K2.5: speculators' launch_vllm.py default
    assert manifest_layers([2, 30, 58, 61], 61) == (2, 30, 58)
    assert vllm_layer_ids(LAYERS, L) == IDS and manifest_layers(IDS, L) == LAYERS
    for bad in ([2, 3, 3], [5, 4, 2], [2, 4], [2, 4, 8]):  # vLLM keeps each layer once, in layer order
        with pytest.raises(InputError, match="field 'layers'"):
            vllm_layer_ids(bad, L)
    with pytest.raises(InputError, match="field 'layer_ids'"):
        manifest_layers([2, 4, 5], L)  # the final state's id L is missing


def test_serve_command_is_what_speculators_launches():
    argv = vllm_serve_command("/models/kimi-k2.5", [2, 30, 58, 61], tp=8, shared_storage_path="/shared/hs")
    assert argv[:3] == ["vllm", "serve", "/models/kimi-k2.5"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--tensor-parallel-size"] == "8" and flags["--dtype"] == "bfloat16"
    # speculators scripts/launch_vllm.py + hs_connectors FileBackend.build_kv_transfer_config
    assert json.loads(flags["--speculative-config"]) == {
        "method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58, 61]}}}
    assert json.loads(flags["--kv-transfer-config"]) == {
        "kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/shared/hs"}}
    job = ExtractionJob(model="moonshotai/Kimi-K2.5", tp=8, backend="vllm",
                        vllm=VllmOptions(shared_storage_path="/shared/hs"))
    # K2.5's 61 layers from its published config, nothing downloaded
    assert job.vllm_command() == ["vllm", "serve", "moonshotai/Kimi-K2.5", *argv[3:]]


def test_urls_in_the_manifest_carry_no_secrets():
    assert public_url("http://user:secret@gpu-node:8000/v1?token=x#f") == "http://gpu-node:8000/v1"
    with pytest.raises(InputError, match="field 'server_concurrency'"):
        VllmOptions(server_concurrency=0)


# -- against the fake server ------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["eagledata", "speculators", "specforge"])
def test_vllm_states_equal_the_transformers_path(layout, checkpoint, server, samples, tmp_path):
    directory, model = checkpoint
    ref = extract(samples, tmp_path / "ref", "set", model, options=ExtractOptions(layout=layout), progress=False)
    got = vllm_run(samples, tmp_path / "vllm", directory, server.url, layout=layout)
    assert got.complete and got.extracted == len(samples) and len(server.fake.prompts) == len(samples)
    a, b = HiddenStates(ref.directory), HiddenStates(got.directory)
    assert b.ids == a.ids == [s.id for s in samples]
    m = b.manifest
    final = "pre_norm" if layout == "speculators" else "post_norm"
    assert (m["backend"], m["layout"], m["final"], m["layers"]) == ("vllm", layout, final, list(LAYERS))
    assert m["engine"]["layer_ids"] == IDS and m["engine"]["last_state"] == "pre_norm"
    assert m["engine"]["server"] == server.url and m["engine"]["served_model"] == "tiny-served"
    assert (m["engine"]["final_norm"] is None) == (final == "pre_norm")
    assert {k: m[k] for k in ("num_samples", "num_tokens", "samples_hash", "hidden_size", "storage")} == \
        {k: a.manifest[k] for k in ("num_samples", "num_tokens", "samples_hash", "hidden_size", "storage")}
    for s in samples:
        x, y = a[s.id], b[s.id]
        assert y.input_ids.tolist() == s.input_ids and y.loss_mask.tolist() == s.loss_mask
        # both are bf16 roundings of one fp32 computation (batched there, one prompt here: at most one bf16 step
        # apart); the final norm is applied to a bf16 state here, to the fp32 one there
        torch.testing.assert_close(y.aux_hidden_states.float(), x.aux_hidden_states.float(), rtol=2 ** -7,
                                   atol=1e-5)
        torch.testing.assert_close(y.final_hidden_state.float(), x.final_hidden_state.float(), rtol=1.6e-2,
                                   atol=1e-2)
    assert not list((server.fake.storage).glob("*")), "the client removes each file and its lock once read"
    # the scores, from prompt_logprobs in the same requests, are the transformers path's (both float32 here)
    ra, rb = read_scores(ref.directory), read_scores(got.directory)
    assert [r.id for r in rb] == [r.id for r in ra] and m["scoring"]["scored_samples"] == len(samples)
    for x, y in zip(ra, rb):
        assert y.score.tokens == x.score.tokens and y.score.nll_sum == pytest.approx(x.score.nll_sum, rel=1e-4)


def test_fp8_storage_and_the_final_norm(checkpoint, server, samples, tmp_path):
    directory, model = checkpoint
    got = vllm_run(samples[:4], tmp_path, directory, server.url, storage="fp8")
    m = got.manifest
    assert m["storage"] == "fp8" and 0 < m["reconstruction_rel_rmse"] < 0.05
    norm = FinalNorm.from_checkpoint(directory, json.loads((directory / "config.json").read_text()))
    torch.testing.assert_close(norm.weight, find_decoder(model).module.norm.weight.detach())
    assert m["engine"]["final_norm"].startswith(f"applied by eagledata ({norm.key}")


def test_a_token_id_mismatch_is_refused_naming_the_sample(checkpoint, server, samples, tmp_path):
    server.fake.wrong_echo.add(samples[3].input_ids[0])
    with pytest.raises(VllmError, match=r"sample 's3'.*prompt_token_ids differ .* position 0"):
        vllm_run(samples, tmp_path, checkpoint[0], server.url, layout="speculators")


def test_503_and_429_are_retried_then_succeed(checkpoint, server, samples, tmp_path):
    server.fake.faults = [503, 429, 502]
    got = vllm_run(samples[:3], tmp_path, checkpoint[0], server.url, vllm=VllmOptions(
        server=server.url, server_concurrency=1, server_retry_s=0.01))
    assert got.complete and len(server.fake.prompts) == 3 + 3
    assert server.fake.prompts[:4] == [samples[0].input_ids] * 4  # the first sample, tried four times


def test_retries_end_and_other_4xx_fail_at_once(checkpoint, server, samples, tmp_path):
    server.fake.faults = [503] * 3
    with pytest.raises(VllmError, match=r"sample 's0': no answer after 3 attempts; last: HTTP 503"):
        vllm_run(samples[:1], tmp_path, checkpoint[0], server.url, vllm=VllmOptions(
            server=server.url, server_attempts=3, server_retry_s=0.01))
    bad = Sample("bad", "B1", [-1, 5], [1, 1], False)
    with pytest.raises(InputError, match="outside the model's vocabulary"):  # refused before any request
        vllm_run([bad], tmp_path, checkpoint[0], server.url, name="bad")
    server.fake.faults = [400]
    with pytest.raises(VllmError, match=r"sample 's1': the server refused it: HTTP 400"):
        vllm_run(samples[1:2], tmp_path, checkpoint[0], server.url, name="other")


def test_resume_sends_only_the_missing_samples(checkpoint, server, samples, tmp_path):
    server.fake.wrong_echo.add(samples[7].input_ids[0])  # the first run dies at s7 (one at a time: s0..s6 stored)
    one = VllmOptions(server=server.url, server_concurrency=1, server_retry_s=0.01)
    with pytest.raises(VllmError, match="'s7'"):
        vllm_run(samples, tmp_path, checkpoint[0], server.url, vllm=one, layout="speculators")
    assert len(server.fake.prompts) == 8
    server.fake.wrong_echo.clear()
    server.fake.prompts.clear()
    got = vllm_run(samples, tmp_path, checkpoint[0], server.url, layout="speculators")
    assert got.complete and (got.extracted, got.skipped) == (3, 7)
    assert server.fake.prompts == [s.input_ids for s in samples[7:]]
    assert HiddenStates(got.directory).ids == [s.id for s in samples]
    # a finished set: nothing is sent again, and the transformers path may not continue it
    server.fake.prompts.clear()
    assert vllm_run(samples, tmp_path, checkpoint[0], server.url, layout="speculators").extracted == 0
    assert server.fake.prompts == []
    with pytest.raises(InputError, match="made by the vllm backend"):
        extract(samples, tmp_path, "set", checkpoint[1], options=ExtractOptions(layout="speculators"),
                progress=False)


def test_many_requests_in_flight(checkpoint, server, samples, tmp_path):
    counting = CountingTransport()
    server.fake.write_delay_s = 0.0
    got = vllm_run(samples, tmp_path, checkpoint[0], server.url, vllm=VllmOptions(server=server.url,
                                                                                  server_concurrency=4),
                   transport=counting)
    assert got.complete and 1 < counting.most <= 4 and counting.now == 0


def test_the_api_key_comes_from_the_environment_and_is_never_stored(checkpoint, server, samples, tmp_path,
                                                                     monkeypatch):
    server.fake.auth = "s3cret-key"
    with pytest.raises(VllmError, match=r"HTTP 401.*\$VLLM_API_KEY"):
        vllm_run(samples[:1], tmp_path, checkpoint[0], server.url)
    monkeypatch.setenv("VLLM_API_KEY", "s3cret-key")
    got = vllm_run(samples[:2], tmp_path, checkpoint[0], server.url, name="keyed")
    assert got.complete
    assert not any("s3cret" in p.read_text(errors="ignore") for p in got.directory.rglob("*.json*"))


def test_a_file_this_machine_cannot_see_is_a_clear_error(checkpoint, server, samples, tmp_path):
    def elsewhere(answer):
        answer["kv_transfer_params"]["hidden_states_path"] = "/nonexistent/hs/x.safetensors"
        return answer

    with pytest.raises(VllmError, match="cannot see: run eagledata where the server's shared_storage_path"):
        vllm_run(samples[:1], tmp_path, checkpoint[0], server.url, transport=RewritingTransport(elsewhere))


def test_job_settings_and_command_line_select_the_backend(checkpoint, server, samples, tmp_path, capsys):
    from eagledata.hidden_states import main

    export = tmp_path / "speculators.jsonl"
    write_jsonl(export, (s.to_speculators() for s in samples[:3]))
    code = main(["--samples", str(export), "--name", "cli", "--model", str(checkpoint[0]), "--output-dir",
                 str(tmp_path), "--backend", "vllm", "--server", server.url, "--layout", "speculators"])
    assert code == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["backend"] == "vllm" and line["extracted"] == 3 and line["complete"]
    assert HiddenStates(tmp_path / "hidden_states" / "cli").manifest["backend"] == "vllm"
    job = ExtractionJob(output_dir=str(tmp_path), name="job", model=str(checkpoint[0]), backend="vllm",
                        vllm=VllmOptions(server=server.url))
    done = asyncio.run(job.run_async(samples[:2], progress=False))  # the notebook awaits it in its kernel's loop
    assert done.complete and done.manifest["engine"]["layer_ids"] == IDS
    assert main(["serve-command", "--model", str(checkpoint[0]), "--tp", "2"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"vllm serve {checkpoint[0]} --tensor-parallel-size 2") and "[2, 4, 5, 8]" in shown
    assert main(["--samples", str(export), "--name", "x", "--model", str(checkpoint[0]), "--output-dir",
                 str(tmp_path), "--backend", "vllm"]) == 2  # no --server
    assert "field 'server'" in capsys.readouterr().err


# -- scoring (the target's log-probabilities) and several servers ---------------------------------------------
def scored(checkpoint, samples, vllm, transport=None, score=True):
    from eagledata.training.vllm_backend import VllmSource

    source = VllmSource(checkpoint[0], vllm, transport)
    source.open()
    source.prepare(LAYERS, "pre_norm", score=score)

    async def collect():
        return [b async for b in source.batches(samples)]

    return asyncio.run(collect())


def test_scoring_asks_in_the_same_request_and_hands_on_the_scored_tokens(checkpoint, server, samples):
    from eagledata.training.source import scored_positions

    batches = scored(checkpoint, samples[:4], VllmOptions(server=server.url, server_retry_s=0.01))
    assert server.fake.scored == [True] * 4 and len(server.fake.prompts) == 4  # one request per sample
    for batch in batches:
        (sample,), (got,) = batch.samples, batch.logprobs
        at = scored_positions(sample)
        assert at == [j for j in range(len(sample)) if sample.loss_mask[j]] and at[0] > 0
        with torch.inference_mode():
            logp = torch.log_softmax(checkpoint[1](torch.tensor([sample.input_ids])).logits[0].float(), -1)
        want = torch.tensor([float(logp[j - 1, sample.input_ids[j]]) for j in at])
        assert got.dtype == torch.float32 and torch.equal(got, want)
    server.fake.scored.clear()
    plain = scored(checkpoint, samples[:2], VllmOptions(server=server.url), score=False)
    assert server.fake.scored == [False, False] and all(b.logprobs is None for b in plain)


def test_a_missing_or_short_prompt_logprobs_names_the_sample(checkpoint, server, samples):
    from eagledata.training.source import scored_positions

    j = scored_positions(samples[2])[-1]

    def other_token(answer):
        answer["choices"][0]["prompt_logprobs"][j] = {"1": {"logprob": -0.5}}
        return answer

    with pytest.raises(VllmError, match=rf"sample 's2': prompt_logprobs\[{j}\] has no logprob for the sent token"):
        scored(checkpoint, samples[2:3], VllmOptions(server=server.url), RewritingTransport(other_token))

    def dropped(answer):
        answer["choices"][0].pop("prompt_logprobs")
        return answer

    with pytest.raises(VllmError, match="sample 's2': the answer has no choices\\[0\\].prompt_logprobs"):
        scored(checkpoint, samples[2:3], VllmOptions(server=server.url), RewritingTransport(dropped))

    def short(answer):
        answer["choices"][0]["prompt_logprobs"].pop()
        return answer

    n = len(samples[2])
    with pytest.raises(VllmError, match=f"sample 's2': prompt_logprobs has {n - 1} entries for {n} tokens"):
        scored(checkpoint, samples[2:3], VllmOptions(server=server.url), RewritingTransport(short))


def test_several_servers_share_one_queue_and_resume_across_their_number(checkpoint, samples, tmp_path):
    one = Served(FakeVllm(checkpoint[1], IDS, tmp_path / "c1"))
    two = Served(FakeVllm(checkpoint[1], IDS, tmp_path / "c2"))
    try:
        one.fake.wrong_echo.add(samples[4].input_ids[0])  # the single-server run stops at s4: s0..s3 stored
        with pytest.raises(VllmError, match="'s4'"):
            vllm_run(samples, tmp_path, checkpoint[0], one.url, layout="speculators",
                     vllm=VllmOptions(server=one.url, server_concurrency=1, server_retry_s=0.01))
        one.fake.wrong_echo.clear()
        one.fake.prompts.clear()
        got = vllm_run(samples, tmp_path, checkpoint[0], one.url, layout="speculators",
                       vllm=VllmOptions(server=[one.url, two.url], server_concurrency=2, server_retry_s=0.01))
        assert got.complete and (got.skipped, got.extracted) == (4, 6)
        sent = one.fake.prompts + two.fake.prompts
        assert sorted(sent) == sorted(s.input_ids for s in samples[4:])  # each missing sample once, across both
        assert one.fake.prompts and two.fake.prompts
        assert got.manifest["engine"]["servers"] == [one.url, two.url]
        assert got.manifest["engine"]["server"] == f"{one.url}, {two.url}"
        assert HiddenStates(got.directory).ids == [s.id for s in samples]
        two.fake.served = "another-model"
        with pytest.raises(VllmError, match="the servers serve different models"):
            vllm_run(samples[:1], tmp_path, checkpoint[0], one.url, name="mixed",
                     vllm=VllmOptions(server=[one.url, two.url]))
    finally:
        one.close()
        two.close()
    with pytest.raises(InputError, match="field 'server'"):
        VllmOptions(server=[one.url, one.url.removesuffix("/v1")])  # the same server twice


def test_the_command_line_takes_several_servers(checkpoint, samples, tmp_path, capsys):
    from eagledata.hidden_states import main

    servers = [Served(FakeVllm(checkpoint[1], IDS, tmp_path / f"c{i}")) for i in range(2)]
    try:
        export = tmp_path / "speculators.jsonl"
        write_jsonl(export, (s.to_speculators() for s in samples[:6]))
        code = main(["--samples", str(export), "--name", "cli", "--model", str(checkpoint[0]), "--output-dir",
                     str(tmp_path), "--backend", "vllm", "--server", servers[0].url, servers[1].url,
                     "--server-concurrency", "1"])
        assert code == 0, capsys.readouterr().err
        assert [len(s.fake.prompts) for s in servers] in ([3, 3], [2, 4], [4, 2])  # both used, every sample once
        assert sum(len(s.fake.prompts) for s in servers) == 6
    finally:
        for s in servers:
            s.close()

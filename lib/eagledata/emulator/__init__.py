"""OpenRouter emulator: the embedded default server for the demo and every network test.

Run it: `python -m eagledata.emulator --port PORT [--config FILE] [--host 127.0.0.1]` (`--port 0`
picks a free port and prints `listening on http://127.0.0.1:PORT/api/v1`), or from Python:

    with run_emulator({"speed": 0, "balance": 5.0}) as emu:   # subprocess, free port, always stopped
        httpx.post(f"{emu.base_url}/chat/completions", headers={"Authorization": "Bearer k"}, json=...)
        emu.topup(10); emu.stats(); emu.ground_truth(gen_id); emu.reset({...})

In process (no sockets): `httpx.ASGITransport(app=create_app(parse_config(raw), tokenizer))`.

Config (YAML or JSON; every key optional; a bad value is an InputError naming the field, exit 2):

    seed: 0                 # content, faults and provider errors are drawn from it
    api_key: null           # when set, only this Bearer key is accepted
    balance: 100.0          # USD credits;  key_limit: null (→ balance);  credits_forbidden: false (403)
    speed: 1.0              # multiplies TTFT and tokens/throughput; 0 = no delay
    generation_delay: 0.5   # s that GET /generation?id= answers 404 after completion
    processing_interval: 1.0            # s between ": OPENROUTER PROCESSING" comments
    ground_truth_file: null             # JSONL appended per charged generation;  record_prompt_ids: false
    reject: null            # {code: 400, message: "..."}: every chat request is refused with it (a provider rule)
    content: {reasoning_median: 1500, reasoning_sigma: 0.8, content_median: 300, content_sigma: 0.7,
              max_total: 32000,         # lognormal lengths in tokens
              literal_close: 0}         # share of answers whose content quotes a literal `</think>`
    faults: {<class>: rate, ..., retry_after: 1, slow_seconds: 30}   # classes: faults.FAULTS
    tool_datasets: []       # prompt files whose agent conversations the model regenerates (any accepted shape)
    tool_follow_rate: 0.8   # per tool round: the chance it calls what the dataset's answer called, else its own plan
    batch:                  # Moonshot's Batch API under /moonshot/v1 (batch.py); durations are real seconds x speed
      {balance: 100.0,      # USD on the Moonshot account (apart from `balance`)
       prompt_price: 0.36, completion_price: 1.80,     # USD per M tokens: 40 % off the $0.60/$3.00 realtime price
       max_file_bytes: 104857600, max_files: 1000,     # an upload's limit (100 MB); uploaded files held at once
       models: [kimi-k2.5, kimi-k2.6],                 # what it serves
       validating_s: 30, queue_s: 600, lines_per_s: 2, finalizing_s: 30, cancel_s: 30,
       line_error_rate: 0,  # share of lines answered with a 500 body (the error file)
       expire_rate: 0}      # share of batches that stall part-way and expire at their window's end
    replace_endpoints: false            # true: drop the default Kimi-K2.5 catalog first
    endpoints:                          # same provider name → override fields; new name → add
      - {provider: NewCo, slug: newco, quantization: fp4, prompt_price: 0.3, completion_price: 1.5,
         context_length: 262144, max_completion_tokens: 65536, latency: 1.0, throughput: 40,
         uptime: 99.0, status: 0, capacity: 1000, error_rate: 0.0, data_collection: deny,
         supported_parameters: [...], usage_counts_im_end: true,
         tool_call_ids: native,         # or call: `call_` + 24 alphanumerics instead of functions.NAME:IDX
         quirks: {reasoning_details_only: 0, inline_think: 0, literal_specials: 0, bare_close: 0,
                  reasoning_dropped: 0, special_spaces: 0, arguments_reserialized: 0}}

Admin API (not under /api/v1): GET /admin/health, POST /admin/topup {"amount": USD}, GET /admin/stats (its `batch`
section: files, batches by status, lines by status, balance, charged_usd), GET /admin/ground_truth[?id=gen-…],
POST /admin/reset [config JSON] (the Batch API's state too), POST /admin/batches/{id}/expire (the window ends now),
GET /admin/batch_lines (every line of every batch: batch_id, custom_id, line, status: answered | failed | expired |
cancelled | pending, generation_id: the answer's `chatcmpl-…` id, its ground truth's key).

Moonshot's Batch API at `http://127.0.0.1:PORT/moonshot/v1` (`create_app(..., clock=...)` drives its time in process):
POST /files (multipart `file` + `purpose=batch`), GET /files, GET|DELETE /files/{id}, GET /files/{id}/content,
POST /batches, GET /batches[?limit&after], GET /batches/{id}, POST /batches/{id}/cancel, GET /users/me/balance.
"""
from ..emulator_process import EmulatorHandle, run_emulator
from .config import EmulatorConfig, load_config, parse_config
from .faults import FAULT_CLASSES
from .routes import create_app

__all__ = ["FAULT_CLASSES", "EmulatorConfig", "EmulatorHandle", "create_app", "load_config", "parse_config",
           "run_emulator"]

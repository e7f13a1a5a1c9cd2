"""eagledata: EAGLE-3 training data from a reasoning model served over an API.

Stages, each a subpackage with a README: `text` (tokenizer, chat template, id recipe, round-trip
validation), `openrouter` (catalog, routing policy, requests, answer classification), `generation`
(engine, admission, account books, checkpoint store, budget model, run report), `training` (assembly, hidden states),
`quality` (speculative decoding, τ on MT-Bench),
`emulator` (the OpenRouter stand-in). Shared by all: `records` (the record schema), `layout` (every path),
`settings` (settings defined once), `errors`, `files`.
"""
__version__ = "0.1.0"

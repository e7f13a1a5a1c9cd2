"""Starting a real vLLM server for the `vllm` tests (harness.py); the other files run in `.venv-vllm`."""

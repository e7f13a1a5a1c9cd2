"""CPU stand-ins for the three CUDA-only calls of vLLM's `ExampleHiddenStatesConnector` (test environment only).

vLLM 0.32.0's reference hidden-states connector (`vllm/distributed/kv_transfer/kv_connector/v1/
example_hidden_states_connector.py`) copies each finished request's states out of the KV cache asynchronously:

1. `torch.cuda.Stream()` (`_get_copy_stream`) and `torch.cuda.stream(...)`/`stream.wait_event(...)`
   (`_submit_async_write`): a copy stream, so the device-to-host copy does not block the model's stream;
2. `torch.cuda.Event()` + `record`/`query`/`synchronize` (`_submit_async_write`, `get_finished`,
   `_write_tensors`): when that copy is done;
3. `torch.empty_like(..., pin_memory=True)` (`_submit_async_write`): pinned host memory, the copy's target.

On a CPU-only torch each of them raises. On CPU the KV cache already lies in host memory and every op is
synchronous, so the stand-ins are: no stream (a null context, `wait_event` does nothing), events that are always
complete, plain host memory. They change *only* the connector module's view of `torch` (its global name is
rebound to a proxy); every other line that runs is vLLM's own. vLLM's own CPU model runner does the same for its
own streams and events (`cpu_model_runner._torch_cuda_wrapper`).

They refuse to install (the server then fails to start, naming the reason) unless vLLM is the version they were
written for and the connector's source that uses CUDA is byte-for-byte the code they were read from (a sha256 of
each method that touches CUDA, and the set of `torch.cuda.*`/`pin_memory` uses in the whole module).
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import re
import types
from typing import Any

CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
VLLM_VERSION = "0.32.0"
# sha256 of inspect.getsource(ExampleHiddenStatesConnector.<method>) in vLLM 0.32.0: the methods that touch CUDA.
METHOD_SHA256 = {
    "_get_copy_stream": "94f66947a4129520ecd163876297e64dc401782e672980ba2c0140e567fa54e9",
    "_submit_async_write": "c78aab32eff848cba501928c496174b513f25ddb239558022607beb69320d550",
    "_write_tensors": "7877e27c5cc077a2372dff8c96976c2ab6b2320ad656cf756034d71fb9cb7df3",
    "get_finished": "0680a81026cc32888be29b23146a1715717c7477a5262327c11f4f8f767418d5",
}
# Every CUDA-only name in the module's code (comments left out; annotations included): what the stand-ins cover,
# and nothing else. A new CUDA call anywhere in the module changes these counts.
CUDA_USES = {"torch.cuda.Stream": 3, "torch.cuda.Event": 4, "torch.cuda.stream": 1, "pin_memory=True": 1}
CUDA_USE = re.compile(r"torch\.cuda\.\w+|pin_memory=True")


class StandInError(RuntimeError):
    """The vLLM in this environment is not the code the stand-ins were checked against."""


class CompletedEvent:
    """`torch.cuda.Event` on CPU: the copy it marks ran synchronously, so it is always complete."""

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass


class NoStream:
    """`torch.cuda.Stream` on CPU: there is one synchronous stream, so waiting on an event is a no-op."""

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _code_lines(source: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in source.splitlines())


def cuda_uses(source: str) -> dict[str, int]:
    """How often each CUDA-only call occurs in `source`, comments left out."""
    found: dict[str, int] = {}
    for m in CUDA_USE.finditer(_code_lines(source)):
        found[m.group(0)] = found.get(m.group(0), 0) + 1
    return found


def method_hashes(cls: type) -> dict[str, str]:
    return {name: hashlib.sha256(inspect.getsource(getattr(cls, name)).encode()).hexdigest()
            for name in METHOD_SHA256}


def check(module: types.ModuleType) -> None:
    """Refuse, loudly, any vLLM whose connector is not the code the stand-ins replace."""
    import vllm

    problems = []
    if vllm.__version__ != VLLM_VERSION:
        problems.append(f"vLLM is {vllm.__version__}, the stand-ins were checked against {VLLM_VERSION}")
    got = method_hashes(module.ExampleHiddenStatesConnector)
    changed = [name for name, digest in got.items() if digest != METHOD_SHA256[name]]
    if changed:
        problems.append(f"ExampleHiddenStatesConnector.{', .'.join(changed)} changed (sha256 now "
                        f"{ {n: got[n][:16] for n in changed} })")
    uses = cuda_uses(inspect.getsource(module))
    if uses != CUDA_USES:
        problems.append(f"the module's CUDA-only calls are now {uses}, the stand-ins cover {CUDA_USES}")
    if problems:
        raise StandInError(f"CPU stand-ins for {CONNECTOR_MODULE} (tests/helpers/vllm_server/site) refuse to install: "
                           + "; ".join(problems) + ". Read the new code and update the stand-ins and their hashes.")


def cpu_torch(torch: types.ModuleType) -> types.ModuleType:
    """A view of `torch` for the connector module: torch itself except the three CUDA-only calls."""
    cuda = types.ModuleType("torch.cuda (CPU stand-ins)")
    cuda.__getattr__ = lambda name: getattr(torch.cuda, name)  # type: ignore[method-assign]
    cuda.Stream = NoStream
    cuda.Event = CompletedEvent
    cuda.stream = lambda stream=None: contextlib.nullcontext()

    def empty_like(tensor: Any, *args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        return torch.empty_like(tensor, *args, **kwargs)  # plain host memory: the copy is synchronous anyway

    view = types.ModuleType("torch (CPU stand-ins)")
    view.__getattr__ = lambda name: getattr(torch, name)  # type: ignore[method-assign]
    view.cuda = cuda
    view.empty_like = empty_like
    return view


def install(module: types.ModuleType) -> None:
    """Check the connector module, then rebind its `torch` to the CPU view."""
    check(module)
    module.torch = cpu_torch(module.torch)
    module.EAGLEDATA_CPU_STAND_INS = True

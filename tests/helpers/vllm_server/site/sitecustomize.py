"""Loaded by every Python process of the test vLLM server (its PYTHONPATH names this folder only): the API server,
the engine core and any worker vLLM spawns or forks. Installs the CPU stand-ins (eagledata_vllm_cpu) into vLLM's
hidden-states connector module as soon as that module is imported, and nowhere else."""
import importlib.abc
import importlib.util
import sys

_TARGET = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the connector module with the normal machinery, then wraps its loader to install the stand-ins."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            import eagledata_vllm_cpu

            eagledata_vllm_cpu.install(module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())

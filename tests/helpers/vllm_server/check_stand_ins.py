"""Run in the vLLM environment by tests/training/test_vllm_real.py: the stand-ins' checks on vLLM's connector as
shipped, on a copy of it with one more CUDA call, and on another vLLM version; prints one JSON line of what each
said."""
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "site"))
import eagledata_vllm_cpu as stand_ins  # noqa: E402
import vllm  # noqa: E402


def verdict(module) -> str:
    try:
        stand_ins.check(module)
    except stand_ins.StandInError as e:
        return str(e)
    return "ok"


def main() -> None:
    spec = importlib.util.find_spec(stand_ins.CONNECTOR_MODULE)
    shipped = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shipped)
    source = Path(spec.origin).read_text()
    marker = "        # Poll for completed DtoH copies\n"
    assert source.count(marker) == 1, "get_finished changed: update this check"
    changed_source = source.replace(marker, marker + "        torch.cuda.synchronize()\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "changed_connector.py"
        path.write_text(changed_source)
        cspec = importlib.util.spec_from_file_location("changed_connector", path)
        changed = importlib.util.module_from_spec(cspec)
        cspec.loader.exec_module(changed)
        out = {"shipped": verdict(shipped), "changed": verdict(changed)}
    vllm.__version__ = "0.33.0"
    out["other_version"] = verdict(shipped)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

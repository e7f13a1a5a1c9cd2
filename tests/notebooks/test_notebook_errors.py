"""How a notebook shows bad input: the InputError's message, once, plainly; the cell still fails under papermill."""
import json

import pytest
from papermill.exceptions import PapermillExecutionError

from eagledata.openrouter import Catalog
from tests.helpers.catalogs import ep

CHAT_ONLY = ["reasoning", "include_reasoning", "max_tokens"]


def test_an_input_error_is_its_message_on_one_line_and_the_cell_fails(execute_notebook, tmp_path):
    """Issue 44 bugs 6 and 7: every endpoint excluded used to fail in the pricing cell ("no eligible endpoint has a
    price"), and any InputError was a 30-line traceback with its message last."""
    snap = Catalog("moonshotai/kimi-k2.5", "test", "now", [
        ep("DeepInfra", "int4", 0.45, 2.20, params=CHAT_ONLY), ep("Fireworks", "nvfp4", 0.40, 2.00),
    ]).save(tmp_path / "snap.json")
    with pytest.raises(PapermillExecutionError) as e:
        execute_notebook("providers", snapshot=str(snap), params_dir=str(tmp_path / "params"),
                         base_url="http://127.0.0.1:9/unreachable")
    err = e.value
    assert err.ename == "InputError" and err.evalue.startswith("every endpoint of moonshotai/kimi-k2.5 is excluded")
    assert "require_tools=True" in err.evalue and "(Fireworks) is quantized below the native int4" in err.evalue
    assert err.traceback == [f"InputError: {err.evalue}"]  # the message, once, first: no frames
    nb = json.loads((tmp_path / "providers.out.ipynb").read_text())
    errors = [(c, o) for c in nb["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert len(errors) == 1
    cell, out = errors[0]
    assert "decision.save(cfg.params_dir)" in "".join(cell["source"])  # the routing cell, not pricing
    assert out["traceback"] == [f"InputError: {err.evalue}"]
    assert not (tmp_path / "params" / "routing").exists()
    shown = [o for o in cell["outputs"] if o["output_type"] == "display_data"]
    assert any("DeepInfra" in "".join(o["data"].get("text/plain", "")) for o in shown)  # its exclusion table first

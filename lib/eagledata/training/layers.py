"""Which layers' states EAGLE-3 takes, and how the numbering maps between the manifest and vLLM (pure, a leaf:
storage, both backends and the job read it, and it imports nothing of theirs)."""
from __future__ import annotations

from collections.abc import Sequence

from ..errors import InputError


def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """States entering layers {2, L//2, L-3}, in HF `hidden_states` numbering (0 = embeddings)."""
    if num_layers < 4:
        raise InputError(f"EAGLE-3 needs at least 4 decoder layers, the model has {num_layers}", field="layers")
    return 2, num_layers // 2, num_layers - 3


def resolve_layers(layers: Sequence[int] | None, num_layers: int) -> tuple[int, int, int]:
    """The three aux layers asked for (None: the EAGLE-3 rule), checked against the model's depth."""
    if layers is None:
        return eagle3_layers(num_layers)
    layers = tuple(int(i) for i in layers)
    if len(layers) != 3 or not all(0 <= i < num_layers for i in layers):
        raise InputError(f"layers must be three HF hidden_states indices in 0..{num_layers - 1}, got {layers}",
                         field="layers")
    return layers


def vllm_layer_ids(layers: Sequence[int], num_layers: int) -> list[int]:
    """Manifest `layers` (HF `hidden_states` indices of the 3 aux states) -> vLLM's
    `eagle_aux_hidden_state_layer_ids`: the same numbers, then `num_layers` for the pre-norm final state."""
    ids = list(resolve_layers(layers, num_layers))
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
    vllm_layer_ids(aux, num_layers)  # same checks as the forward direction
    return aux[0], aux[1], aux[2]

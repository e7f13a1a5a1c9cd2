"""What the data is worth: the canonical EAGLE experiment's measuring half. Its sources (ShareGPT, MT-Bench, read
from the wheels that ship them), greedy speculative decoding with any drafter behind one seam, τ over an evaluation
set with its bootstrap interval, and `tau.json`. See README.md.

Nothing is imported here: `speculative`, `eagle3` and `measure` also run in the speculators environment, which has
torch and transformers but none of the project's other dependencies."""

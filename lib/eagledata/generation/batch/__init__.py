"""generation/batch/: the batch route (`route: batch`): the datasets through a batch API in rounds, into the same
records (README.md beside it)."""

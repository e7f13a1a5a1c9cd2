"""Agentic tasks and the environments their tool calls run in (issue 61): tasks (BFCL's multi-turn ones, or a
user's), the environment seam, BFCL's backends and a user's class behind it, each contained in a worker process.
See README.md."""
from .backends import BFCL, EnvironmentSpec
from .bfcl import bfcl_code, bfcl_code_path, bfcl_wheel, read_bfcl_tasks, read_ground_truth
from .calls import Call, CallResult, Executed, error_counts
from .contained import ContainedEnvironment, ContainedEnvironments, Limits
from .dispatch import BuildError
from .environment import Environment, Environments, InProcessEnvironments, ReplayMismatch, rebuild
from .tasks import Task, read_tasks, write_tasks

__all__ = ["BFCL", "BuildError", "Call", "CallResult", "ContainedEnvironment", "ContainedEnvironments", "Environment",
           "EnvironmentSpec", "Environments", "Executed", "InProcessEnvironments", "Limits", "ReplayMismatch",
           "Task", "bfcl_code", "bfcl_code_path", "bfcl_wheel", "error_counts", "read_bfcl_tasks", "read_ground_truth",
           "read_tasks", "rebuild", "write_tasks"]

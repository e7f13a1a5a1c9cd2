"""Generation: a dataset's prompts → token-exact records, 2,000 requests in flight, crash-safe resume and a
hard budget stop; the budget model that sets each dataset's token target; the run report."""
from ..prompts import Prompt, load_prompts, scan_prompts
from .admission import Admission, AgeModel
from .budget import (
                     BudgetConfig,
                     ContentLengths,
                     DatasetStats,
                     OutputLengths,
                     Plan,
                     PriceBasis,
                     Prices,
                     PromptTurns,
                     measure_prompts,
                     plan_budget,
                     plan_prices,
                     planned_vs_actual,
                     plot_plan,
                     scenario_table,
)
from .config import GenerateConfig
from .datasets import DatasetSpec, get_dataset, load_datasets, write_targets
from .engine import generate, run_generation
from .fidelity import FidelityJudge, ignore_suspects
from .pacing import Pacing
from .parts import Seams
from .report import (
                     RunHealth,
                     batches_table,
                     dataset_rows,
                     dataset_summaries,
                     datasets_table,
                     plot_datasets,
                     plot_health,
                     plot_records,
                     provider_table,
                     record_stats,
                     summary_table,
                     tool_loop_note,
                     without_timelines,
)
from .route_plan import RouteChoice, RoutePlan, plan_routes, plot_routes
from .store import Store, StoreLocked

__all__ = ["Admission", "AgeModel", "BudgetConfig", "DatasetSpec", "DatasetStats", "FidelityJudge", "GenerateConfig",
           "Seams", "OutputLengths", "Plan", "Prices", "Prompt", "ContentLengths", "PromptTurns",
           "Store", "StoreLocked", "generate", "get_dataset", "ignore_suspects", "load_datasets", "load_prompts",
           "Pacing", "dataset_rows", "dataset_summaries", "datasets_table", "plot_datasets", "without_timelines",
           "measure_prompts", "plan_budget", "plan_prices", "PriceBasis", "planned_vs_actual", "plot_plan",
           "plot_health", "plot_records", "provider_table", "RunHealth",
           "record_stats", "run_generation", "scan_prompts", "scenario_table", "summary_table", "tool_loop_note",
           "write_targets", "batches_table", "RouteChoice", "RoutePlan", "plan_routes", "plot_routes"]

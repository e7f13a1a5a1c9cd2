"""Generation: a dataset's prompts → token-exact records, 2,000 requests in flight, crash-safe resume and a
hard budget stop; the budget model that sets each dataset's token target; the run report."""
from ..prompts import Prompt, load_prompts, scan_prompts
from .config import GenerateConfig
from .conversations.datasets import DatasetSpec, get_dataset, load_datasets, write_targets
from .conversations.fidelity import FidelityJudge, ignore_suspects
from .conversations.store import Store, StoreLocked
from .money.admission import Admission, AgeModel
from .plan.agentic import plan_agentic
from .plan.budget import (
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
from .plan.route_plan import RouteChoice, RoutePlan, plan_routes, plot_routes
from .realtime.pacing import Pacing
from .realtime.parts import Seams
from .report.run_report import (
                     RunHealth,
                     batches_table,
                     dataset_rows,
                     dataset_summaries,
                     datasets_table,
                     environments_table,
                     plot_datasets,
                     plot_health,
                     plot_records,
                     provider_table,
                     record_stats,
                     summary_table,
                     tool_loop_note,
                     without_timelines,
)
from .run import generate, run_generation

__all__ = ["Admission", "AgeModel", "BudgetConfig", "DatasetSpec", "DatasetStats", "FidelityJudge", "GenerateConfig",
           "Seams", "OutputLengths", "Plan", "Prices", "Prompt", "ContentLengths", "PromptTurns",
           "Store", "StoreLocked", "generate", "get_dataset", "ignore_suspects", "load_datasets", "load_prompts",
           "Pacing", "dataset_rows", "dataset_summaries", "datasets_table", "plot_datasets", "without_timelines",
           "measure_prompts", "plan_agentic", "plan_budget", "plan_prices", "PriceBasis", "planned_vs_actual",
           "plot_plan",
           "plot_health", "plot_records", "provider_table", "RunHealth",
           "record_stats", "run_generation", "scan_prompts", "scenario_table", "summary_table", "tool_loop_note",
           "write_targets", "batches_table", "environments_table", "RouteChoice", "RoutePlan", "plan_routes",
           "plot_routes"]

"""echo-scheduler: ECHO's elastic super-tree budget scheduler and its baselines, behind one
interface (:mod:`echo_scheduler.interface`), plus the verify-cost model and a trace-driven
simulator. (The cluster budget split, water-filling, lives in echo-controller.)"""

from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import BudgetChoice, VerifyCostModel, choose_budget, gain_curve
from echo_scheduler.errors import CostModelError, PolicyError, SchedulerError, TraceError
from echo_scheduler.interface import BasePolicy, DraftPlan, Policy, StepBatch, StepOutcome
from echo_scheduler.policies import POLICY_NAMES, EchoPolicy, make_policy
from echo_scheduler.pool import Children, grow_pool

__all__ = [
    "POLICY_NAMES",
    "BasePolicy",
    "BudgetChoice",
    "Children",
    "CostModelError",
    "DraftPlan",
    "EchoPolicy",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "SchedulerError",
    "StepBatch",
    "StepOutcome",
    "TraceError",
    "VerifyCostModel",
    "choose_budget",
    "gain_curve",
    "grow_pool",
    "make_policy",
]
__version__ = "0.1.0"

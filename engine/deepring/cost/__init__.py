"""The step-time cost model shared by the scheduler (chunk size from a latency target), the
routers (predicted completion time and batch compute) and the cluster simulator. Torch-free:
the frontend and the simulator import it without loading torch."""

from deepring.cost.model import FEATURES, OnlineFit, StepCost, StepShape

__all__ = ["FEATURES", "OnlineFit", "StepCost", "StepShape"]

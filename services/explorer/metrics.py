"""What the explorer exports to Prometheus (docs/metrics.md): figures of the per-step metrics the
step loop logs to its monitor (explorer.py), set as each step is logged."""

from __future__ import annotations

from services.common.metrics import ServiceMetrics, StepMetric, StepMirror
from services.common.monitor import Monitor

STEP_METRICS = (
    StepMetric(
        "time/sync_s",
        "trinity_explorer_weight_sync_seconds",
        "Seconds before each step spent asking the synchronizer and loading the version it named.",
        histogram=True,
    ),
    StepMetric(
        "time/step_s",
        "trinity_explorer_step_seconds",
        "Seconds of each explore step: rollouts, rewards, writes to the buffer.",
        histogram=True,
    ),
    StepMetric(
        "rollout/tokens_per_s",
        "trinity_explorer_tokens_per_second",
        "Response tokens generated per second in the last step.",
    ),
    StepMetric(
        "rollout/model_version",
        "trinity_explorer_model_version",
        "The weight version that generated the last step's rollouts.",
    ),
)


def step_mirror(inner: Monitor, metrics: ServiceMetrics) -> StepMirror:
    """The explorer's monitor: `inner` plus the Prometheus figures above."""
    return StepMirror(inner, metrics, STEP_METRICS, "trinity_explorer_step")

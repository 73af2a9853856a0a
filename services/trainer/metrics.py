"""What the trainer exports to Prometheus (docs/metrics.md): figures of the per-step metrics the
training loop logs to its monitor (service.py), set as each step is logged."""

from __future__ import annotations

from services.common.metrics import ServiceMetrics, StepMetric, StepMirror
from services.common.monitor import Monitor

STEP_METRICS = (
    StepMetric(
        "time/step",
        "trinity_trainer_step_seconds",
        "Seconds of each train step: old/reference logprobs, advantages, forward, backward, optimizer.",
        histogram=True,
    ),
    StepMetric(
        "perf/tokens_per_s",
        "trinity_trainer_tokens_per_second",
        "Tokens (prompt + response, no padding) trained per second in the last step.",
    ),
    StepMetric(
        "time/read",
        "trinity_trainer_read_seconds",
        "Seconds each step waited for and read its batch from the buffer.",
        histogram=True,
    ),
    StepMetric(
        "time/publish",
        "trinity_trainer_weight_publish_seconds",
        "Seconds each step spent handing its weights to the synchronizer (0 when it published none).",
        histogram=True,
    ),
    StepMetric(
        "staleness/mean",
        "trinity_trainer_batch_staleness",
        "Mean versions the last batch's experiences were behind the model that trained on them.",
    ),
)


def step_mirror(inner: Monitor, metrics: ServiceMetrics) -> StepMirror:
    """The trainer's monitor: `inner` plus the Prometheus figures above."""
    return StepMirror(inner, metrics, STEP_METRICS, "trinity_trainer_step")

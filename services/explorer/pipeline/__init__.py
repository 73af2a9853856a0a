"""Experience pipeline: operators applied to each step's experiences before they are written."""

from services.explorer.pipeline.operators import EXPERIENCE_OPERATORS, ExperienceOperator, ExperiencePipeline

__all__ = ["EXPERIENCE_OPERATORS", "ExperienceOperator", "ExperiencePipeline"]

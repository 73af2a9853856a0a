"""`cod:`, Trinity-RFT v0.6's research Connect-the-Dots (CoD) section.

With the section given, the explorer packs each step's tasks into packs of `task_pack_size`
(`eval_task_pack_size` for evaluation) tasks of one taskset, and one CoD rollout solves a pack's
tasks in turn, updating a `Hints:` block between them (docs/workflows.md, "Connect the Dots").
Without it nothing is packed. `cod_workflow_args` are the pack workflow's settings; Trinity reads
them from a free dict, here each key is typed, bounded and documented, and an unknown key is
refused by name.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from services.common.config.base import Section

CodMethod = Literal["iterative_hint_e2e"]
UpdateContextImpl = Literal["update_context", "update_context_agent", "pde_update_context"]


def _default_methods() -> list[CodMethod]:
    return ["iterative_hint_e2e"]


class CodWorkflowArgs(Section):
    """The CoD pack workflow's settings (`cod.cod_workflow_args`)."""

    activated_cod_methods: list[CodMethod] = Field(default_factory=_default_methods, min_length=1)
    """CoD methods run on each pack, in order. iterative_hint_e2e: solve task 1 with no hint, update the
    hints from its trajectory, reward and feedback, solve task 2 with them, and so on; every episode
    of the pack is trained end to end (the only method of Trinity's study)."""
    hint_example: bool = False
    """Append an example hint block to the hint-update system prompt."""
    update_context_impl: UpdateContextImpl = "update_context"
    """How hints are updated: update_context (one chat call, shown the task's reward and feedback),
    pde_update_context (the PDE-discovery environment's: the same call without the reward) or
    update_context_agent (an AgentScope agent; refused by `trinity config check` and at run time, not
    implemented here); a taskset's workflow_args.update_context_impl overrides it."""
    reuse_workflow_instance: bool = False
    """Reset and reuse one episode workflow instance per pack position (within a pack workflow's life)
    instead of building a new one per task; the rollouts are the same."""
    context_compression_mode: Literal["keep_all", "remove_think", "keep_answer"] | None = None
    """What a multi-step episode keeps of its earlier replies (all, all but <think> blocks, the
    <answer> only), for tasksets whose workflow_args do not set it; unset: theirs (keep_all)."""
    max_response_tokens_restraint: int | None = Field(default=None, gt=0)
    """Asks the model (in the system prompt) to keep each response under this many tokens; unset: no
    such instruction. Not a hard cap (that is model.max_response_tokens)."""
    hint_penalty_coef: float = Field(default=0.0, ge=0.0)
    """Reward of a hint-update episode: -hint_penalty_coef when the hint block cannot be parsed,
    else -hint_penalty_coef x the length ramp (len_zero_penalty .. len_max_penalty), else 0."""
    len_zero_penalty: int | None = Field(default=None, ge=0)
    """Response tokens of a hint update below which it is not penalized (with len_max_penalty). A solve
    episode's length penalty (length_penalty_coef, len_zero_penalty, len_full_penalty) is the
    taskset's workflow_args, as in Trinity."""
    len_max_penalty: int | None = Field(default=None, gt=0)
    """Response tokens of a hint update at which the full hint_penalty_coef applies."""
    len_min_penalty: int | None = Field(default=None, ge=0)
    """A hint update shorter than this many response tokens gets the full penalty (unset: none)."""
    task_reward_decay: float = Field(default=1.0, gt=0.0, le=1.0)
    """total_reward of a pack = sum_i r_i x decay^(n-1-i): later tasks weigh more; 1: the plain sum."""
    cod_log_interval: int = Field(default=20, ge=1)
    """Write the pack's rollouts as JSON under log_dir/exp_name every this many explorer steps."""
    log_dir: str = "./logs/research_cod"
    """Root directory of the CoD rollout logs."""
    exp_name: str = "cod"
    """Subdirectory of log_dir for this run's logs."""
    inject_pack_seed: bool = False
    """Give every task of a pack raw_task pack_seed / task_idx / pack_size, so environments with a
    per-pack hidden rule (obscure FrozenLake's action codes, random alchemy's recipes) share it."""
    stable_pack_seed: bool = False
    """With inject_pack_seed: derive the seed from the pack's taskset and row indices (the same pack
    gets the same hidden rule at every evaluation), not from the step and task ids."""
    pad_tasks_to_full_pack: bool = False
    """A taskset's tasks that do not fill the last pack are completed by repeating its first tasks;
    false: they are dropped for the step."""
    enable_teacher_logprobs: bool = False
    """Trinity's on-policy-distillation switch for CoD packs (teacher logprobs on every episode):
    false only, distillation of CoD packs is not implemented here."""

    @model_validator(mode="after")
    def _ramps(self) -> CodWorkflowArgs:
        if self.len_zero_penalty is not None and self.len_max_penalty is not None:
            if self.len_zero_penalty >= self.len_max_penalty:
                raise ValueError(
                    f"cod.cod_workflow_args.len_zero_penalty ({self.len_zero_penalty}) must be below "
                    f"len_max_penalty ({self.len_max_penalty})"
                )
        if self.enable_teacher_logprobs:
            raise ValueError(
                "cod.cod_workflow_args.enable_teacher_logprobs true: teacher logprobs for CoD packs (on-policy "
                "distillation of CoD rollouts) are not implemented here; set it false"
            )
        return self


class CodConfig(Section):
    """Connect-the-Dots task packing (see the module docstring)."""

    task_pack_size: int = Field(default=4, ge=1)
    """Tasks of one taskset packed into one CoD rollout for training."""
    eval_task_pack_size: int | None = Field(default=None, ge=1)
    """Tasks per pack for evaluation; unset: task_pack_size."""
    packing_strategy: Literal["cod", "ralph_sample", "ralph_full"] = "cod"
    """cod: consecutive tasks form a pack; ralph_sample: the first task of each would-be pack repeated
    pack-size times; ralph_full: every task repeated pack-size times (a pack per task, none dropped)."""
    cod_workflow_args: CodWorkflowArgs = CodWorkflowArgs()
    """The pack workflow's settings."""

    def pack_size(self, is_eval: bool) -> int:
        """Tasks per pack for training or evaluation tasks."""
        if is_eval and self.eval_task_pack_size is not None:
            return self.eval_task_pack_size
        return self.task_pack_size

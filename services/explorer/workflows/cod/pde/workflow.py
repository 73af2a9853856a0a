"""`cod_pde_discovery_workflow` (Trinity's
trinity.common.workflows.connect_the_dots.pde_discovery.workflow.CoDPDEDiscoveryWorkflow): find the
hidden reaction term of u_t = u_xx + f(u) by sampling, regression and committing an equation.

Each step the model sees the task's status (prompts.py) and answers with one XML action in
<answer>...</answer> (lab.py). The task ends when update_scientific_context is accepted (reward
1 / (1 + loss) against the hidden equation, lab.py), on a reply that is not one XML action or names an
unknown action (format error, reward 0), or after max_steps (reward 0). The pack's tasks share the hidden
equation and the sampled data (settings.py: PdePack, kept in the pack run's pack_state); feedback() for
the hint update is the last diagnostic and equations, never the reward (so pde_update_context hides it
too). From the third step on, observations older than the last two lose their action feedback. The
numpy work (a new pack's draw, sampling, regression) runs in a worker thread, off the event loop.

Task row fields (Trinity's generator, examples/research_cod/get_pde_discovery_data.py): seed (42),
task_desc (the prompt_key column), task_idx / pack_size / pack_seed (injected by the pack run), and
for fixed evaluation packs pde_environment_seed, ground_truth_template_index,
ground_truth_template_instance, eval_pack_index. workflow_args: settings.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import xml.etree.ElementTree as ET
from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.common.logging import get_logger
from services.explorer.workflows.base import Task
from services.explorer.workflows.cod.episode import CodEpisodeWorkflow, between
from services.explorer.workflows.cod.pde import families, prompts
from services.explorer.workflows.cod.pde.lab import PdeLab
from services.explorer.workflows.cod.pde.settings import PdeSettings, open_pack

LIST_TAGS = frozenset({"dictionary", "candidate_equations", "uncertain_terms"})
FEEDBACK_MARK = "Action feedback:"
log = get_logger("explorer.workflows.cod.pde")


def _value(element: ET.Element) -> Any:
    children = list(element)
    if not children:
        return dict(element.attrib) if element.attrib else (element.text or "").strip()
    if (element.text or "").strip() or any((c.tail or "").strip() for c in children):
        raise ValueError("text mixed with elements")
    if element.tag in LIST_TAGS:
        return [_value(c) for c in children]
    value: dict[str, Any] = dict(element.attrib)
    for child in children:
        item = _value(child)
        if child.tag not in value:
            value[child.tag] = item
        elif isinstance(value[child.tag], list):
            value[child.tag].append(item)
        else:
            value[child.tag] = [value[child.tag], item]
    return value


def parse_action(reply: str) -> tuple[str | None, Any, str]:
    """(action, its arguments, "") from the reply's one <answer> block, or (None, None, why not).
    Arguments: a leaf's attributes or text; an element's children by tag (a repeated tag as a list);
    the children of dictionary / candidate_equations / uncertain_terms as a list."""
    content = between(reply, "<answer>", "</answer>")
    if content is None:
        return None, None, "expected_exactly_one_answer_tag"
    try:
        root = ET.fromstring(content)
        args = _value(root)
    except (ET.ParseError, ValueError):
        return None, None, "invalid_answer_xml"
    return root.tag, {} if args == "" else args, ""


class CodPdeDiscoveryWorkflow(CodEpisodeWorkflow):
    """See the module docstring."""

    @classmethod
    def preflight(cls, workflow_args: dict[str, Any]) -> list[str]:
        problems = super().preflight(workflow_args)
        try:
            settings = PdeSettings.from_args(workflow_args)
            templates = families.load_templates(settings.family, settings.dictionary)
            families.eligible(templates, *settings.term_range())
        except InvalidArgument as exc:
            problems.append(str(exc))
        return problems

    def setup(self, task: Task) -> None:
        self.settings = PdeSettings.from_args(task.workflow_args)

    @property
    def max_step_num(self) -> int:
        return self.settings.max_steps

    def system_prompt(self) -> str:
        return prompts.system_prompt(self.settings.dictionary, self.settings.support_size_text())

    def start(self) -> None:
        raw = self.task.raw_task
        self.pack, self.position = self.opened
        self.pack_size = int(raw.get("pack_size", self.settings.pack_size))
        self.lab = PdeLab(self.settings, self.pack, position=self.position, seed=int(raw.get("seed", 42)))
        self.action_feedback: str | None = None
        self.steps_taken = 0
        uid = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(raw.get("uid", f"task_{self.task.task_id}")))
        name = (
            f"pde-{self.pack.environment_seed}_{uid}_pos{self.position}_pid{os.getpid()}_obj{id(self)}.jsonl"
        )
        self.dump_path = os.path.join(self.settings.dump_root, "trajectory_dumps", name)

    async def step_async(self, step: int) -> tuple[bool, list[Experience]]:
        lab = self.lab
        user = prompts.user_prompt(
            position=self.position, pack_size=self.pack_size, step=step + 1, max_steps=self.max_step_num,
            budget=lab.budget, point_budget=self.settings.point_budget, task=self.task.task_desc,
            datasets=sorted(self.pack.datasets), last_max_error=lab.last_max_error,
            evidence=self.pack.last_update.get("evidence", {}), feedback=self.action_feedback,
        )  # fmt: skip
        exp = await self.ask(user)
        self.steps_taken = step + 1
        action, args, why = parse_action(exp.response_text)
        if action is None:
            exp.info["pde_parse_error"] = why
            feedback, done, format_error = (
                "Invalid format: a reply must hold exactly one XML action inside <answer>...</answer>. Game over.",
                True,
                True,
            )
        else:
            feedback, done, format_error = await asyncio.to_thread(lab.act, action, args)  # numpy work
        self.action_feedback, self.format_error = feedback, format_error
        self.final_reward = 0.0 if format_error else lab.reward
        self.dump({"event": "step", "step": step + 1, "response": exp.response_text, "action": action,
                   "args": args, "feedback": feedback, "done": done, "format_error": format_error})  # fmt: skip
        return not done, [exp]

    def compress_memory(self, step: int) -> None:
        super().compress_memory(step)
        users = [m for m in self.memory if m["role"] == "user"]
        for message in users[: max(0, step - 1)]:  # all but the last two observations
            head, mark, _ = message["content"].partition(FEEDBACK_MARK)
            if mark:
                message["content"] = f"{head}{FEEDBACK_MARK}\n[History compressed.]"

    def diagnostic(self) -> float:
        """The latest sampled-data max error; blind_submission_penalty when nothing was fitted."""
        error = self.lab.last_max_error
        return self.settings.blind_penalty if error is None else error

    def feedback(self) -> str:
        if self.format_error:
            return self.action_feedback or "Invalid action."
        return (
            f"Latest sampled-data diagnostic: {self.diagnostic()}\n"
            f"Latest finalized equation: {self.pack.preferred_equation or 'none'}\n"
            f"Latest regression candidate: {self.pack.latest_regression or 'none'}"
        )

    async def run_async(self) -> list[Experience]:
        # a new pack calibrates its family and checks draws for stability: numpy work kept off the event loop
        self.opened = await asyncio.to_thread(open_pack, self.settings, self.task.raw_task, self.pack_state)
        exps = await super().run_async()
        if exps:
            exps[-1].metrics.update(self.metrics())
            self.dump({"event": "final", "step": self.steps_taken, "reward": exps[-1].reward,
                       "feedback": self.feedback(), "metrics": exps[-1].metrics})  # fmt: skip
        return exps

    def metrics(self) -> dict[str, float]:
        """Trinity's pde_* metrics of the episode (hidden-equation recovery, points used, ...)."""
        lab, pack, blind = self.lab, self.pack, self.settings.blind_penalty
        target = pack.equation
        recovered = float(lab.committed and set(pack.preferred_support) == set(target))
        coefficient_error = 1.0
        if recovered:
            errors = [
                abs(pack.preferred_coefficients.get(t, 0.0) - c) / max(1e-6, abs(c))
                for t, c in target.items()
            ]
            coefficient_error = sum(errors) / len(errors)
        scores = lab.scores
        l1 = scores.get("l1", blind)
        size, template = len(target), pack.template_index
        raw = self.task.raw_task
        out = {
            "pde_structure_recovery": recovered,
            "pde_coefficient_relative_error": coefficient_error,
            "pde_sample_efficiency_points": float(self.settings.point_budget - lab.budget),
            "pde_last_sampled_max_error": float(self.diagnostic()),
            "pde_hidden_formula_normalized_l1_error": l1,
            "pde_hidden_formula_extra_support_penalty": scores.get("extra_support", 0.0),
            "pde_hidden_formula_reward_loss": scores.get("loss", blind),
            "pde_ground_truth_support_size": float(size),
            "pde_ground_truth_template_index": float(-1 if template is None else template),
            "pde_ground_truth_template_instance": float(raw.get("ground_truth_template_instance", -1)),
            "pde_eval_pack_index": float(raw.get("eval_pack_index", -1)),
            f"pde_structure_recovery_support_size_{size}": recovered,
            f"pde_hidden_formula_l1_support_size_{size}": l1,
            f"pde_hidden_formula_reward_support_size_{size}": self.final_reward,
        }
        if template is not None:
            out[f"pde_structure_recovery_template_{template}"] = recovered
            out[f"pde_hidden_formula_l1_template_{template}"] = l1
            out[f"pde_hidden_formula_reward_template_{template}"] = self.final_reward
        return out

    def dump(self, record: dict[str, Any]) -> None:
        """One JSON line of the episode under <checkpoint_job_dir>/trajectory_dumps (dump_trajectories)."""
        if not self.settings.dump:
            return
        row = {
            "uid": self.task.raw_task.get("uid"), "task_position": self.position, "budget_left": self.lab.budget,
            "latest_regression_equation": self.pack.latest_regression,
            "current_equation": self.pack.preferred_equation, "reward_so_far": self.final_reward, **record,
        }  # fmt: skip
        try:
            os.makedirs(os.path.dirname(self.dump_path), exist_ok=True)
            with open(self.dump_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row, default=str) + "\n")
        except OSError as exc:  # a full disk must not fail the rollout
            log.warning("pde_trajectory_dump_failed", path=str(self.dump_path), error=str(exc))

"""`cod_optimalcontrol_workflow`: write one feedback controller for hidden linear dynamics.

Trinity's CoDOptimalControlWorkflow. State (x, v); each of `horizon` steps applies u = clip(u(x, v,
t, x_target, v_target), -1, 1) and
    v' = a * v + b * u + noise,   x' = x + v'.
a and b are hidden and shared by a pack (drawn from the pack seed, else the row's seed:
random.Random(seed); a uniform in a_env_range, b uniform in b_env_range outside (-min_abs_b_env,
min_abs_b_env)). The model answers once with
`<answer><action_expression>EXPR</action_expression></answer>` ending its reply, EXPR in the
language of control_expr.py. Reward: 1 / (1 + L), L = (x_T - x_target)^2 + 2 (v_T - v_target)^2 +
control_penalty_coef * sum u_t^2; -0.1 when the answer does not parse (or the reply has a code
fence); 0 when the expression fails while running.

Row fields: x0, v0, x_target, v_target, horizon (or max_horizon), control_penalty_coef, seed.
workflow_args (Trinity's names): a_env_range, b_env_range (required), min_abs_b_env (0),
enable_process_noise (false) with process_noise_std (0: Gaussian noise from random.Random(seed ^
0x5DEECE66D)), include_previous_control_policy (false: with it, a task of a pack run sees the last
expression that ran on an earlier task of the run, with how it did).
"""

from __future__ import annotations

import math
import random
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import Task
from services.explorer.workflows.cod.control_expr import compile_controller, validate
from services.explorer.workflows.cod.episode import CodEpisodeWorkflow, between

PARSE_FAILURE_REWARD = -0.1
NOISE_SALT = 0x5DEECE66D

SYSTEM_PROMPT = """You design a feedback controller for a one-dimensional system with position x and velocity v.
Each step t applies a control u (clipped to [-1, 1]) and the system moves by
    v_next = a * v + b * u{noise}
    x_next = x + v_next
where a and b are fixed but unknown to you{sign}. After the horizon, the loss is
(x_T - x_target)^2 + 2 * (v_T - v_target)^2 + {penalty} * (sum of u_t^2), and the reward is 1 / (1 + loss).

Submit one expression for u using numbers, the variables x, v, t, x_target, v_target, horizon,
remaining_steps, the operators + - * / ** and comparisons, `a if c else b`, and the functions abs,
min, max, pow, clip(value, low, high), ifelse(cond, a, b), lt, le, gt, ge, eq, ne. No code blocks.

Think briefly, then end your reply with:
<answer><action_expression>your expression</action_expression></answer>"""


def sample_b(rng: random.Random, low: float, high: float, min_abs: float) -> float:
    """Uniform on [low, high] without (-min_abs, min_abs)."""
    if low > high or min_abs < 0:
        raise InvalidArgument(
            f"b_env_range [{low}, {high}] with min_abs_b_env {min_abs}", field="workflow_args.b_env_range"
        )
    if min_abs == 0.0:
        return rng.uniform(low, high)
    left = max(0.0, min(high, -min_abs) - low)
    right_start = max(low, min_abs)
    right = max(0.0, high - right_start)
    if left + right == 0.0:
        for edge in (-min_abs, min_abs):
            if low <= edge <= high:
                return edge
        raise InvalidArgument(
            f"b_env_range [{low}, {high}] has no value with |b| >= {min_abs}",
            field="workflow_args.min_abs_b_env",
        )
    offset = rng.random() * (left + right)
    return low + offset if offset < left else right_start + (offset - left)


@dataclass
class ControlTask:
    a: float
    b: float
    x0: float
    v0: float
    x_target: float
    v_target: float
    horizon: int
    penalty: float
    noise_std: float
    seed: int

    @classmethod
    def resolve(cls, raw: dict[str, Any], args: dict[str, Any]) -> ControlTask:
        for key in ("a_env_range", "b_env_range"):
            if key not in args:
                raise InvalidArgument(
                    f"cod_optimalcontrol_workflow needs {key}", field=f"workflow_args.{key}"
                )
        rng = random.Random(int(raw.get("pack_seed", raw["seed"])))
        a = rng.uniform(*map(float, args["a_env_range"]))
        low, high = map(float, args["b_env_range"])
        b = sample_b(rng, low, high, float(args.get("min_abs_b_env", 0.0)))
        horizon = raw.get("horizon")
        noise = float(args.get("process_noise_std", 0.0)) if args.get("enable_process_noise", False) else 0.0
        return cls(
            a, b, float(raw["x0"]), float(raw["v0"]), float(raw["x_target"]), float(raw["v_target"]),
            int(horizon if horizon is not None else raw["max_horizon"]), float(raw["control_penalty_coef"]),
            noise, int(raw["seed"]),
        )  # fmt: skip

    def rollout(self, controller: Any) -> dict[str, Any]:
        """States, controls, loss and reward; RuntimeError naming the step where u failed."""
        x, v, xs, vs, us = self.x0, self.v0, [self.x0], [self.v0], []
        noise = random.Random(self.seed ^ NOISE_SALT)
        for t in range(self.horizon):
            try:
                raw_u = controller(x, v, t, self.x_target, self.v_target)
                if isinstance(raw_u, bool) or not isinstance(raw_u, int | float) or not math.isfinite(raw_u):
                    raise ValueError("action must return a finite int or float scalar")
            except Exception as exc:  # noqa: BLE001 - the model's expression failing is feedback
                raise RuntimeError(f"action failed at t={t}: {type(exc).__name__}: {exc}"[:500]) from exc
            u = max(-1.0, min(float(raw_u), 1.0))
            us.append(u)
            v = self.a * v + self.b * u + (noise.gauss(0.0, self.noise_std) if self.noise_std > 0 else 0.0)
            x += v
            xs.append(x)
            vs.append(v)
        loss = (x - self.x_target) ** 2 + 2 * (v - self.v_target) ** 2 + self.penalty * sum(u * u for u in us)
        return {"xs": xs, "vs": vs, "us": us, "loss": loss, "reward": 1.0 / (1.0 + loss)}

    def render(self, result: dict[str, Any]) -> str:
        xs, vs, us = result["xs"], result["vs"], result["us"]
        lines = [f"{'t':>3}  {'x_t':>10}  {'v_t':>10}  {'u_t':>10}"]
        lines += [f"{t:>3}  {xs[t]:>10.3f}  {vs[t]:>10.3f}  {us[t]:>10.3f}" for t in range(self.horizon)]
        lines.append(f"{self.horizon:>3}  {xs[-1]:>10.3f}  {vs[-1]:>10.3f}  {'--':>10}")
        lines.append(
            f"Terminal x = {xs[-1]:.3f}, v = {vs[-1]:.3f}; target x = {self.x_target:.3f}, v = {self.v_target:.3f}; "
            f"loss {result['loss']:.3f}, reward {result['reward']:.3f}."
        )
        return "\n".join(lines)


def parse_submission(reply: str) -> tuple[str | None, str]:
    """(expression, "") or (None, why it does not parse)."""
    if "```" in reply:
        return None, "python_or_markdown_code_is_not_allowed"
    content = between(reply, "<answer>", "</answer>")
    if content is None:
        return None, "expected_exactly_one_answer_tag"
    if reply[reply.rfind("</answer>") + len("</answer>") :].strip():
        return None, "answer_must_end_the_response"
    try:
        element = ET.fromstring(content)
    except ET.ParseError:
        return None, "invalid_answer_xml"
    if element.tag != "action_expression" or len(element) or element.attrib:
        return None, "expected_action_expression"
    try:
        return validate(element.text or ""), ""
    except ValueError as exc:
        return None, str(exc)


def as_xml(expression: str) -> str:
    return f"<answer><action_expression>{escape(expression)}</action_expression></answer>"


class CodOptimalControlWorkflow(CodEpisodeWorkflow):
    """See the module docstring. One step: one reply, one rollout of its controller."""

    def setup(self, task: Task) -> None:
        self.control = ControlTask.resolve(task.raw_task, task.workflow_args)
        self.share_policy = bool(task.workflow_args.get("include_previous_control_policy", False))
        low, high = map(float, task.workflow_args["b_env_range"])
        self.b_sign = " (b is positive)" if low > 0 else " (b is negative)" if high < 0 else ""

    @property
    def max_step_num(self) -> int:
        return 1

    def system_prompt(self) -> str:
        noise = " + noise" if self.control.noise_std > 0 else ""
        return SYSTEM_PROMPT.format(noise=noise, sign=self.b_sign, penalty=self.control.penalty)

    def start(self) -> None:
        self.result: dict[str, Any] | None = None
        self.status, self.detail, self.user = "format_error", "", ""
        self.expression: str | None = None

    def user_prompt(self) -> str:
        c = self.control
        text = (
            f"Start: x0 = {c.x0}, v0 = {c.v0}. Target: x_target = {c.x_target}, v_target = {c.v_target}. "
            f"Horizon: {c.horizon} steps."
        )
        earlier = self.pack_state.get("optimal_control/policy") if self.share_policy else None
        if earlier:
            text += (
                "\n\nFrom an earlier task in the same hidden system (not this task's result): the expression "
                f"{as_xml(earlier['expression'])} got reward {earlier['reward']:.3f} with terminal residuals "
                f"x_T - x_target = {earlier['dx']:.3f}, v_T - v_target = {earlier['dv']:.3f}. Adapt it to this "
                "task, or write a new one."
            )
        return text

    async def step_async(self, step: int) -> tuple[bool, list[Experience]]:
        user = self.user_prompt()
        exp = await self.ask(user)
        self.user = user
        self.expression, self.detail = parse_submission(exp.response_text)
        if self.expression is None:
            self.final_reward, self.format_error = PARSE_FAILURE_REWARD, True
            return False, [exp]
        try:
            self.result = self.control.rollout(compile_controller(self.expression, self.control.horizon))
        except RuntimeError as exc:
            self.status, self.detail, self.final_reward = "action_error", str(exc), 0.0
            return False, [exp]
        self.status, self.final_reward = "ok", float(self.result["reward"])
        exp.metrics["loss"] = float(self.result["loss"])
        if self.share_policy:  # the next task of this pack run sees it
            self.pack_state["optimal_control/policy"] = {
                "expression": self.expression,
                "reward": self.final_reward,
                "dx": self.result["xs"][-1] - self.control.x_target,
                "dv": self.result["vs"][-1] - self.control.v_target,
            }
        return False, [exp]

    def trajectory(self) -> str:
        rules = self.memory[0]["content"].split("\n\n## ")[0]
        answer = as_xml(self.expression) if self.expression else self.memory[-1]["content"]
        label = "Submitted action expression" if self.expression else "Reply (no valid action expression)"
        return f"System:\n{rules}\n\nTask:\n{self.user}\n\n{label}:\n{answer}"

    def feedback(self) -> str:
        if self.status == "ok" and self.result is not None:
            return "The system ran the submitted controller:\n\n" + self.control.render(self.result)
        if self.status == "action_error":
            return f"Invalid policy: {self.detail}. No complete rollout; reward 0."
        return (
            "Invalid submission: expected one final <answer><action_expression>...</action_expression></answer> "
            f"({self.detail}); the system did not run; reward {PARSE_FAILURE_REWARD}."
        )

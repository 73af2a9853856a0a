"""`cod_frozenlake_obscure_workflow`: FrozenLake whose moves are the codes 1-4 of a hidden mapping.

Trinity's CoDFrozenLakeObscureWorkflow. The lake is frozen_lake_env.py's (the same map as
Trinity's for a row's size / p / seed, and the same slips). The model answers
`<answer>Direction X</answer>`, X in 1..4, and the hidden mapping says which way X moves; what a
pack's tasks share, and the hints can carry, is that mapping. A reply without that answer, or with
another X, ends the episode (reward 0, a format error). Reaching the goal pays 1.0.

workflow_args (Trinity's names and defaults): env_max_steps (8: the map has a path this short),
agent_max_steps (10 moves), desc (a fixed map), is_slippery (false), and mapping_mode:
- global: workflow_args.global_mapping ({1: "Down", ...}), else mapping_index (0-23: the
  permutations of Down, Right, Up, Left in itertools order), else 1 Down, 2 Right, 3 Up, 4 Left;
- per_pack: shuffled by the pack's seed (cod.cod_workflow_args.inject_pack_seed; outside a pack,
  the row's seed), so a pack's tasks share it;
- per_task: the row's action_mapping, else mapping_index, else mapping_seed, else its seed.
A shuffle by seed s is Python's random.Random(s).shuffle of [Down, Right, Up, Left], as Trinity's.
"""

from __future__ import annotations

import itertools
import random
import re
from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import Task
from services.explorer.workflows.cod.episode import CodEpisodeWorkflow, answer_of
from services.explorer.workflows.frozen_lake_env import ACTION_NAMES, lake_of_task

DIRECTIONS = ("Down", "Right", "Up", "Left")
PERMUTATIONS = list(itertools.permutations(DIRECTIONS))
DEFAULT_MAPPING = {1: "Down", 2: "Right", 3: "Up", 4: "Left"}
MODES = ("global", "per_pack", "per_task")
_ACTION_OF = {name: action for action, name in ACTION_NAMES.items()}
_DIRECTION = re.compile(r"[Dd]irection\s+(\d+)$")

SYSTEM_PROMPT = """You are playing FrozenLake on a grid.

Symbols: P is you, _ is frozen ice you can stand on, O is a hole, G is the goal. X means you fell
into a hole; a tick means you stand on the goal. Rows and columns count from 0 at the top left.

Reach G without falling into a hole. Each turn you make one move, written as a code from 1 to 4.
Every code moves you one cell in a fixed direction (up, down, left or right), but which code means
which direction is not told: find it out from how your position changes. Moving off the edge
leaves you where you are.

Think briefly, then end your reply with your move as <answer>Direction X</answer>, X being 1, 2, 3
or 4. A reply without that answer ends the game."""


def mapping_by_index(index: int) -> dict[int, str]:
    return {i + 1: d for i, d in enumerate(PERMUTATIONS[int(index) % len(PERMUTATIONS)])}


def mapping_by_seed(seed: int) -> dict[int, str]:
    directions = list(DIRECTIONS)
    random.Random(seed).shuffle(directions)
    return {i + 1: d for i, d in enumerate(directions)}


def action_mapping(workflow_args: dict[str, Any], raw_task: dict[str, Any]) -> dict[int, str]:
    """The code -> direction mapping of a task (module docstring)."""
    mode = workflow_args.get("mapping_mode", "global")
    if mode not in MODES:
        raise InvalidArgument(
            f"mapping_mode must be one of {', '.join(MODES)}, got {mode!r}",
            field="workflow_args.mapping_mode",
        )
    seed = raw_task.get("seed", 42)
    if mode == "per_pack":
        return mapping_by_seed(raw_task.get("pack_seed", seed))
    if mode == "per_task":
        if "action_mapping" in raw_task:
            return {int(k): str(v) for k, v in raw_task["action_mapping"].items()}
        if "mapping_index" in raw_task:
            return mapping_by_index(raw_task["mapping_index"])
        return mapping_by_seed(raw_task.get("mapping_seed", seed))
    if workflow_args.get("global_mapping") is not None:
        return {int(k): str(v) for k, v in workflow_args["global_mapping"].items()}
    if workflow_args.get("mapping_index") is not None:
        return mapping_by_index(workflow_args["mapping_index"])
    return dict(DEFAULT_MAPPING)


def parse_code(reply: str) -> int | None:
    """X of the last <answer>Direction X</answer>; None without one."""
    answer = answer_of(reply)
    found = _DIRECTION.match(answer) if answer is not None else None
    return int(found.group(1)) if found else None


class CodFrozenLakeObscureWorkflow(CodEpisodeWorkflow):
    """See the module docstring."""

    def setup(self, task: Task) -> None:
        args, raw = task.workflow_args, task.raw_task
        self.env_max_steps = int(args.get("env_max_steps", 8))
        self.agent_max_steps = int(args.get("agent_max_steps", 10))
        self.lake, self.seed = lake_of_task(args, raw, self.env_max_steps)
        self.mapping = action_mapping(args, raw)

    @property
    def max_step_num(self) -> int:
        return self.agent_max_steps

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def start(self) -> None:
        self.observation = self.lake.reset(self.seed)
        self.last_move: str | None = None
        self.done = False

    def _user_turn(self, step: int) -> str:
        goal = self.lake.goal_position
        where = f" The goal is at row {goal[0]}, column {goal[1]}." if goal else ""
        before = f"{self.last_move}\n\n" if self.last_move else ""
        return (
            f"{before}Move {step + 1} of {self.agent_max_steps}.{where}\n"
            f"You are at row {self.lake.position[0]}, column {self.lake.position[1]}.\n\n{self.observation}"
        )

    async def step_async(self, step: int) -> tuple[bool, list[Experience]]:
        exp = await self.ask(self._user_turn(step))
        exp.info["action_mapping"] = dict(self.mapping)
        code = parse_code(exp.response_text)
        if code is None or code not in self.mapping:
            self.format_error, self.done = True, True
            self.last_move = (
                "Invalid answer: expected <answer>Direction X</answer> with X in 1, 2, 3, 4. Game over."
                if code is None
                else f"Invalid answer: Direction {code} is not a move (1, 2, 3 or 4). Game over."
            )
            return False, [exp]
        before = self.lake.position
        result = self.lake.step(_ACTION_OF[self.mapping[code]])
        after = self.lake.position
        self.observation, self.done = result.observation, result.done
        self.last_move = (
            f"Direction {code} moved you from row {before[0]}, column {before[1]} to row {after[0]}, column {after[1]}."
            if after != before
            else f"Direction {code} left you at row {after[0]}, column {after[1]} (the edge of the map)."
        )
        if result.done and result.reward > 0:
            self.final_reward = result.reward
        return not result.done, [exp]

    def feedback(self) -> str:
        tile = self.lake.tile()
        if tile == "G":
            return "Success: reached the goal (G)."
        if tile == "H":
            return "Failed: fell into a hole (O)."
        if self.format_error:
            return str(self.last_move)
        return f"Failed: out of moves ({self.agent_max_steps}) before reaching the goal."

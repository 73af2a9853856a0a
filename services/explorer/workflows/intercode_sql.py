"""InterCode-SQL: answer a database question by running SQL (Trinity-RFT v0.6's intercode_sql_workflow).

The task row's prompt column (`format.prompt_key`, `query_idx` in Trinity's example) is the index of
one question in InterCode's data file (`workflow_args.data_path`, or the row's `data_path`; e.g.
InterCode's ic_spider_dev.json). The question is played against InterCode's `SqlEnv` as Trinity plays
it: `SqlEnv(image_name, data_path=..., preprocess=<"use <db>">, verbose=...)`, `obs, info =
env.reset(query_idx)`, `obs, reward, done, info = env.step(action)`, `env.close()`; the environment
runs each SQL statement in a MySQL docker container (image `workflow_args.image_name`, default
docker-env-sql) and on `submit` scores the latest result against the gold query's (reward in [0, 1]).

Each turn the model sees "Question: ...\\nDatabase: ...\\nObservation: ..." and answers
`<think>...</think><action>SQL or submit</action>`. A reply without an <action> is not sent: the next
turn shows an "Invalid action" observation instead. The loop runs at most `max_env_steps` (default 10)
turns; a question not finished by then is submitted (`auto_submit`, default true), as Trinity does.
The run's reward is the environment's reward of the last step it took; one experience holds the
whole chat (replies with action mask 1); metrics query_idx, env_rounds, env_done, action_executed,
final_reward (Trinity's).

Needs the `intercode` package (pip install intercode-bench), a running Docker daemon with the SQL
image built (InterCode's setup), and the data file; `preflight` names whichever is missing. Tests
replace `make_env` with a stand-in that has SqlEnv's interface.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.explorer.workflows.base import Task
from services.explorer.workflows.text_env import EnvWorkflow, Rules, play_game, sampling_args

INTERCODE_SQL_SYSTEM_PROMPT = """
You are an agent interacting with the InterCode-SQL environment.

You need to answer the user's natural-language database question by issuing SQL commands.
At each step, first reason briefly, then provide exactly one environment action.

## Action Format
Wrap your reasoning in <think></think> and your action in <action></action>.
The action can be either:
- a MySQL SQL statement to execute in the current database
- submit, when the latest SQL query result is your final answer

Examples:
<think>I should inspect the relevant rows.</think><action>SELECT * FROM table_name LIMIT 5;</action>
<think>The latest result answers the question.</think><action>submit</action>

Do not ask the user for help. Finish the task by yourself.
"""

INVALID_ACTION = "Invalid action. Wrap one SQL statement or submit with <action></action>."
DEFAULT_IMAGE = "docker-env-sql"
_ACTION = re.compile(r"<action>(.*?)</action>", flags=re.DOTALL)


def parse_sql_action(response: str) -> str:
    """The text of the first complete <action>...</action>, stripped ("" when there is none).

    Unlike the ALFWorld parser, a missing closing tag gives "" (Trinity's regex): a cut-off SQL
    statement is not sent.
    """
    match = _ACTION.search(response)
    return "" if match is None else match.group(1).strip()


def record_db(record: dict[str, Any]) -> str:
    """The database of an InterCode record: its `db`, else `extra.db`, else ""."""
    extra = record.get("extra")
    return str(record.get("db") or (extra.get("db") if isinstance(extra, dict) else "") or "")


def preprocess_sql(record: dict[str, Any]) -> list[str]:
    """The statements SqlEnv runs before a question: select its database."""
    return [f"use {record_db(record)}"]


def format_sql_observation(observation: Any, query: str, db: str) -> str:
    """The user turn: the question and database repeated with every observation (as Trinity)."""
    return f"Question: {query}\nDatabase: {db}\nObservation: {observation}"


def create_sql_env(image_name: str, data_path: str, verbose: bool) -> Any:
    """InterCode's SqlEnv over the docker image (needs the intercode package and Docker)."""
    from intercode.envs import SqlEnv

    return SqlEnv(image_name, data_path=data_path, preprocess=preprocess_sql, verbose=verbose)


@dataclass
class SqlSession:
    """The environment's side of one run: the reward and info of the last step it took."""

    env: Any
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    def act(self, reply: str) -> tuple[str, float, bool]:
        """One turn: the reply's action to the env, or the invalid-action observation without a step."""
        action = parse_sql_action(reply)
        if not action:
            self.info = {"action_executed": False}
            return INVALID_ACTION, 0.0, False
        return self.step(action)

    def step(self, action: str) -> tuple[str, float, bool]:
        observation, reward, done, info = self.env.step(action)
        self.reward, self.done, self.info = float(reward), bool(done), dict(info or {})
        return str(observation), self.reward, self.done


class InterCodeSQLWorkflow(EnvWorkflow):
    """`intercode_sql_workflow`: one SQL question per run, one experience holding the whole chat."""

    can_reset = True
    requires = (("intercode", "pip install intercode-bench, and build its SQL docker image"),)

    @classmethod
    def missing_data(cls, workflow_args: dict[str, Any]) -> list[str]:
        problems = []
        if shutil.which("docker") is None:
            image = workflow_args.get("image_name", DEFAULT_IMAGE)
            problems.append(
                f"{cls.__name__} needs Docker (InterCode runs each SQL statement in a MySQL container, "
                f"image {image!r}), and no `docker` command is on PATH (install Docker, start its "
                "daemon and build the image with InterCode's setup)"
            )
        data_path = workflow_args.get("data_path")
        if data_path is None:
            problems.append(
                f"{cls.__name__} needs workflow_args.data_path (InterCode's question file, e.g. "
                "ic_spider_dev.json), or a data_path column in every task row"
            )
        elif not os.path.exists(os.path.expanduser(str(data_path))):
            problems.append(
                f"{cls.__name__} needs InterCode's question file, and {data_path} does not exist "
                "(workflow_args.data_path; Trinity's examples/grpo_intercode_sql prepares it)"
            )
        return problems

    @classmethod
    def make_env(cls, image_name: str, data_path: str, verbose: bool) -> Any:
        """The environment for one run (tests override this with a stand-in)."""
        return create_sql_env(image_name, data_path, verbose)

    def reset(self, task: Task) -> None:
        self.task = task
        args = task.workflow_args
        raw = task.raw_task or {}
        self.query_idx = int(task.task_desc or raw.get("query_idx", 0))
        self.max_env_steps = int(args.get("max_env_steps", 10))
        self.image_name = str(args.get("image_name", DEFAULT_IMAGE))
        self.verbose = bool(args.get("verbose", False))
        self.auto_submit = bool(args.get("auto_submit", True))
        data_path = raw.get("data_path") or args.get("data_path")
        if data_path is None:
            raise InvalidArgument(
                "intercode_sql_workflow needs workflow_args.data_path or a data_path column in the task row",
                field="workflow_args.data_path",
            )
        self.data_path = os.path.expanduser(str(data_path))

    def run(self) -> list[Experience]:
        env = self.make_env(self.image_name, self.data_path, self.verbose)
        try:
            observation, info = env.reset(self.query_idx)
            raw = self.task.raw_task or {}
            query = str(getattr(env, "query", raw.get("query", "")))
            db = str(raw.get("db") or record_db(getattr(env, "record", {}) or {}))
            session = SqlSession(env, info=dict(info or {}))
            trajectory, episode = play_game(
                self.model,
                INTERCODE_SQL_SYSTEM_PROMPT,
                str(observation),
                session.act,
                Rules(
                    lambda obs: format_sql_observation(obs, query, db),
                    self.max_env_steps,
                    sampling_args(self.task),
                ),
            )
            finished = session.done
            if not finished and self.auto_submit:
                session.step("submit")
        finally:
            env.close()  # SqlEnv holds a docker container
        return trajectory.experiences(
            session.reward,
            {
                "query_idx": self.query_idx,
                # Trinity's `step`: the index of the round that finished, else max_env_steps
                "env_rounds": episode.rounds if finished else self.max_env_steps,
                "env_done": int(session.done),
                "action_executed": int(bool(session.info.get("action_executed"))),
                "final_reward": session.reward,
            },
        )

"""Workflows: the registry, Task / Workflow, and the built-ins (listed here, imported on first use)."""

from services.common.registry import Registry
from services.explorer.workflows.base import ResettableWorkflow, RolloutArgs, Task, Workflow
from services.explorer.workflows.base import WorkflowExperience as Experience

WORKFLOWS = Registry(
    "workflow",
    {
        "simple_workflow": "services.explorer.workflows.math:SimpleWorkflow",
        "async_simple_workflow": "services.explorer.workflows.math:AsyncSimpleWorkflow",
        "math_workflow": "services.explorer.workflows.math:MathWorkflow",
        "async_math_workflow": "services.explorer.workflows.math:AsyncMathWorkflow",
        "math_boxed_workflow": "services.explorer.workflows.math_boxed:MathBoxedWorkflow",
        "async_math_boxed_workflow": "services.explorer.workflows.math_boxed:AsyncMathBoxedWorkflow",
        "countdown_workflow": "services.explorer.workflows.math:CountdownWorkflow",
        "arith_workflow": "services.explorer.workflows.math:ArithWorkflow",
        "step_wise_env_workflow": "services.explorer.workflows.multi_turn:StepWiseEnvWorkflow",
        "multi_turn_workflow": "services.explorer.workflows.multi_turn:StepWiseEnvWorkflow",
        "step_wise_chat_env_workflow": "services.explorer.workflows.step_wise:ChatEnvWorkflow",
        # math evaluation, reward models and LLM judges (judges are explorer.auxiliary_models)
        "math_eval_workflow": "services.explorer.workflows.math_eval:MathEvalWorkflow",
        "async_math_eval_workflow": "services.explorer.workflows.math_eval:AsyncMathEvalWorkflow",
        "math_rm_workflow": "services.explorer.workflows.judges:MathRMWorkflow",
        "async_math_rm_workflow": "services.explorer.workflows.judges:AsyncMathRMWorkflow",
        "math_ruler_workflow": "services.explorer.workflows.judges:MathRULERWorkflow",
        "async_math_ruler_workflow": "services.explorer.workflows.judges:AsyncMathRULERWorkflow",
        "math_trainable_ruler_workflow": "services.explorer.workflows.judges:MathTrainableRULERWorkflow",
        "rubric_judge_workflow": "services.explorer.workflows.rubric_judge:RubricJudgeWorkflow",
        "rubric_judge_openai_workflow": "services.explorer.workflows.rubric_judge:RubricJudgeWorkflowWithAPI",
        # games and tools played on this machine
        "frozen_lake_workflow": "services.explorer.workflows.frozen_lake:FrozenLakeWorkflow",
        "sudoku_workflow": "services.explorer.workflows.sudoku:SudokuWorkflow",
        "tool_call_workflow": "services.explorer.workflows.tool_call:ToolCallWorkflow",
        "toolcall_workflow": "services.explorer.workflows.tool_call:ToolCallWorkflow",
        # Trinity v0.6's research Connect-the-Dots environments (with a cod: section; docs/workflows.md)
        "cod_frozenlake_obscure_workflow": "services.explorer.workflows.cod.frozen_lake_obscure:CodFrozenLakeObscureWorkflow",
        "cod_grid_navigation_workflow": "services.explorer.workflows.cod.grid_navigation:CodGridNavigationWorkflow",
        "cod_optimalcontrol_workflow": "services.explorer.workflows.cod.optimal_control:CodOptimalControlWorkflow",
        "cod_pde_discovery_workflow": "services.explorer.workflows.cod.pde.workflow:CodPdeDiscoveryWorkflow",
        # named by Trinity's research configs, unpublished: preflight says why they cannot run
        "cod_random_alchemy_workflow": "services.explorer.workflows.cod.unpublished:CodRandomAlchemyWorkflow",
        "cod_terminal_workflow": "services.explorer.workflows.cod.unpublished:CodTerminalWorkflow",
        # environments that need their own package and data (preflight names what is missing)
        "alfworld_workflow": "services.explorer.workflows.alfworld:AlfworldWorkflow",
        "step_wise_alfworld_workflow": "services.explorer.workflows.alfworld:StepWiseAlfworldWorkflow",
        "RAFT_alfworld_workflow": "services.explorer.workflows.alfworld_raft:RAFTAlfworldWorkflow",
        "RAFT_reflect_alfworld_workflow": "services.explorer.workflows.alfworld_raft:RAFTReflectAlfworldWorkflow",
        "sciworld_workflow": "services.explorer.workflows.sciworld:SciWorldWorkflow",
        "webshop_workflow": "services.explorer.workflows.webshop:WebShopWorkflow",
        "email_search_workflow": "services.explorer.workflows.email_search:EmailSearchWorkflow",
        "intercode_sql_workflow": "services.explorer.workflows.intercode_sql:InterCodeSQLWorkflow",
        # AgentScope agents
        "agentscope_workflow_adapter": "services.explorer.workflows.agentscope:AgentScopeWorkflowAdapter",
        "agentscope_workflow_adapter_v1": "services.explorer.workflows.agentscope:AgentScopeWorkflowAdapterV1",
        "agentscope_react_workflow": "services.explorer.workflows.agentscope_react:AgentScopeReActWorkflow",
        "as_react_workflow": "services.explorer.workflows.agentscope_react:AgentScopeReActWorkflow",
        "agentscope_react_math_workflow": "services.explorer.workflows.agentscope_react:AgentScopeReactMathWorkflow",
        "agentscopev0_react_math_workflow": "services.explorer.workflows.agentscope_react:AgentScopeV0ReactMathWorkflow",
        "agentscope_v1_react_search_workflow": "services.explorer.workflows.agentscope_search:AgentScopeV1ReactSearchWorkflow",
        # multimodal and distillation
        "simple_mm_workflow": "services.explorer.workflows.simple_mm:SimpleMMWorkflow",
        "async_simple_mm_workflow": "services.explorer.workflows.simple_mm:AsyncSimpleMMWorkflow",
        "on_policy_distill_workflow": "services.explorer.workflows.distill:OnPolicyDistillWorkflow",
        "on_policy_distill_math_workflow": "services.explorer.workflows.distill:OnPolicyDistillMathWorkflow",
    },
    config_key="default_workflow_type",
    plugin_hint="a module in explorer.plugin_dirs that registers it",
    # Trinity names some workflows by the dotted path of its class only
    aliases={
        "trinity.common.workflows.connect_the_dots.pde_discovery.workflow.CoDPDEDiscoveryWorkflow": (
            "cod_pde_discovery_workflow"
        ),
    },
)

__all__ = ["WORKFLOWS", "Experience", "ResettableWorkflow", "RolloutArgs", "Task", "Workflow"]

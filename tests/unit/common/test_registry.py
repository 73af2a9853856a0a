"""services/common/registry.py: one registry for every pluggable part.

Every registry in services/ is found by reading the source (a `NAME = Registry(...)` at module
level), so a new one is checked without being listed here.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pathlib
import subprocess
import sys

import pytest

import services
from services.common.errors import InvalidArgument
from services.common.registry import Registry, check_args, import_object

SERVICES = pathlib.Path(services.__file__).parent


def registry_names() -> list[tuple[str, str]]:
    """(module, attribute) of every module-level `X = Registry(...)` under services/."""
    found = []
    for path in sorted(SERVICES.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            call = node.value if isinstance(node, ast.Assign) else None
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Registry":
                parts = path.relative_to(SERVICES.parent).with_suffix("").parts
                module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                found += [(module, target.id) for target in node.targets if isinstance(target, ast.Name)]
    return found


REGISTRIES = registry_names()


def test_every_registry_is_found():
    names = {attr for _, attr in REGISTRIES}
    assert {"WORKFLOWS", "REWARD_FUNCTIONS", "EXPERIENCE_OPERATORS", "ENVIRONMENTS"} <= names
    assert {"ADVANTAGE_FN", "POLICY_LOSS_FN", "KL_PENALTY_FN", "KL_LOSS_FN"} <= names
    assert {"ENTROPY_LOSS_FN", "SAMPLE_STRATEGY"} <= names


@pytest.mark.parametrize(("module", "attr"), REGISTRIES, ids=[a for _, a in REGISTRIES])
def test_builtins_name_the_module_that_defines_them(module, attr):
    """A built-in's dotted path names its defining module, never one that re-exports it."""
    registry = getattr(importlib.import_module(module), attr)
    assert isinstance(registry, Registry) and registry.config_key
    wrong = {}
    for name, path in registry.builtin_paths().items():
        obj = registry.get(name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            if obj.__module__ != path.partition(":")[0]:
                wrong[name] = f"{path} is defined in {obj.__module__}"
        assert callable(obj), name
    assert wrong == {}


def test_importing_a_registry_imports_no_builtin():
    code = (
        "import json, sys\n"
        "from services.explorer.workflows import WORKFLOWS\n"
        "from services.trainer.algorithms.parts import POLICY_LOSS_FN\n"
        "from services.algorithms.advantage import ADVANTAGE_FN\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert "services.explorer.workflows.alfworld" not in loaded
    assert "services.trainer.algorithms.policy_loss.ppo" not in loaded
    assert "services.algorithms.advantage.grpo" not in loaded


def make_registry(**kwargs: str) -> Registry:
    return Registry(
        "test part",
        {
            "ppo": "services.trainer.algorithms.policy_loss.ppo:ppo",
            "k1": "services.trainer.algorithms.kl:kl_k1",
        },
        config_key="algorithm.test_part",
        **kwargs,
    )


def test_unknown_names_name_the_key_and_the_allowed_values():
    with pytest.raises(InvalidArgument) as err:
        make_registry(plugin_hint="a module in explorer.plugin_dirs that registers it").get("pop")
    assert err.value.field == "algorithm.test_part"
    assert err.value.message == (
        "unknown test part 'pop'; allowed: k1, ppo, or a dotted path \"pkg.module:Name\", "
        "or a module in explorer.plugin_dirs that registers it"
    )
    with pytest.raises(InvalidArgument) as err:
        make_registry().get("pop", field="algorithm.stages[1].test_part")
    assert err.value.field == "algorithm.stages[1].test_part"


def test_dotted_paths_both_spellings_and_their_errors():
    from services.trainer.algorithms.kl import kl_k2

    registry = make_registry()
    assert registry.get("services.trainer.algorithms.kl:kl_k2") is kl_k2
    assert registry.get("services.trainer.algorithms.kl.kl_k2") is kl_k2
    with pytest.raises(InvalidArgument, match="cannot import test part 'nowhere.mod:fn'") as err:
        registry.get("nowhere.mod:fn")
    assert err.value.field == "algorithm.test_part"
    with pytest.raises(InvalidArgument, match="'services.algorithms.masked:LOSS_AGG_MODES' is not callable"):
        registry.get("services.algorithms.masked:LOSS_AGG_MODES")
    assert import_object("services.common.registry:Registry.get") is Registry.get


def test_register_module_decorates_refuses_a_second_object_and_shadows_a_builtin():
    registry = make_registry()

    @registry.register_module("mine")
    def mine() -> None:
        return None

    assert registry.get("mine") is mine and "mine" in registry
    assert registry.names() == ["k1", "mine", "ppo"] and registry.builtin_names() == ["k1", "ppo"]
    registry.register_module("mine", mine)  # the same object again is fine (a module imported twice)
    with pytest.raises(InvalidArgument, match="'mine' is already registered"):
        registry.register_module("mine", len)
    registry.register_module("mine", len, force=True)
    assert registry.get("mine") is len
    registry.register_module("ppo", len)
    assert registry.get("ppo") is len


def test_check_args_rejects_what_the_callable_does_not_take():
    def part(batch: object, *, alpha: float = 1.0, beta: int = 2) -> None:
        return None

    check_args(part, {"alpha": 0.5}, "algorithm.x_args", skip=1)
    with pytest.raises(InvalidArgument) as err:
        check_args(part, {"alpah": 0.5}, "algorithm.x_args", skip=1)
    assert err.value.field == "algorithm.x_args"
    assert err.value.message == "unknown argument(s) ['alpah']; allowed: ['alpha', 'beta']"
    check_args(lambda batch, **kw: None, {"anything": 1}, "algorithm.x_args", skip=1)


def test_an_alias_resolves_to_its_builtin_and_is_not_listed_as_a_name():
    from services.trainer.algorithms.policy_loss.ppo import ppo

    registry = make_registry(aliases={"trinity.algorithm.policy_loss_fn.PPOPolicyLossFn": "ppo"})
    assert registry.get("trinity.algorithm.policy_loss_fn.PPOPolicyLossFn") is ppo
    assert "trinity.algorithm.policy_loss_fn.PPOPolicyLossFn" in registry
    assert registry.names() == ["k1", "ppo"] and registry.aliases() == {
        "trinity.algorithm.policy_loss_fn.PPOPolicyLossFn": "ppo"
    }

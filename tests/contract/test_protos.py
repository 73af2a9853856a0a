"""The protos are the public API: lint-clean, versioned, and checked for breaking changes."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

from tests.conftest import BUF, REPO

BASELINE = REPO / "tests" / "contract" / "baseline" / "protos_v1.binpb"
PROTOS = REPO / "protos"


def buf(*args: str, cwd: pathlib.Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUF), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_buf_lint_is_clean() -> None:
    result = buf("lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_package_is_versioned_and_mirrors_its_folder() -> None:
    for proto in PROTOS.rglob("*.proto"):
        package = re.search(r"^package\s+([\w.]+);", proto.read_text(), re.M)
        assert package, f"{proto} declares no package"
        folder = ".".join(proto.parent.relative_to(PROTOS).parts)
        assert package.group(1) == folder, f"{proto}: package {package.group(1)} does not mirror {folder}"
        assert re.search(r"\.v\d+$", package.group(1)), f"{proto}: package is not versioned"


def test_no_breaking_change_against_committed_baseline() -> None:
    result = buf("breaking", "--against", str(BASELINE))
    assert result.returncode == 0, "breaking change against the baseline:\n" + result.stdout + result.stderr


def test_baseline_covers_every_message_field_and_rpc(tmp_path: pathlib.Path) -> None:
    # The breaking check only protects what the baseline holds: an added field or RPC is unprotected
    # until the baseline is refreshed, so an additive change must come with a refresh.
    from scripts.proto_baseline import REFRESH_COMMAND, build_image, declared_names

    current = tmp_path / "current.binpb"
    build_image(current, BUF)
    missing = sorted(declared_names(current) - declared_names(BASELINE))
    assert not missing, (
        f"protos/ declares {len(missing)} names the committed baseline lacks, so the breaking-change check "
        f"does not protect them; run `{REFRESH_COMMAND}` (it refuses when the change is breaking) and commit "
        f"{BASELINE.relative_to(REPO)}:\n  " + "\n  ".join(missing)
    )


def test_baseline_names_include_fields_rpcs_and_enum_values() -> None:
    from scripts.proto_baseline import declared_names

    names = declared_names(BASELINE)
    assert "field trinity_grpc.common.v1.Experience.prompt_length = 2" in names
    assert "rpc trinity_grpc.buffer.v1.BufferService.Write" in names
    assert any(name.startswith("enum value trinity_grpc.") for name in names)
    assert not any("google.protobuf" in name for name in names), "imports are not ours to version"


def test_baseline_refresh_refuses_a_breaking_change(tmp_path: pathlib.Path) -> None:
    # A baseline holding a field that protos/ lacks: refreshing it would hide a removal.
    from scripts.proto_baseline import refresh

    tree = _mutated_tree(
        tmp_path / "tree",
        lambda t: t.replace("  Array logprobs = 3;\n", "  Array logprobs = 3;\n  int64 gone = 99;\n", 1),
    )
    stale = tmp_path / "stale.binpb"
    assert buf("build", "-o", str(stale), cwd=tree).returncode == 0
    before = stale.read_bytes()
    assert refresh(stale, BUF) == 1
    assert stale.read_bytes() == before, "a refused refresh must leave the baseline alone"


def test_baseline_refresh_accepts_an_additive_change(tmp_path: pathlib.Path) -> None:
    from scripts.proto_baseline import build_image, declared_names, refresh

    tree = _mutated_tree(tmp_path / "tree", lambda t: t.replace("  Array logprobs = 3;\n", "", 1))
    older = tmp_path / "older.binpb"  # protos/ adds logprobs to it, which is additive
    assert buf("build", "-o", str(older), cwd=tree).returncode == 0
    assert refresh(older, BUF) == 0
    current = tmp_path / "current.binpb"
    build_image(current, BUF)
    assert declared_names(older) == declared_names(current)


def _mutated_tree(tmp_path: pathlib.Path, edit) -> pathlib.Path:  # type: ignore[no-untyped-def]
    shutil.copytree(PROTOS, tmp_path / "protos")
    shutil.copy(REPO / "buf.yaml", tmp_path / "buf.yaml")
    target = tmp_path / "protos" / "trinity_grpc" / "common" / "v1" / "common.proto"
    before = target.read_text()
    after = edit(before)
    assert after != before, "the mutation did not apply"
    target.write_text(after)
    return tmp_path


@pytest.mark.parametrize(
    ("mutation", "edit", "expected"),
    [
        (
            "renumber",
            lambda t: t.replace("int64 prompt_length = 2;", "int64 prompt_length = 42;"),
            "prompt_length",
        ),
        ("remove", lambda t: t.replace("  Array logprobs = 3;\n", ""), "logprobs"),
        (
            "retype",
            lambda t: t.replace("optional double reward = 5;", "optional float reward = 5;"),
            "reward",
        ),
    ],
)
def test_breaking_check_catches(tmp_path: pathlib.Path, mutation: str, edit, expected: str) -> None:  # type: ignore[no-untyped-def]
    tree = _mutated_tree(tmp_path, edit)
    result = buf("breaking", "--against", str(BASELINE), cwd=tree)
    assert result.returncode != 0, f"{mutation} of a field was not flagged"
    assert expected in result.stdout + result.stderr, result.stdout


def test_generated_stubs_are_fresh(tmp_path: pathlib.Path) -> None:
    from scripts.gen_protos import generate

    generate(tmp_path)
    fresh = {
        p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "trinity_grpc").rglob("*") if p.is_file()
    }
    committed_root = REPO / "gen"
    committed = {
        p.relative_to(committed_root): p.read_bytes()
        for p in (committed_root / "trinity_grpc").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sorted(fresh) == sorted(committed), "gen/ files differ from a fresh `make protos`"
    stale = [str(path) for path, data in fresh.items() if committed[path] != data]
    assert not stale, f"stale generated stubs (run `make protos`): {stale}"

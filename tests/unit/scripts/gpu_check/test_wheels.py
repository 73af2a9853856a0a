"""scripts/gpu_check/wheels.py: which distributions the GPU machine gets as carried wheels."""

from __future__ import annotations

import pathlib

from scripts.gpu_check.wheels import IMAGE_HAS, canonical, closure, install

REQUIRES = {
    "sqlalchemy": [
        "typing-extensions>=4.6.0",
        'greenlet>=1; extra == "asyncio"',
        'asyncpg; extra == "postgresql-asyncpg"',
    ],
    "structlog": ["typing-extensions; python_version < '3.11'"],
    "pydantic": ["annotated-types>=0.6.0", "pydantic-core==2.50.5", "typing-inspection>=0.4.4"],
    "transformers": ["huggingface-hub>=1.0", "regex"],
    "omegaconf": ["PyYAML>=5.1.0", 'pytest; extra == "dev"'],
    "greenlet": ['objgraph; extra == "test"'],
}


def test_canonical_names() -> None:
    assert canonical("PyYAML") == "pyyaml"
    assert canonical("typing_extensions") == "typing-extensions"
    assert canonical("zope.interface") == "zope-interface"


def test_closure_follows_asked_extras_and_markers_and_stops_at_the_image() -> None:
    roots = [
        "sqlalchemy[asyncio]>=2.0",
        "structlog>=24.1",
        "pydantic>=2.6",
        "transformers>=4.45",
        "omegaconf>=2.3",
    ]
    assert closure(roots, REQUIRES) == [
        "annotated-types",
        "greenlet",  # sqlalchemy's asyncio extra, asked for
        "omegaconf",
        "pydantic",
        "pydantic-core",
        "sqlalchemy",
        "structlog",
        "typing-extensions",  # sqlalchemy's; structlog's own marker (< 3.11) is false on 3.12
        "typing-inspection",
    ]  # transformers (and huggingface-hub, regex behind it) and PyYAML are the image's; no dev/test extras


def test_closure_evaluates_markers_for_the_target_python() -> None:
    assert closure(["structlog"], REQUIRES, python_version="3.10") == ["structlog", "typing-extensions"]
    assert closure(["structlog"], REQUIRES, python_version="3.12") == ["structlog"]
    assert closure(["sqlalchemy"], REQUIRES) == ["sqlalchemy", "typing-extensions"]  # no extra asked


def test_the_image_keeps_torch_and_the_stubs_runtime_is_carried() -> None:
    assert "torch" in IMAGE_HAS  # the device's CUDA build, never a carried one
    assert not {"grpcio", "protobuf"} & IMAGE_HAS  # the generated stubs need their versions


def test_the_project_closure_carries_what_the_device_image_lacks() -> None:
    from importlib import metadata

    import tomllib

    repo = pathlib.Path(__file__).resolve().parents[4]
    deps = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    requires = {canonical(d.metadata["Name"]): list(d.requires or []) for d in metadata.distributions()}
    names = closure(deps, requires)
    for needed in (
        "grpcio",
        "protobuf",
        "grpcio-health-checking",
        "sqlalchemy",
        "greenlet",
        "structlog",
        "omegaconf",
        "pydantic",
        "pydantic-core",
    ):
        assert needed in names, needed
    assert not set(names) & IMAGE_HAS


def test_install_without_wheels_where_the_project_does_not_import_says_how_to_make_them(
    tmp_path: pathlib.Path, capsys
) -> None:
    # `false` stands in for an interpreter that cannot import the project (a bare GPU image)
    assert install(tmp_path / "no-wheels", tmp_path / "site", python="false") == 1
    err = capsys.readouterr().err
    assert "does not import" in err and "make gpu-wheels" in err
    assert not (tmp_path / "site").exists()  # nothing installed

"""transfer/cuda_share.py and the GPU side of shared.py, as far as a machine without CUDA goes: the
records' loader admits torch only, a CUDA share is refused by the engines that copy from files, the
owner names whose memory holds the weights, stale records are removed. The IPC itself (the trainer's
CUDA parameters opened by the explorer) runs in `make test-gpu`'s colocate check."""

from __future__ import annotations

import json
import os
import pathlib
import pickle

import pytest
import torch
from torch import nn

from services.common.errors import FailedPrecondition
from services.synchronizer.transfer import cuda_share, shared


def test_the_records_loader_refuses_anything_but_torch(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps([(os.mkdir, (str(marker),))]))
    with pytest.raises(pickle.UnpicklingError, match="posix.mkdir is not part of torch"):
        cuda_share.open_tensors(str(tmp_path), "evil.pkl")
    assert not marker.exists()


def test_the_records_loader_calls_torch_rebuilders(tmp_path: pathlib.Path) -> None:
    # reduce_tensor's records name only torch globals (rebuild_cuda_tensor, torch.Size, dtypes,
    # UntypedStorage): two such callables stand in for the CUDA rebuild here
    records = [(torch.Size, ((2, 3),)), (torch.device, ("cpu",))]
    (tmp_path / "ok.pkl").write_bytes(pickle.dumps(records))
    assert cuda_share.open_tensors(str(tmp_path), "ok.pkl") == [torch.Size([2, 3]), torch.device("cpu")]


def write_gpu_manifest(directory: pathlib.Path, owner: str) -> None:
    entries = [{"name": "w", "shape": [2, 2], "dtype": "torch.float32", "device": "cuda:0"}]
    manifest = {"parameters": entries, "owner": owner, "cuda_ipc": f"cuda_ipc-{owner}.pkl"}
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_engines_that_copy_from_files_refuse_a_gpu_share_naming_the_key(tmp_path: pathlib.Path) -> None:
    write_gpu_manifest(tmp_path, "1-a")
    for read in (shared.host_manifest, shared.mapped_tensors):
        with pytest.raises(FailedPrecondition, match="shared on a GPU") as err:
            read(str(tmp_path))
        assert err.value.field == "explorer.rollout_model.engine_type"


def test_owner_is_set_for_gpu_memory_only(tmp_path: pathlib.Path) -> None:
    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    gpu.mkdir()
    shared.share_parameters(nn.Linear(2, 2), str(cpu), 0)
    assert shared.owner(str(cpu)) is None  # the files outlive a trainer: nothing to attach again
    write_gpu_manifest(gpu, "42-b")
    assert shared.owner(str(gpu)) == "42-b"
    with pytest.raises(FailedPrecondition, match="no shared weights"):
        shared.owner(str(tmp_path / "none"))


def test_a_policy_on_another_device_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(
        FailedPrecondition, match=r"one CPU or one CUDA device; this one is on \['meta'\]"
    ) as err:
        shared.share_parameters(nn.Linear(2, 2, device="meta"), str(tmp_path), 0)
    assert err.value.field == "mode"


def test_remove_stale_keeps_the_current_records_and_other_files(tmp_path: pathlib.Path) -> None:
    for name in ("cuda_ipc-1-a.pkl", "cuda_ipc-2-b.pkl", "manifest.json", "lock"):
        (tmp_path / name).write_text("x")
    cuda_share.remove_stale(str(tmp_path), "cuda_ipc-2-b.pkl")
    assert sorted(os.listdir(tmp_path)) == ["cuda_ipc-2-b.pkl", "lock", "manifest.json"]


def test_new_owners_differ_and_name_the_process() -> None:
    a, b = cuda_share.new_owner(), cuda_share.new_owner()
    assert a != b and a.split("-")[0] == str(os.getpid())


def test_without_cuda_settle_is_a_no_op_and_nothing_is_allocated() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.fail("this test expects a process that never used CUDA")
    cuda_share.settle()
    assert cuda_share.allocated_mib() is None

"""Weight push into vLLM: the explorer's path vs a bare reload of the same tensors, in both process modes.

ours: what an explorer does for `sync_method: checkpoint` once the trainer has published: the
synchronizer's checkpoint transfer (write_checkpoint: atomic directory + CRC-32 manifest; then
load_checkpoint: verify and read into fresh tensors) and VLLMEngine.update_weights (validation against
the model's checkpoint layout, then the worker's reload_weights; a safetensors blob to an engine-core
child in multiprocess mode). baseline: the worker's reload_weights of the same tensors and nothing else
(in-process: the tensors as they are; multiprocess: the same blob, which is the only way tensors reach
a child). Figures are pushes per second of the full model (higher is better); the last line's ratio
is the worse of the two modes, both are in config.modes. Run in .venv-vllm (`make bench-vllm`).

group (in config.modes.<mode>.group, with its own ratio to the same baseline): the in-memory path of
`sync_method: nccl` (a gloo group on CPU), no disk: a sender process (the trainer's side) broadcasts
the tensors with the synchronizer's WeightGroup (256 MiB buckets, its default), this process receives
them into fresh tensors and hands them to VLLMEngine.update_weights; timed from the receive's start.

shared (config.modes.<mode>.shared, shared_ratio): mode colocate's path, no disk and no socket: a
sender process (the trainer's side) moves the model's parameters into shared files
(transfer/shared.py) and changes them in place under the weights lock before each push; this process
takes the lock shared and calls VLLMEngine.load_shared, whose worker maps the files once and reloads
from them (in multiprocess mode too: only the directory crosses to the engine core). Timed from the
lock's acquisition to the end of the load.

    python benchmarks/vllm_weight_push.py [--model .cache/models/SmolLM2-135M-Instruct] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "gen")]

if TYPE_CHECKING:
    from services.synchronizer.transfer.broadcast import GroupSpec


def measure(model: str, mode: str, repeats: int) -> dict[str, float]:
    """One process mode, in this process (vLLM's mode switch is per process)."""
    import torch
    from safetensors.torch import load_file

    from services.explorer.engines.vllm_engine import VLLMEngine, VLLMSettings, _safetensors_blob
    from services.synchronizer.transfer.checkpoint import load_checkpoint, write_checkpoint

    engine = VLLMEngine(model, VLLMSettings(dtype="float32", max_model_len=512, process_mode=mode))
    group = group_push(engine, model, repeats)
    shared_rate = shared_push(engine, model, repeats)
    state = {k: v.clone() for k, v in load_file(str(pathlib.Path(model) / "model.safetensors")).items()}
    ours, bare = [], []
    with tempfile.TemporaryDirectory() as root:
        for step in range(1, repeats + 2):
            state = {k: v + 1e-4 * torch.randn_like(v) for k, v in state.items()}
            t0 = time.perf_counter()
            path, files = write_checkpoint(state, root, step)
            engine.update_weights(load_checkpoint(path, files).items())
            t1 = time.perf_counter()
            pairs = [
                (k, v.contiguous()) for k, v in state.items() if not (engine.tied and k == "lm_head.weight")
            ]
            payload = pairs if engine.in_process else _safetensors_blob(pairs)
            engine.llm.collective_rpc("trinity_update_weights", args=(payload,))
            t2 = time.perf_counter()
            if step > 1:  # the first push of each path warms caches and allocators
                ours.append(1 / (t1 - t0))
                bare.append(1 / (t2 - t1))
    engine.close()
    return {
        "ours": statistics.median(ours),
        "baseline": statistics.median(bare),
        "group": group,
        "shared": shared_rate,
    }


BUCKET_BYTES = 256 << 20  # the synchronizer's default (services/synchronizer/core.py)


def _spec(port: int, rank: int) -> GroupSpec:
    from services.synchronizer.transfer.broadcast import GroupSpec

    return GroupSpec("127.0.0.1", port, 2, rank, "bench", "gloo", 300.0)


def group_push(engine: object, model: str, repeats: int) -> float:
    """Pushes/s of broadcast (from a sender process) + update_weights; the first push is a warm-up."""
    from safetensors.torch import load_file

    from services.synchronizer.transfer.broadcast import WeightGroup, manifest_of, start_store

    manifest = manifest_of(load_file(str(pathlib.Path(model) / "model.safetensors")))
    store = start_store("127.0.0.1", 0, 2, 300.0)
    cmd = [sys.executable, __file__, "--send", str(store.port), "--model", model, "--repeats", str(repeats)]
    sender = subprocess.Popen(cmd)
    rates = []
    with WeightGroup(_spec(store.port, 1), store=store) as group:
        for step in range(repeats + 1):
            t0 = time.perf_counter()
            received = group.receive(manifest, BUCKET_BYTES)
            engine.update_weights(received.items())  # type: ignore[attr-defined]
            if step > 0:
                rates.append(1 / (time.perf_counter() - t0))
    if sender.wait(120) != 0:
        raise SystemExit(f"the sender exited with {sender.returncode}")
    return statistics.median(rates)


def send(port: int, model: str, repeats: int) -> None:
    """The trainer's side of group_push: the same tensors, changed in place per push, repeats + 1 times."""
    import torch
    from safetensors.torch import load_file

    from services.synchronizer.transfer.broadcast import WeightGroup, manifest_of

    state = load_file(str(pathlib.Path(model) / "model.safetensors"))
    manifest = manifest_of(state)
    with WeightGroup(_spec(port, 0)) as group, torch.no_grad():
        for _ in range(repeats + 1):
            # a cheap in-place change: a fresh randn per tensor takes longer than the push measured
            for tensor in state.values():
                tensor.add_(1e-6)
            group.send(state, manifest, BUCKET_BYTES)


def shared_push(engine: object, model: str, repeats: int) -> float:
    """Pushes/s of mode colocate's path (lock + VLLMEngine.load_shared); the first push is a warm-up."""
    from services.synchronizer.transfer import shared

    with tempfile.TemporaryDirectory(dir="/dev/shm" if pathlib.Path("/dev/shm").is_dir() else None) as root:
        cmd = [sys.executable, __file__, "--share", root, "--model", model, "--repeats", str(repeats)]
        sender = subprocess.Popen(cmd)
        rates = []
        for version in range(1, repeats + 2):
            while shared.read_version(root) != version:
                if sender.poll() is not None:
                    raise SystemExit(f"the sharing process exited with {sender.returncode}")
                time.sleep(0.001)
            t0 = time.perf_counter()
            lock = shared.WeightsLock(root)
            lock.acquire(False)
            engine.load_shared(root)  # type: ignore[attr-defined]
            lock.close()
            if version > 1:
                rates.append(1 / (time.perf_counter() - t0))
            (pathlib.Path(root) / "ACK").write_text(str(version))
        if sender.wait(120) != 0:
            raise SystemExit(f"the sharing process exited with {sender.returncode}")
    return statistics.median(rates)


def share(directory: str, model: str, repeats: int) -> None:
    """The trainer's side of shared_push: the model's parameters in shared files, changed in place
    under the exclusive lock before each version, which waits for the previous one's ACK."""
    import torch
    from transformers import AutoModelForCausalLM

    from services.synchronizer.transfer import shared

    module = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32)
    lock = shared.WeightsLock(directory)
    ack = pathlib.Path(directory) / "ACK"
    with lock.exclusive():
        shared.share_parameters(module, directory, 1)
    for version in range(2, repeats + 2):
        while not ack.exists() or ack.read_text() != str(version - 1):
            time.sleep(0.001)
        with lock.exclusive(), torch.no_grad():
            for param in module.parameters():
                param.add_(1e-6)
            shared.write_version(directory, version)
    while not ack.exists() or ack.read_text() != str(repeats + 1):
        time.sleep(0.001)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mode", choices=("in_process", "multiprocess"), help="measure one mode (internal)")
    parser.add_argument("--send", type=int, help="the group path's sender, on this store port (internal)")
    parser.add_argument("--share", help="the shared path's trainer side, in this directory (internal)")
    args = parser.parse_args()
    if args.send:
        send(args.send, args.model, args.repeats)
        return
    if args.share:
        share(args.share, args.model, args.repeats)
        return
    if args.mode:
        print(json.dumps(measure(args.model, args.mode, args.repeats)))
        return
    modes = {}
    for mode in ("in_process", "multiprocess"):
        done = subprocess.run(
            [sys.executable, __file__, "--mode", mode, "--model", args.model, "--repeats", str(args.repeats)],
            capture_output=True,
            text=True,
            check=True,
        )
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        figures["ratio"] = figures["ours"] / figures["baseline"]
        figures["group_ratio"] = figures["group"] / figures["baseline"]
        figures["shared_ratio"] = figures["shared"] / figures["baseline"]
        modes[mode] = {k: round(v, 3) for k, v in figures.items()}
    worst = min(modes, key=lambda m: modes[m]["ratio"])
    result = {
        "name": "vllm_weight_push",
        "unit": "pushes/s",
        "ours": modes[worst]["ours"],
        "baseline": modes[worst]["baseline"],
        "baseline_name": "the vLLM worker's reload_weights of the same tensors (no checkpoint, no validation)",
        "ratio": modes[worst]["ratio"],
        "target_ratio": 0.7,
        "config": {
            "model": args.model,
            "repeats": args.repeats,
            "modes": modes,
            "default_mode_on_cpu": "in_process",
        },
    }
    out = ROOT / "benchmarks" / "results" / "vllm_weight_push.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

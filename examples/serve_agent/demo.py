"""`make demo-agent`: a Node.js agent trains SmolLM2 through the serve-mode proxy, on the CPU.

1. the tasks of `make demo-llm` (services/tasks/chat_arith.py) into <root>/smollm2_data;
2. `trinity run -c examples/serve_agent/config.yaml`: buffer, synchronizer and the proxy (mode serve);
3. beside it, the trainer: `trinity serve trainer -c <run dir>/config.resolved.yaml --set mode=train`
   (the ports the run chose; it trains from the buffer the proxy fills and publishes a version per
   step, which the proxy loads between requests);
4. the agent (examples/serve_agent/agent.js): held-out accuracy through the proxy, then AGENT_STEPS
   training steps of two-turn episodes with its own rewards, evaluating every AGENT_EVAL_EVERY steps;
5. once the trainer has trained its last step and the proxy serves it, a last evaluation; then
   everything stops and <run dir>/summary.json (the learning curve against training minutes) and
   plot.png (`trinity plot`) are written.

Usage: python examples/serve_agent/demo.py   (env: AGENT_STEPS, AGENT_EVAL_EVERY, AGENT_HELDOUT,
AGENT_MAX_TOKENS, AGENT_MAX_LAG (1: a step starts once the weights trained on all but the last
step's episodes are served; -1: never wait), SMOLLM2_SEED, SMOLLM2_DIR, TRINITY_ENGINE, TRINITY_CHECKPOINT_ROOT_DIR, AGENT_PROXY_PORT)
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "serve_agent" / "config.yaml"
AGENT = REPO / "examples" / "serve_agent" / "agent.js"
BIN = pathlib.Path(sys.executable).parent


def say(text: str) -> None:
    print(f"[demo-agent] {text}", flush=True)


def wait_for(path: pathlib.Path, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(
                f"the proxy did not start (trinity run exited {proc.poll()}); see its output above"
            )
        time.sleep(0.5)
    return path.read_text().strip()


def served_version(url: str) -> int:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
        return int(json.loads(response.read())["data"][0]["model_version"])


def agent(url: str, data: pathlib.Path, out: pathlib.Path, steps: int, seed: str, *extra: str) -> None:
    args = [
        "node",
        str(AGENT),
        "--url",
        url,
        "--data",
        str(data),
        "--steps",
        str(steps),
        "--seed",
        seed,
        *extra,
    ]
    args += ["--heldout", os.environ.get("AGENT_HELDOUT", "64"), "--out", str(out)]
    args += ["--eval-every", os.environ.get("AGENT_EVAL_EVERY", "5"), "--batch", "4", "--group", "8"]
    args += ["--max-tokens", os.environ.get("AGENT_MAX_TOKENS", "64")]
    args += ["--max-lag", os.environ.get("AGENT_MAX_LAG", "1")]
    env = {**os.environ, "NODE_PATH": str(REPO / "tools" / "node" / "node_modules")}
    subprocess.run(args, env=env, check=True)


def main() -> int:
    from services.cli.curve import learning_curve
    from services.cli.stages import main_first, save_summary
    from services.common.config import load_config
    from services.tasks.chat_arith import write_tasksets

    cfg = load_config(str(CONFIG))
    run_dir = pathlib.Path(cfg.run_dir)
    data = pathlib.Path(cfg.checkpoint_root_dir) / "smollm2_data"
    write_tasksets(data)
    steps, seed = int(cfg.buffer.total_steps or 30), os.environ.get("SMOLLM2_SEED", "0")
    url_file = run_dir / "serve" / "proxy_url"
    url_file.unlink(missing_ok=True)
    serve = subprocess.Popen([str(BIN / "trinity"), "run", "-c", str(CONFIG)], start_new_session=True)
    trainer = None
    started = time.time()
    try:
        url = wait_for(url_file, serve, 600)
        say(f"proxy at {url}; starting the trainer (mode train) beside it")
        resolved = run_dir / "config.resolved.yaml"  # the ports `trinity run` chose
        log = run_dir / "logs" / "trainer.log"
        say(f"trainer log: {log}")
        # half the cores, as `trinity run` gives each of two workers: the proxy's engine has the rest
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 2) // 2))
        with open(log, "ab") as fh:
            trainer = subprocess.Popen(
                [str(BIN / "trinity"), "serve", "trainer", "-c", str(resolved), "--set", "mode=train"],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env={**os.environ, "OMP_NUM_THREADS": threads},
                start_new_session=True,
            )
        out = run_dir / "eval" / "results.jsonl"
        agent(url, data, out, steps, seed)
        say("the agent is done; waiting for the trainer's last step")
        if trainer.wait() != 0:
            raise SystemExit(f"the trainer exited with code {trainer.returncode}")
        while served_version(url) < steps:
            time.sleep(1)
        say(f"the proxy serves version {steps}: final evaluation")
        agent(url, data, out, 0, seed, "--eval-step", str(steps))
    finally:
        for proc in (trainer, serve):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT if proc is serve else signal.SIGTERM)
                proc.wait(60)
    curve = learning_curve(cfg)
    summary = {
        "stages": [
            {
                "name": f"{cfg.name}:serve+train",
                "status": "complete",
                "steps": steps,
                "eval": {
                    "start": main_first(curve[0]["scores"]),
                    "end": main_first(curve[-1]["scores"]),
                    "curve": curve,
                },
                "wall_s": round(time.time() - started, 1),
            }
        ]
    }
    save_summary(str(run_dir), summary)
    first, last = curve[0], curve[-1]
    key = "eval/heldout/strict/mean@1"
    say(
        f"held-out strict accuracy {first['scores'][key]:.3f} -> {last['scores'][key]:.3f} "
        f"in {last.get('train_minutes', 0):.1f} training minutes (version {last['model_version']})"
    )
    subprocess.run([str(BIN / "trinity"), "plot", str(run_dir)], check=False)
    say(f"summary: {run_dir / 'summary.json'}  plot: {run_dir / 'plot.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

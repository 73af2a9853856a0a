"""GRPO on SmolLM2-135M-Instruct (`make demo-llm`'s job): our services with vLLM rollouts vs a
hand-written single-process loop and vs TRL's GRPOTrainer, wall time per step.

    .venv-vllm/bin/python benchmarks/smollm2_grpo.py [--steps 6] [--quick] [--baselines loop,trl]
    (make bench-vllm runs it)

Both sides run the job of examples/smollm2_grpo/config.yaml from the same converted model: 8 chat
arithmetic questions × 8 samples per step at temperature 0.7 and at most 64 new tokens, the shaped
boxed reward, GRPO advantages (flat groups exactly 0 and left out of the update), one token-mean
update per batch in micro-batches of 16 sorted by length, AdamW lr 1e-5 (betas 0.9/0.99, weight
decay 0.01), grad clip 1.0, no KL, the weights used for sampling updated every step.
- ours: `trinity run` of that config (engine vllm, checkpoint sync every step), evals removed, the
  training file read in order (the example shuffles it) so that every side gets the same questions;
- loop: one process, transformers' `generate` for sampling (what real-model.md's measured loop
  did), the same model object updated in place, so its "sync" costs nothing;
- trl: TRL's GRPOTrainer (issue 21's SmolLM2 figure) with its default generation (transformers
  `generate`), the same rendered prompts in the same order, 8 completions per prompt, the same
  reward, lr, betas, weight decay, clip, token-mean ("dapo") loss without KL, micro-batches of 16
  accumulated into one optimizer step per 64 completions; it trains every row (flat groups too).
Each baseline is its own figure and JSON line (smollm2_grpo, smollm2_grpo_trl).
Figure: steady-state seconds per step, (t_last − t_first) / (N − 1) over the step finish times (the
trainer's progress.jsonl; the loop's own clock), so start-up is left out. Each process may use every
core (the sides run one after the other). Replies shorten as the model learns, so both sides
start from the same weights and run the same number of steps; the mean reward of each is reported
beside the time. Last lines: one JSON object of benchmarks/README per baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.lib.e2e_figures import steady_step_time  # noqa: E402
from services.tasks.chat_arith import render_prompt, split_rows  # noqa: E402

CONFIG = ROOT / "examples" / "smollm2_grpo" / "config.yaml"
QUESTIONS, SAMPLES, MAX_TOKENS, MICRO = 8, 8, 64, 16
LOOP_NAME = "a hand-written one-process GRPO loop (transformers generate + torch update)"
TRL_NAME = "TRL GRPOTrainer, default generation (transformers generate), same prompts, group, lengths, lr"
TRL_MISSING = (
    "benchmarks/smollm2_grpo.py's trl baseline needs TRL (benchmark-only). Run `make bench-vllm`, which "
    "installs it, or pass --baselines loop"
)


def say(message: str) -> None:
    print(f"[smollm2_grpo] {message}", file=sys.stderr, flush=True)


def hand_loop(model_dir: str, steps: int) -> dict[str, Any]:
    """The baseline: sample with generate, score, GRPO advantages, one update; returns times and rewards."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.explorer.rewards.shaped import boxed_shaped_reward

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.99), weight_decay=0.01)
    train, _ = split_rows()
    times, rewards, sample_s, update_s, trained = [], [], [], [], []
    for step in range(steps):
        rows = train[step * QUESTIONS : (step + 1) * QUESTIONS]
        prompts = tok([render_prompt(tok, r) for r in rows], return_tensors="pt", padding=True)
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            out = model.generate(
                **prompts,
                do_sample=True,
                temperature=0.7,
                top_p=1.0,
                top_k=0,
                max_new_tokens=MAX_TOKENS,
                num_return_sequences=SAMPLES,
                pad_token_id=tok.pad_token_id,
            )
        width = prompts["input_ids"].shape[1]
        texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
        scores = torch.tensor(
            [boxed_shaped_reward(t, rows[i // SAMPLES]["answer"])["reward"] for i, t in enumerate(texts)]
        )
        groups = scores.view(QUESTIONS, SAMPLES)
        flat = groups.max(dim=1).values == groups.min(dim=1).values
        adv = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)).masked_fill(
            flat.unsqueeze(1), 0.0
        )
        rewards.append(float(scores.mean()))
        prompt_mask = prompts["attention_mask"].repeat_interleave(SAMPLES, dim=0)
        t1 = time.perf_counter()
        _update(model, opt, tok, out, prompt_mask, adv.flatten())
        times.append(time.time())
        sample_s.append(t1 - t0)
        update_s.append(time.perf_counter() - t1)
        trained.append(int((adv != 0).sum()))
        say(f"hand loop step {step + 1}/{steps}: reward {rewards[-1]:.3f}, rows trained {trained[-1]}")
    split = {"sample_s": sample_s, "update_s": update_s, "rows_trained": trained}
    return {"times": times, "rewards": rewards, "split": split}


def _update(model: Any, opt: Any, tok: Any, out: Any, prompt_mask: Any, adv: Any) -> None:
    """One token-mean policy-gradient update over the rows with a nonzero advantage (ratio 1 on-policy)."""
    import torch

    model.train()
    opt.zero_grad(set_to_none=True)
    width = prompt_mask.shape[1]
    response = out[:, width:]
    eos = (response == tok.eos_token_id).long()
    mask = torch.where(eos.cumsum(1) - eos > 0, 0, 1)  # tokens up to and including the first EOS
    attention = torch.cat([prompt_mask, mask], dim=1)
    active = (adv != 0).nonzero().flatten()
    if len(active) == 0:  # every group flat: nothing to learn from, no optimizer step
        return
    order = active[torch.argsort(mask[active].sum(1))]
    for chunk in torch.split(order, MICRO):
        t = int(mask[chunk].sum(1).max())
        logits = model(
            input_ids=out[chunk, : width + t],
            attention_mask=attention[chunk, : width + t],
            logits_to_keep=t + 1,
        ).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, response[chunk, :t].unsqueeze(-1)).squeeze(-1)
        m = mask[chunk, :t].float()
        ratio = torch.exp(logp - logp.detach())
        loss = -(adv[chunk].unsqueeze(1) * ratio * m).sum() / m.sum() * (len(chunk) / len(adv))
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def ours(model_dir: str, steps: int, work: pathlib.Path) -> dict[str, Any]:
    """`trinity run` of the example config without its evals; times and rewards from progress.jsonl."""
    import yaml

    from services.tasks.chat_arith import write_tasksets

    write_tasksets(work / "smollm2_data")
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["buffer"]["explorer_input"].pop("eval_tasksets")
    cfg["explorer"]["eval_on_startup"] = False
    # The training file in order, as the baselines read it: the same questions on every side (the
    # example shuffles; with other questions the sides' rewards, flat groups and update work differ).
    cfg["buffer"]["explorer_input"]["taskset"]["task_selector"] = {"selector_type": "sequential"}
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {
        **os.environ,
        "SMOLLM2_STEPS": str(steps),
        "SMOLLM2_DIR": model_dir,
        "TRINITY_ENGINE": "vllm",
        "TRINITY_CHECKPOINT_ROOT_DIR": str(work),
    }
    trinity = pathlib.Path(sys.executable).parent / "trinity"
    subprocess.run([str(trinity), "run", "-c", str(config)], cwd=work, env=env, check=True, stdout=sys.stderr)
    progress = work / "trinity-grpc-examples" / "smollm2-arith-grpo-seed0" / "trainer" / "progress.jsonl"
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    metrics = [r["metrics"] for r in records]
    split = {
        "update_s": [float(m.get("time/update", 0.0)) for m in metrics],
        "rows_trained": [int(m["batch/rows"] - m.get("batch/skipped_rows", 0.0)) for m in metrics],
    }
    return {
        "times": [float(r["time"]) for r in records],
        "rewards": [float(r["metrics"]["critic/rewards/mean"]) for r in records],
        "split": split,
    }


def figure(
    name: str, mine: dict[str, Any], base: dict[str, Any], args: argparse.Namespace, **kw: Any
) -> dict[str, Any]:
    ours_s, base_s = steady_step_time(mine["times"]), steady_step_time(base["times"])
    return {
        "name": name,
        "unit": "s/step",
        "ours": round(ours_s, 2),
        "baseline": round(base_s, 2),
        "baseline_name": kw["baseline_name"],
        "ratio": round(ours_s / base_s, 3),
        "target_ratio": kw["target"],
        "lower_is_better": True,
        "config": {
            "model": args.model,
            "steps": args.steps,
            "threads": os.environ["OMP_NUM_THREADS"],
            "reward_mean": {"ours": mine["rewards"], "baseline": base["rewards"]},
            # where each side's step goes, per step (a side that trains fewer rows updates faster)
            "split": {"ours": mine.get("split"), "baseline": base.get("split")},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="3 steps a side")
    parser.add_argument(
        "--baselines",
        default="loop,trl",
        help="comma-separated: loop (the hand-written loop), trl (TRL's GRPOTrainer); default both",
    )
    args = parser.parse_args()
    if args.quick:
        args.steps = 3
    baselines = [b for b in args.baselines.split(",") if b]
    unknown = sorted(set(baselines) - {"loop", "trl"})
    if unknown:
        parser.error(f"--baselines: unknown {unknown} (known: loop, trl)")
    if "trl" in baselines:
        try:
            import trl  # noqa: F401
        except ImportError:
            sys.exit(TRL_MISSING)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 2))
    with tempfile.TemporaryDirectory(prefix="smollm2-bench-") as tmp:
        say(f"ours: trinity run, {args.steps} steps")
        mine = ours(args.model, args.steps, pathlib.Path(tmp))
    results = []
    if "loop" in baselines:
        say(f"baseline: hand-written loop, {args.steps} steps")
        base = hand_loop(args.model, args.steps)
        results.append(figure("smollm2_grpo", mine, base, args, baseline_name=LOOP_NAME, target=1.0))
    if "trl" in baselines:
        from benchmarks.lib.smollm2_trl import run_trl

        say(f"baseline: TRL GRPOTrainer (transformers generate), {args.steps} steps")
        base = run_trl(
            args.model, args.steps, questions=QUESTIONS, samples=SAMPLES, max_tokens=MAX_TOKENS, micro=MICRO
        )
        results.append(figure("smollm2_grpo_trl", mine, base, args, baseline_name=TRL_NAME, target=0.7))
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(exist_ok=True)
    for result in results:
        (out_dir / f"{result['name']}.json").write_text(json.dumps(result, indent=2) + "\n")
    for result in results:
        print(json.dumps(result))


if __name__ == "__main__":
    main()

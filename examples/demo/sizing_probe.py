"""Probe: size a CPU demo where GRPO beats SFT, with a fair control (more SFT on the same labels).

Standalone (plain torch + transformers, the project's builtin model, tokenizer and arithmetic
generator); not used by the services. One run = one seed:

1. eval the base model (greedy, exact match, on `--eval-n` held-out problems of the RL distribution);
2. SFT on the *labelled* set for `--sft-steps` (loss on answer + EOS only);
3. GRPO from the SFT weights on *unlabelled* prompts of the RL distribution, reward = verifier only;
4. control: from the same SFT weights, more SFT on the labelled set for as much CPU time as GRPO took.

Budgets are in process CPU seconds (`time.process_time`, one torch thread by default), so that a
machine shared with other jobs changes the wall time but not the comparison.

Prints one JSON line per eval and a final JSON summary. Example:

    .venv/bin/python examples/demo/sizing_probe.py --seed 0 --sft-labels 1000 --grpo-steps 300
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from services.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from services.tasks.arith import ArithSpec, generate, iter_problems  # noqa: E402


def spec_from(args: argparse.Namespace, prefix: str) -> ArithSpec:
    get = lambda k: getattr(args, f"{prefix}_{k}")  # noqa: E731
    return ArithSpec(
        digits=args.digits,
        operands=get("operands"),
        min_carries=get("min_carries"),
        max_carries=get("max_carries"),
        max_value=get("max_value"),
        reverse_answer=args.reverse,
    )


class Data:
    """Tokenized problems; every prompt and answer of a spec has the same length (no padding)."""

    def __init__(self, tok, rows: list[dict[str, str]]):
        self.rows = rows
        self.prompts = torch.tensor([tok(r["question"])["input_ids"] for r in rows])
        self.answers = torch.tensor([tok(r["answer"])["input_ids"] + [tok.eos_token_id] for r in rows])


def evaluate(model, data: Data, eos: int, batch: int = 1000) -> float:
    """Greedy exact-match accuracy: the answer tokens then EOS."""
    model.eval()
    width = data.answers.shape[1]
    cfg = GenerationConfig(do_sample=False, max_new_tokens=width, eos_token_id=eos, pad_token_id=0)
    right = 0
    with torch.no_grad():
        for i in range(0, len(data.rows), batch):
            p, a = data.prompts[i : i + batch], data.answers[i : i + batch]
            out = model.generate(p, attention_mask=torch.ones_like(p), generation_config=cfg)[:, p.shape[1] :]
            if out.shape[1] < width:
                out = F.pad(out, (0, width - out.shape[1]), value=0)
            right += (out == a).all(dim=1).sum().item()
    return right / len(data.rows)


def sft_step(model, opt, sched, data: Data, batch: int, rng: torch.Generator) -> float:
    model.train()
    idx = torch.randint(len(data.rows), (batch,), generator=rng)
    p, a = data.prompts[idx], data.answers[idx]
    ids = torch.cat([p, a], dim=1)
    logits = model(ids).logits[:, p.shape[1] - 1 : -1]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), a.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if sched is not None:
        sched.step()
    return loss.item()


def make_opt(model, lr: float, warmup: int, total: int = 0, min_ratio: float = 1.0, wd: float = 0.01):
    """AdamW with linear warm-up, then cosine decay to `min_ratio`*lr at `total` (constant if total=0)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / (total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def token_logprobs(model, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    logits = model(ids).logits[:, prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, prompt_len:, None]).squeeze(-1)


def grpo_step(model, opt, tok, stream, args, reward_fn) -> dict[str, float]:
    """One GRPO step: sample P prompts x K, reward, group-normalise, one clipped-PG update."""
    rows = [next(stream) for _ in range(args.grpo_prompts)]
    prompts = torch.tensor([tok(r["question"])["input_ids"] for r in rows])
    plen = prompts.shape[1]
    width = len(rows[0]["answer"]) + 1
    cfg = GenerationConfig(
        do_sample=True,
        temperature=args.temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=width,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model.eval()
    rep = prompts.repeat_interleave(args.grpo_samples, dim=0)
    with torch.no_grad():
        seqs = model.generate(rep, attention_mask=torch.ones_like(rep), generation_config=cfg)
    resp = seqs[:, plen:]
    if resp.shape[1] < width:
        resp = F.pad(resp, (0, width - resp.shape[1]), value=tok.pad_token_id)
        seqs = torch.cat([rep, resp], dim=1)
    # mask: tokens up to and including the first EOS
    is_eos = resp == tok.eos_token_id
    after = (is_eos.cumsum(1) - is_eos.long()) > 0
    mask = (~after).float()
    texts = tok.batch_decode(resp, skip_special_tokens=False)
    answers = [r["answer"] for r in rows for _ in range(args.grpo_samples)]
    rewards = torch.tensor([reward_fn(t, a) for t, a in zip(texts, answers, strict=True)])
    g = rewards.view(args.grpo_prompts, args.grpo_samples)
    adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)
    keep = (g.std(1) > 0).repeat_interleave(args.grpo_samples)
    if args.keep_flat_groups:  # zero-advantage tokens still count in the token mean
        keep = torch.ones_like(keep)
    stats = {"reward": rewards.mean().item(), "kept_groups": (g.std(1) > 0).float().mean().item()}
    if keep.sum() == 0:
        return stats
    seqs, mask, adv = seqs[keep], mask[keep], adv[keep]
    with torch.no_grad():
        old = token_logprobs(model, seqs, plen)  # equals the sampling policy (one update per batch)
    model.train()
    new = token_logprobs(model, seqs, plen)
    ratio = torch.exp(new - old)
    a = adv[:, None]
    pg = -torch.min(ratio * a, torch.clamp(ratio, 1 - args.clip, 1 + args.clip) * a)
    loss = (pg * mask).sum() / mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return stats


def log(event: dict) -> None:
    print(json.dumps(event), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--digits", type=int, default=3)
    ap.add_argument("--reverse", action="store_true")
    for prefix in ("sft", "rl"):
        ap.add_argument(f"--{prefix}-operands", type=int, default=2)
        ap.add_argument(f"--{prefix}-min-carries", type=int, default=0)
        ap.add_argument(f"--{prefix}-max-carries", type=int, default=None)
        ap.add_argument(f"--{prefix}-max-value", type=int, default=None)
    ap.add_argument("--sft-labels", type=int, default=1000, help="labelled examples SFT may use")
    ap.add_argument("--sft-steps", type=int, default=600)
    ap.add_argument("--sft-batch", type=int, default=128)
    ap.add_argument("--sft-lr", type=float, default=2e-3)
    ap.add_argument("--sft-warmup", type=int, default=30)
    ap.add_argument("--sft-min-lr-ratio", type=float, default=1.0, help="cosine floor; 1.0 = constant lr")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument(
        "--keep-flat-groups", action="store_true", help="train on equal-reward groups too (adv 0)"
    )
    ap.add_argument("--control-seconds", type=float, default=0.0, help="control CPU budget (0: GRPO's)")
    ap.add_argument("--grpo-steps", type=int, default=300)
    ap.add_argument("--grpo-prompts", type=int, default=32)
    ap.add_argument("--grpo-samples", type=int, default=8)
    ap.add_argument("--grpo-lr", type=float, default=2e-4)
    ap.add_argument("--grpo-warmup", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--reward", choices=["exact", "digit"], default="exact")
    ap.add_argument("--eval-n", type=int, default=1000)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--control-factor", type=float, default=1.0, help="control SFT seconds / GRPO seconds")
    ap.add_argument("--no-control", action="store_true")
    ap.add_argument("--save-sft", default=None, help="save the SFT weights and optimizer here")
    ap.add_argument(
        "--load-sft", default=None, help="skip SFT: load weights and optimizer saved by --save-sft"
    )
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from services.tasks.arith import answer_reward, digit_reward

    reward_fn = answer_reward if args.reward == "exact" else digit_reward

    tok = load_tokenizer(args.model)
    eos = tok.eos_token_id
    sft_spec, rl_spec = spec_from(args, "sft"), spec_from(args, "rl")
    labelled = generate(sft_spec, args.sft_labels, seed=1000 + args.seed)
    eval_rows = generate(
        rl_spec, args.eval_n, seed=2000 + args.seed, exclude={r["question"] for r in labelled}
    )
    eval_q = {r["question"] for r in eval_rows}
    sft_data, eval_data = Data(tok, labelled), Data(tok, eval_rows)
    sft_eval = Data(tok, labelled[: min(len(labelled), 1000)])
    stream = (r for r in iter_problems(rl_spec, seed=3000 + args.seed) if r["question"] not in eval_q)

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    model = load_causal_lm(args.model, seed=args.seed)
    result: dict = {"args": vars(args), "base": evaluate(model, eval_data, eos)}
    log({"phase": "base", "acc": result["base"]})

    rng = torch.Generator().manual_seed(args.seed)
    opt, sched = make_opt(
        model, args.sft_lr, args.sft_warmup, args.sft_steps, args.sft_min_lr_ratio, args.weight_decay
    )
    t0 = time.process_time()
    sft_steps = 0 if args.load_sft else args.sft_steps
    if args.load_sft:  # reuse a saved SFT stage (same seed and data flags) to try GRPO settings
        saved = torch.load(args.load_sft)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
    for step in range(1, sft_steps + 1):
        loss = sft_step(model, opt, sched, sft_data, args.sft_batch, rng)
        if step % args.eval_every == 0 or step == args.sft_steps:
            log(
                {
                    "phase": "sft",
                    "step": step,
                    "loss": round(loss, 4),
                    "acc": evaluate(model, eval_data, eos),
                    "train_acc": evaluate(model, sft_eval, eos),
                    "s": round(time.process_time() - t0, 1),
                }
            )
    result["sft_s"] = time.process_time() - t0
    result["sft_steps_per_s"] = sft_steps / result["sft_s"]
    result["sft"] = evaluate(model, eval_data, eos)
    sft_state = copy.deepcopy(model.state_dict())
    sft_opt_state = copy.deepcopy(opt.state_dict())
    if args.save_sft:
        torch.save({"model": sft_state, "opt": sft_opt_state}, args.save_sft)

    opt, sched = make_opt(model, args.grpo_lr, args.grpo_warmup, wd=args.weight_decay)
    t0 = time.process_time()
    best = result["sft"]
    for step in range(1, args.grpo_steps + 1):
        stats = grpo_step(model, opt, tok, stream, args, reward_fn)
        sched.step()
        if step % args.eval_every == 0 or step == args.grpo_steps:
            acc = evaluate(model, eval_data, eos)
            best = max(best, acc)
            log(
                {
                    "phase": "grpo",
                    "step": step,
                    **{k: round(v, 3) for k, v in stats.items()},
                    "acc": acc,
                    "s": round(time.process_time() - t0, 1),
                }
            )
    grpo_s = time.process_time() - t0
    result.update(
        grpo=evaluate(model, eval_data, eos), grpo_s=grpo_s, grpo_steps_per_s=args.grpo_steps / grpo_s
    )

    if not args.no_control:
        model.load_state_dict(sft_state)
        # Generous control: the peak SFT lr again (constant), and the best eval along the way counts.
        opt, _ = make_opt(model, args.sft_lr, 0, wd=args.weight_decay)
        opt.load_state_dict(sft_opt_state)
        for group in opt.param_groups:
            group["lr"] = args.sft_lr
        budget = args.control_seconds or grpo_s * args.control_factor
        t0, step, best_ctl = time.process_time(), 0, result["sft"]
        eval_s = 0.0
        while time.process_time() - t0 - eval_s < budget:
            sft_step(model, opt, None, sft_data, args.sft_batch, rng)
            step += 1
            if step % args.eval_every == 0:
                te = time.process_time()
                acc = evaluate(model, eval_data, eos)
                eval_s += time.process_time() - te
                best_ctl = max(best_ctl, acc)
                log({"phase": "control", "step": step, "acc": acc, "s": round(time.process_time() - t0, 1)})
        final = evaluate(model, eval_data, eos)
        result.update(control=final, control_best=max(best_ctl, final), control_steps=step)
    log(
        {
            "summary": {
                k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items() if k != "args"
            }
        }
    )


if __name__ == "__main__":
    main()

"""Stage bookkeeping for `trinity run`: chaining weights between stages, eval records, summary.json."""

from __future__ import annotations

import glob
import json
import os
from collections import Counter
from typing import Any

from services.cli.memory_watch import format_memory
from services.cli.phases import format_phases
from services.common.config import TrinityConfig
from services.trainer.tally import Tally, read_lines, tally_dir


def summary_path(root_run_dir: str) -> str:
    return os.path.join(root_run_dir, "summary.json")


def load_summary(root_run_dir: str) -> dict[str, Any]:
    try:
        with open(summary_path(root_run_dir)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {"stages": []}


def save_summary(root_run_dir: str, summary: dict[str, Any]) -> None:
    path = summary_path(root_run_dir)
    os.makedirs(root_run_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(summary, fh, indent=2)
    os.replace(tmp, path)


def run_label(cfg: TrinityConfig) -> str:
    """Summary name of a run without stages: its name, plus the mode unless it is `both`.

    A `train` run followed by `bench` (or `explore`) on the same run dir, as Trinity users do,
    gets one summary entry per mode instead of the second being skipped as already complete.
    """
    return cfg.name if cfg.mode == "both" else f"{cfg.name}:{cfg.mode}"


def stage_entry(summary: dict[str, Any], name: str) -> dict[str, Any]:
    for entry in summary["stages"]:
        if entry["name"] == name:
            return entry
    entry = {
        "name": name,
        "status": "pending",
        "eval": {},
        "steps": 0,
        "experiences": {"written": 0, "trained": 0, "buffered": 0},
        "wall_s": 0.0,
    }
    summary["stages"].append(entry)
    return entry


def finished(entry: dict[str, Any], stage: TrinityConfig) -> bool:
    """A stage recorded complete is skipped, unless the config now asks for more steps than it ran
    (buffer.total_steps raised): then it continues from its last checkpoint, as Trinity's
    continue_from_checkpoint does."""
    if entry["status"] != "complete":
        return False
    wanted = stage.buffer.total_steps
    return wanted is None or int(entry.get("steps") or 0) >= wanted


def final_model_dir(stage: TrinityConfig) -> str | None:
    """The model directory of a stage's latest full checkpoint (what the next stage starts from)."""
    from services.trainer.checkpoint import full_checkpoint_root, latest_checkpoint, model_dir

    found = latest_checkpoint(full_checkpoint_root(stage.run_dir))
    return str(model_dir(found[1])) if found else None


def chain_model(stage: TrinityConfig, previous: TrinityConfig | None, user_set_model: bool) -> TrinityConfig:
    """Start `stage` from the previous stage's final weights unless the stage sets `model.model_path`.

    A previous stage that trained nothing (bench, explore) passes on the weights it started from.
    """
    if previous is None or user_set_model:
        return stage
    path = final_model_dir(previous)
    if path is None:
        if previous.model.model_path == stage.model.model_path:
            return stage
        path = previous.model.model_path
        model = stage.model.model_copy(
            update={"model_path": path, "tokenizer_path": previous.model.tokenizer_path}
        )
        return stage.model_copy(update={"model": model})
    model = stage.model.model_copy(update={"model_path": path, "tokenizer_path": None})
    return stage.model_copy(update={"model": model})


def scores_carry_over(stage: TrinityConfig, previous: TrinityConfig | None) -> bool:
    """Is the previous stage's end-of-stage eval also `stage`'s start-of-stage eval?

    Only when `stage` starts from exactly the weights the previous stage ended with (chained by
    chain_model to its final checkpoint) and would score them the same way: the same eval tasksets,
    model settings (other than the path) and explorer settings. Saves one bench explorer per stage.
    """
    if previous is None or not stage.buffer.explorer_input.eval_tasksets:
        return False
    final = final_model_dir(previous)
    if final is None or stage.model.model_path != final:
        return False

    def scoring(cfg: TrinityConfig) -> tuple[Any, ...]:
        model = cfg.model.model_copy(update={"model_path": "", "tokenizer_path": None})
        return (cfg.buffer.explorer_input.eval_tasksets, model, cfg.explorer)

    return scoring(stage) == scoring(previous)


def _json_lines(path: str) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a line a killed writer left half-written is skipped."""
    records = []
    try:
        with open(path) as fh:
            for line in fh:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        return []
    return [r for r in records if isinstance(r, dict)]


def eval_records(stage: TrinityConfig) -> list[dict[str, Any]]:
    return _json_lines(os.path.join(stage.run_dir, "eval", "results.jsonl"))


def main_first(scores: dict[str, float]) -> dict[str, float]:
    """Scores with the main one first: an accuracy mean (`accuracy`, else the boxed-answer `strict`) of
    the first eval taskset, else the first key."""
    keys = list(scores)

    def rank(key: str) -> tuple[int, int]:
        mean = "mean@" in key
        main = 0 if mean and "/accuracy/" in key else 1 if mean and "/strict/" in key else 2
        return main, keys.index(key)

    ranked = sorted(keys, key=rank)
    return {k: scores[k] for k in ranked}


def progress_tally(stage: TrinityConfig) -> Tally:
    """Steps, rows trained / dropped / lost, and reward per step, from the trainer's progress.jsonl."""
    return tally_dir(os.path.join(stage.run_dir, "trainer"))


def explorer_drops(stage: TrinityConfig) -> dict[str, int]:
    """Experiences the explorers' pipelines dropped before writing (filters, dynamic sampling and its
    refill surplus), by reason, from each explorer's progress-<name>.jsonl. A step counts once,
    with its first record: a restarted explorer that redoes a recorded step finds its writes
    already made (the predecessor's rows stand, so do its drops)."""
    out: Counter[str] = Counter()
    for path in sorted(glob.glob(os.path.join(stage.run_dir, "explorer", "progress-*.jsonl"))):
        seen: set[int] = set()
        for record in read_lines(path):
            if record is None or "step" not in record or int(record["step"]) in seen:
                continue
            seen.add(int(record["step"]))
            out.update({str(k): int(v) for k, v in record.get("dropped", {}).items()})
    return dict(out)


def trained_rows(stage: TrinityConfig) -> tuple[int, int, list[float]]:
    """(steps, rows trained, reward mean per step) from the trainer's progress.jsonl."""
    got = progress_tally(stage)
    return got.steps, got.trained, got.rewards


def format_table(summary: dict[str, Any]) -> str:
    header = (
        f"{'stage':<14} {'steps':>6} {'eval start':>11} {'eval end':>9} {'written':>8} {'trained':>8} "
        f"{'buffered':>9} {'dropped':>8} {'wall s':>7}"
    )
    lines, notes = [header, "-" * len(header)], []
    for entry in summary["stages"]:
        start, end = entry["eval"].get("start", {}), entry["eval"].get("end", {})
        first = next(iter(end or start), "")
        s = f"{start[first]:.3f}" if first in start else "-"
        e = f"{end[first]:.3f}" if first in end else "-"
        ex = entry["experiences"]
        dropped = ex.get("dropped", {})
        lines.append(
            f"{entry['name']:<14} {entry['steps']:>6} {s:>11} {e:>9} {ex['written']:>8} {ex['trained']:>8} "
            f"{ex['buffered']:>9} {sum(dropped.values()):>8} {entry['wall_s']:>7.0f}"
        )
        if dropped:
            why = ", ".join(f"{reason} {n}" for reason, n in dropped.items())
            notes.append(f"{entry['name']}: dropped rows: {why}")
        notes += format_phases(entry["name"], entry.get("phases", {}))
        notes += format_memory(entry["name"], entry.get("memory"))
        if entry.get("updates_lost"):
            notes.append(
                f"{entry['name']}: {entry['updates_lost']} optimizer steps lost in a trainer crash "
                "(trainer.replay_lost_updates is off)"
            )
    lines += notes
    main = next((k for st in summary["stages"] for k in st["eval"].get("end", {})), "")
    if main:
        lines.append(f"(eval columns: {main})")
        lines.append(eval_chain(summary, main))
    return "\n".join(lines)


def eval_chain(summary: dict[str, Any], key: str) -> str:
    """`<key>: start 0.000 -> sft 0.080 -> grpo 0.781`: the score at the start and after each stage."""
    stages = summary["stages"]
    first = stages[0]["eval"].get("start", {}) if stages else {}
    parts = [f"start {first[key]:.3f}"] if key in first else []
    parts += [
        f"{st['name']} {st['eval']['end'][key]:.3f}" for st in stages if key in st["eval"].get("end", {})
    ]
    return f"{key}: {' -> '.join(parts)}"

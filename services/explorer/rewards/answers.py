r"""The one answer reader: where a reply states its final answer, and whether two answers agree.

Every reward fn, workflow, eval and task generator reads answers through this module, so a reply
gets one verdict everywhere. The rules are Trinity-RFT's (`last_boxed_only_string` / `remove_boxed`
for the box, its Qwen2.5-Math `extract_answer` for the fallbacks) except where a line says why not.

Finding the answer:
- `last_boxed(text)`: what the last `\boxed{...}` holds, braces balanced (`\boxed{\frac{1}{2}}` gives
  `\frac{1}{2}`); `\fbox{...}` only in a text without `\boxed`. The last box decides: one that never
  closes (a reply cut off inside it) means no boxed answer, not the box before it. An empty box
  (`\boxed{}`) is no box and is skipped, where Trinity compares the empty string: SmolLM2-135M copies
  the prompt's literal `\boxed{}`, and that copy must earn neither the right-box nor the wrong-box
  credit of `boxed_shaped_reward` (benchmarks/README.md, "SmolLM2 task and reward"). `\boxed 7`
  (no braces) gives the next word, `7`, where Trinity reads on to the next `$`; `\boxedx{3}` is
  another command.
- `last_number(text)`: the last number written: thousands commas (`1,234`), decimals (`.5`), a sign,
  a fraction `3/4` read whole; a digit inside a name (`x2`) is none.
- `stated_answer(text)`: the rest of the line after the first "the answer is" / "final answer is" /
  "答案是".
- `final_answer(text)`: the box, else the stated answer, else the last number (Trinity's order).
- `tagged_answer(text)`: what the last `<answer>…</answer>` holds.
- `latex_answer(text)`: the box, else the last `$…$` / `$$…$$` / `\(…\)` / `\[…\]` span.
- `answer_line(text)`: what follows the last `Answer:`, to the end of its line.
- `truth_answer(truth)`: a truth column's answer: its box, else what follows its last `####`
  (GSM8K), else a worked solution (several lines) read by `final_answer`, else the whole truth (so
  the truth `\frac{1}{2}` stays itself, where Trinity's reader would take the number 2).
- `plain_answer(text, stop)`: a bare reply (the tiny arithmetic model's): the text before `stop`,
  whitespace removed.

Comparing: `same_answer(predicted, truth)`, the rules of math_equiv.py: equal numbers exactly
(`0.5` = `\frac{1}{2}` = `1/2`, no tolerance, no percentage reading), equal expressions, equal text
once presentation is gone; a rational truth wants a number literal, so `63+2` does not state `65`.
"""

from __future__ import annotations

import re

from services.explorer.rewards.math_equiv import equivalent

_BOXED = re.compile(r"\\boxed(?![A-Za-z])")
_FBOX = re.compile(r"\\fbox(?![A-Za-z])")
_BARE_ARGUMENT = re.compile(r"[^\s${}]+")
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)(?:/\d+)?")
_STATED = (
    re.compile(r"(?:final|the)\s+answer\s+is\s*:?\s*(.+)", re.IGNORECASE),
    re.compile(r"答案是\s*:?\s*(.+)"),
)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_LINE = re.compile(r"Answer\s*:\s*(.+)")
_LATEX_SPANS = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)


def balanced_braces(text: str, open_at: int) -> str | None:
    """The text inside the braces opening at `open_at`, or None when they never close."""
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : j]
    return None


def _box_argument(text: str, end: int) -> str | None:
    """The argument of the box command ending at `end`: "" when empty, None when it never closes."""
    rest = text[end:].lstrip()
    if rest.startswith("{"):
        inner = balanced_braces(text, len(text) - len(rest))
        return None if inner is None else inner.strip()
    word = _BARE_ARGUMENT.match(rest)
    return word.group(0).rstrip(".,;") if word else ""


def last_boxed(text: str) -> str | None:
    r"""What the last \boxed{} (else \fbox{}) holds; None without one (see the module docstring)."""
    boxes = list(_BOXED.finditer(text)) or list(_FBOX.finditer(text))
    for box in reversed(boxes):
        argument = _box_argument(text, box.end())
        if argument is None:
            return None
        if argument:
            return argument
    return None


def last_number(text: str) -> str | None:
    """The last number written in `text`, as written (`so 63 + 2 equals 65.` → `65`), or None."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def stated_answer(text: str) -> str | None:
    """The rest of the line after the first "the answer is" (or "final answer is", "答案是"), or None."""
    for pattern in _STATED:
        said = pattern.search(text)
        if said:
            return said.group(1).strip().rstrip(".") or None
    return None


def final_answer(text: str) -> str | None:
    """The answer a reply states: its box, else its "the answer is …", else its last number."""
    return last_boxed(text) or stated_answer(text) or last_number(text)


def tagged_answer(text: str) -> str | None:
    """What the last `<answer>…</answer>` of `text` holds, or None."""
    found = _ANSWER_TAG.findall(text)
    return found[-1] if found else None


def latex_answer(text: str) -> str | None:
    r"""The box, else the last `$…$` / `\(…\)` / `\[…\]` span; None for plain text."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    spans = [next(g for g in m.groups() if g is not None) for m in _LATEX_SPANS.finditer(text)]
    return spans[-1].strip() if spans else None


def answer_line(text: str) -> str | None:
    """What follows the last `Answer:` of `text`, to the end of that line, or None."""
    lines = _ANSWER_LINE.findall(text)
    return lines[-1].strip() if lines else None


def truth_answer(truth: str | None) -> str | None:
    """The answer a truth column states (see the module docstring), or None."""
    if truth is None:
        return None
    boxed = last_boxed(truth)
    if boxed is not None:
        return boxed
    if "####" in truth:
        return truth.rsplit("####", 1)[1].strip() or None
    stripped = truth.strip()
    if "\n" in stripped:
        return final_answer(stripped)
    return stripped or None


def plain_answer(text: str, stop: str | None = None) -> str:
    """The text before the first `stop` (all of it when None), every whitespace character removed."""
    if stop:
        text = text.split(stop, 1)[0]
    return re.sub(r"\s+", "", text)


def same_answer(predicted: str | None, truth: str | None) -> bool:
    """True when `predicted` states `truth`: math_equiv.py's rules (see the module docstring)."""
    return equivalent(predicted, truth)

"""What the model reads in the PDE environment: the rules (system prompt) and each step's status.

The same information as Trinity's prompts/system.jinja2 and user.jinja2, in this project's words.
"""

from __future__ import annotations

from typing import Any

SYSTEM = """You are a scientist looking for an unknown reaction term f(u) in the equation

    u_t = u_xx + f(u)

## The setting

All tasks of this pack share one hidden f(u). Each task watches a different simulated solution, started
from a different initial condition. Data you sample stays available to the later tasks of the pack.

At a sampled point you observe u (the state) and y (a noisy measurement of the reaction, what f(u)
should predict).

## The library

f(u) is a sparse sum of coefficients times basis functions, f(u) = sum_k c_k phi_k(u), with the phi_k
taken from this library:

{terms}

The terms with non-zero coefficients form the equation's support. The hidden equation has {support}
terms; which ones, and their coefficients, you have to find out.

## Actions

The XML below shows the syntax only; pick your own values for the task at hand.

### sample_pde_data: measure the current task's solution at chosen points

<answer>
<sample_pde_data>
  <point_grid>
    <point x="0.3" t="0.2"/>
    <point x="0.6" t="0.7"/>
  </point_grid>
</sample_pde_data>
</answer>

point_grid is required: one point per (x, t) pair, with 0 < x < 1 and 0 <= t <= 1, and no more points
than the budget has left. The reply names the new dataset_id (for run_sparse_regression) and how the
points cover u, x and t.

### summarize_pack_evidence: see what earlier tasks of the pack concluded

<answer>
<summarize_pack_evidence>
  <reveal_equations>false</reveal_equations>
</summarize_pack_evidence>
</answer>

reveal_equations is optional (false by default); true also lists the equations earlier tasks recorded.
They are hypotheses of earlier attempts, not the truth.

### run_sparse_regression: fit and compare sparse equations on sampled data

Give either a dictionary (a non-empty subset of the library: every support of those terms, up to the
support size above, is fitted and compared) or candidate_equations (one to eight equations: only
their supports are compared, each refitted on the data).

<answer>
<run_sparse_regression>
  <dataset_id>merged_all</dataset_id>
  <threshold>0.05</threshold>
  <dictionary>
    <term>u</term>
    <term>u**3</term>
    <term>tanh(u)</term>
  </dictionary>
</run_sparse_regression>
</answer>

<answer>
<run_sparse_regression>
  <dataset_id>merged_all</dataset_id>
  <candidate_equations>
    <equation>0.9*u - 1.1*u**3</equation>
    <equation>1.3*tanh(u) - 0.6*u**2</equation>
  </candidate_equations>
</run_sparse_regression>
</answer>

- dataset_id (optional): merged_all, the default, joins every dataset of the pack; or a dataset_id
  that sample_pde_data returned.
- threshold (optional, 0.05): coefficients smaller in size are dropped while selecting a support;
  larger values give sparser equations, smaller ones keep weak terms.
- alpha (optional, 0.05): a ridge strength, accepted for compatibility.

The reply gives the best fitting equation, the closest equation with a different support and
diagnostics of the fit on the sampled data. It never compares anything with the hidden equation.

### update_scientific_context: commit this task's conclusion for the rest of the pack

<answer>
<update_scientific_context>
  <preferred_equation>0.9*u - 1.1*u**3</preferred_equation>
  <note>The cubic support fits the samples best.</note>
  <uncertain_terms>
    <term>tanh(u)</term>
  </uncertain_terms>
</update_scientific_context>
</answer>

preferred_equation is required and must be an equation the latest run_sparse_regression scored,
copied with its coefficients unchanged (no re-rounding). note (a short reason) and uncertain_terms
(up to four library terms you could not rule out) are optional and do not change the equation. It
is accepted only after this task has sampled data and run a regression, and it ends the task.

## Writing equations

Use numbers as coefficients, never placeholders such as c1, a or alpha. Each library entry is one
whole term: put a term that contains + or - in parentheses, 0.4*(exp(u)-1), not 0.4*exp(u)-1.

## Reading the feedback

A regression reply can list, for each point of its dataset, (x, t, u, y, pred, abs_error): pred is
the fitted equation's f(u) and abs_error = |y - pred|; the sampled-data max error is the largest
abs_error. Measurements are noisy. The kappa values are condition numbers: large means the terms are
nearly collinear on these samples and hard to tell apart. The condition penalty is how far (in
log10) the selected support's kappa exceeds the configured threshold, 0 when below it.

The closest different-support equation is the other support with the lowest max error; the relative
margin is (its error - the best error) / the best error. Near 0: these samples barely tell the two
apart; larger: a clearer separation. Every diagnostic uses the sampled data only.

## How to reply

However much you reason, end every reply with exactly one <answer>...</answer> block holding exactly
one of the actions above. Keep the reasoning before it short. Even when unsure or short of budget,
give your best action in the block rather than none. Write nothing after </answer> and never a second
<answer> block."""


def system_prompt(terms: list[str], support: str) -> str:
    return SYSTEM.format(terms=", ".join(terms), support=support)


def user_prompt(
    *,
    position: int,
    pack_size: int,
    step: int,
    max_steps: int,
    budget: int,
    point_budget: int,
    task: str | None,
    datasets: list[str],
    last_max_error: float | None,
    evidence: dict[str, Any],
    feedback: str | None,
) -> str:
    """The status shown before each step (step 1-based)."""
    lines = [
        f"Task {position}/{pack_size}, step {step}/{max_steps}",
        f"Point budget left: {budget}/{point_budget}",
    ]
    if task:
        lines.append(f"\nTask: {task}")
    lines.append(f"\nDatasets: {', '.join(datasets) if datasets else 'none'}")
    lines.append(
        "Latest sampled-data max error: " + ("none" if last_max_error is None else f"{last_max_error:.6g}")
    )
    if evidence:
        lines += [
            "\nEvidence committed by the previous task of the pack:",
            f"- sampled points: {evidence['points']}",
            f"- span of sampled u: {evidence['u_span']:.6g}",
            f"- max error of its equation on them: {evidence['max_error']:.6g}",
            f"- relative margin: {evidence['relative_margin']:.6g}",
        ]
    lines.append(f"\nAction feedback:\n{feedback}" if feedback else "\nNo action taken in this task yet.")
    lines.append("\nChoose the next action.")
    if budget > 0:
        lines.append(f"You may sample again: sample_pde_data with a point_grid of at most {budget} points.")
    else:
        lines.append(
            "The point budget is spent: run run_sparse_regression if the newest samples have not been fitted "
            "yet; otherwise commit with update_scientific_context or look at the pack's evidence."
        )
    lines.append(
        "run_sparse_regression can run whenever you have enough samples; update_scientific_context needs a "
        "sample and a regression in this task. Whether to sample more, fit again or commit is up to you.\n\n"
        "Reply with exactly one XML action inside <answer> tags."
    )
    return "\n".join(lines)

"""BOTS: Trinity-RFT's difficulty estimator behind `difficulty_based` with `feature_keys`.

Shen et al., "BOTS: A Unified Framework for Bayesian Online Task Selection in LLM Reinforcement
Finetuning" (arXiv 2510.26374); Trinity's DifficultyBasedSelector + InterpolationBetaPREstimator.

Each task j has a Beta(alpha_j, beta_j) belief over its pass rate, starting at Beta(1, 1), and two
prior pass rates f0_j, f1_j (the feature columns: a weaker and a stronger reference model). A
feedback batch I with observed pass rates r_i updates every task:

    c_est = (mean_I r - mean_I f0) / (mean_I f1 - mean_I f0 + 1e-6)   # where the policy sits
    c     = c_est at the first update, then 0.9 c + 0.1 c_est          #   between the two models
    p~_j  = clip(f0_j + c (f1_j - f0_j), 0, 1), and p~_i = r_i on I   # implicit evidence
    alpha_j <- (1 - lamb) alpha_j + lamb + (1 - rho) m r_j [j in I] + rho m p~_j
    beta_j  <- (1 - lamb) beta_j  + lamb + (1 - rho) m (1 - r_j) [j in I] + rho m (1 - p~_j)

(adaptive_rho halves rho before the update when mean_I |p~_i - r_i| >= 0.25). A batch of k
tasks scores p_j = alpha_j / (alpha_j + beta_j), or a draw from Beta(alpha_j, beta_j) with
do_sample, as -|target_reward - p_j| and takes the k best (tau = 0) or samples k without
replacement from softmax(score / tau), every step from the whole taskset.

Pure functions over numpy arrays: the taskset (taskset.py) keeps the state and persists it.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.common.config.buffer import BotsConfig
from services.common.errors import InvalidArgument

# Trinity's cap_coef_update_discount: the weight of the previous capability estimate c.
CAP_DISCOUNT = 0.9
# Mean |interpolated - observed| pass rate at which adaptive_rho halves rho.
RHO_HALVING_ERROR = 0.25


@dataclass(frozen=True)
class BotsState:
    """The estimator's state; every update returns a new one."""

    alphas: np.ndarray  # [n] Beta successes (pseudo-counts) per task row
    betas: np.ndarray  # [n] Beta failures per task row
    cap_coef: float | None = None  # c; None before the first update
    rho_halvings: int = 0  # times adaptive_rho halved rho: rho = kwargs.rho / 2**rho_halvings
    updates: int = 0  # feedback batches applied

    def rho(self, args: BotsConfig) -> float:
        return args.rho * 0.5**self.rho_halvings


def initial_state(n: int) -> BotsState:
    """Beta(1, 1) (uniform) for each of n tasks."""
    return BotsState(np.ones(n, dtype=np.float64), np.ones(n, dtype=np.float64))


def read_features(rows: Sequence[dict[str, Any]], keys: Sequence[str], task_ids: Sequence[str]) -> np.ndarray:
    """The [n, 2] prior pass rates of each row; a missing, non-numeric or out-of-[0, 1] value is an
    error naming the column and the row."""
    features = np.empty((len(rows), len(keys)), dtype=np.float64)
    for i, row in enumerate(rows):
        for k, key in enumerate(keys):
            where = f"row {i} (task {task_ids[i]!r})"
            if key not in row:
                raise InvalidArgument(
                    f"{where} has no column {key!r}; every row needs both feature_keys columns "
                    f"(prior pass rates in [0, 1]); columns of the row: {sorted(row)}",
                    field="feature_keys",
                )
            value = row[key]
            numeric = isinstance(value, numbers.Real) and not isinstance(value, bool)
            rate = float(value) if numeric else math.nan  # NaN fails the bounds below
            if not 0 <= rate <= 1:
                raise InvalidArgument(
                    f"{where}: column {key!r} must be a pass rate in [0, 1], got {value!r}",
                    field="feature_keys",
                )
            features[i, k] = rate
    return features


def update(
    state: BotsState, features: np.ndarray, args: BotsConfig, indices: Sequence[int], rates: Sequence[float]
) -> BotsState:
    """The state after a feedback batch: rows `indices` passed with `rates` (in [0, 1]).

    features: [n, 2]; indices, rates: [b]. A row twice in one batch counts once, with its last rate."""
    if not indices:
        return state
    idx = np.asarray(indices, dtype=np.int64)
    observed = np.asarray(rates, dtype=np.float64)
    f0, f1 = features[:, 0], features[:, 1]
    anchor0, anchor1 = float(f0[idx].mean()), float(f1[idx].mean())
    estimate = (float(observed.mean()) - anchor0) / (anchor1 - anchor0 + 1e-6)
    cap = (
        estimate if state.cap_coef is None else CAP_DISCOUNT * state.cap_coef + (1 - CAP_DISCOUNT) * estimate
    )
    p_tilde = np.clip(f0 + cap * (f1 - f0), 0.0, 1.0)  # [n]
    halvings = state.rho_halvings
    if args.adaptive_rho and float(np.mean(np.abs(p_tilde[idx] - observed))) >= RHO_HALVING_ERROR:
        halvings += 1
    p_tilde[idx] = observed
    successes, failures = np.zeros_like(p_tilde), np.zeros_like(p_tilde)  # [n], zero outside the batch
    successes[idx] = args.m * observed
    failures[idx] = args.m * (1 - observed)
    lamb, rho, m = args.lamb, args.rho * 0.5**halvings, args.m
    alphas = (1 - lamb) * state.alphas + lamb + (1 - rho) * successes + rho * m * p_tilde
    betas = (1 - lamb) * state.betas + lamb + (1 - rho) * failures + rho * m * (1 - p_tilde)
    return BotsState(alphas, betas, cap, halvings, state.updates + 1)


def pass_rates(state: BotsState, args: BotsConfig, seed: int) -> np.ndarray:
    """[n] estimated pass rates: the Beta means, or one draw per task with do_sample."""
    if args.do_sample:
        return np.random.default_rng(seed).beta(state.alphas, state.betas)
    return state.alphas / (state.alphas + state.betas)


def select(state: BotsState, args: BotsConfig, k: int, seed: int) -> list[int]:
    """k distinct rows nearest target_reward; `seed` is selector seed + tasks read so far (Trinity's
    seed + current_index), so a batch is the same after a restart.

    tau = 0: the k best scores (ties to the lower row). tau > 0: k draws without replacement from
    softmax(score / tau), as Gumbel top-k (the same distribution as sequential draws, and never
    short of candidates when most probabilities underflow to 0)."""
    scores = -np.abs(args.target_reward - pass_rates(state, args, seed))  # [n], in [-1, 0]
    if args.tau == 0:
        keys = scores
    else:
        keys = scores / args.tau + np.random.default_rng([seed, 1]).gumbel(size=scores.shape)
    return [int(i) for i in np.argsort(-keys, kind="stable")[:k]]


def data_digest(task_ids: Sequence[str], features: np.ndarray) -> str:
    """Identifies the rows and features a stored state was computed from."""
    digest = hashlib.sha256("\x00".join(task_ids).encode())
    digest.update(np.ascontiguousarray(features, dtype="<f8").tobytes())
    return digest.hexdigest()


def pack(state: BotsState) -> dict[str, Any]:
    """The state as columns of the bots_state table (storage/schema.py)."""
    return dict(
        alphas=np.ascontiguousarray(state.alphas, dtype="<f8").tobytes(),
        betas=np.ascontiguousarray(state.betas, dtype="<f8").tobytes(),
        cap_coef=state.cap_coef,
        rho_halvings=state.rho_halvings,
        updates=state.updates,
    )


def unpack(row: Any, n: int) -> BotsState | None:
    """The state stored by `pack`; None when it does not hold n tasks or is not finite."""
    alphas = np.frombuffer(row.alphas, dtype="<f8").astype(np.float64)
    betas = np.frombuffer(row.betas, dtype="<f8").astype(np.float64)
    if len(alphas) != n or len(betas) != n or not (np.isfinite(alphas).all() and np.isfinite(betas).all()):
        return None
    cap = row.cap_coef
    if cap is not None and not math.isfinite(cap):
        return None
    return BotsState(alphas, betas, cap, int(row.rho_halvings), int(row.updates))

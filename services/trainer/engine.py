"""The training step: forward over micro-batches, the algorithm's loss, backward, clip, AdamW step.

gRPC-free and I/O-free: `TrainEngine.train_step(batch)` takes a `batching.Batch` and returns
metrics. The service (service.py) decides where batches come from and when to ack, publish, save.

One step = one batch of train_batch_size experiences. Per step: behaviour logprobs are recomputed
for rows that arrived without them (external agents), or for every row when
algorithm.bypass_old_logprobs is false (the engine's are kept for the rollout correction), the
reference model and the critic run once without gradients, the algorithm computes advantages (and a
rollout correction) once, then `ppo_epochs` passes (each after the algorithm's batch-wide prepass,
if it has one: M2PO's mask) each split into
length-bucketed micro-batches whose gradients accumulate (each micro-batch loss is scaled by its
share of the rows, the algorithm API's contract) before one clipped optimizer step.

Logprobs and entropy come from the logits in blocks of positions (logprobs.py); each phase's peak
memory (memory.py) is in the step's metrics as memory/<phase>_peak_mb.

Settings and the lr schedule: settings.py; the critic and batch metrics: modeling.py; what a
checkpoint holds of the engine: engine_state.py.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import Tensor, nn

from services.common.errors import InvalidArgument
from services.trainer.algorithms.api import Algorithm
from services.trainer.batching import Batch, MicroShares, ModelInputs, micro_batches, rows_to_train
from services.trainer.distributed import DistContext, all_reduce_sums, deal_micro_batches, shard
from services.trainer.engine_state import EngineState
from services.trainer.logprobs import response_logits, response_logprobs
from services.trainer.lora import is_lora
from services.trainer.memory import PhasePeaks
from services.trainer.modeling import (
    ValueModel,
    accepts_logits_to_keep,
    batch_metrics,
    enable_gradient_checkpointing,
    read_sums,
)
from services.trainer.settings import EngineSettings, lr_factor
from services.trainer.ulysses import setup_sequence_parallel
from services.trainer.ulysses_forward import LogprobOptions, sharded_logprobs

TOP_LEVEL = ("rollout_corr/",)  # loss metrics logged under their own name, not actor/ (veRL's)


class StepAbandoned(Exception):
    """train_step gave up before its first optimizer step (`TrainEngine.abandon` was set): the weights,
    the optimizer and the step count are as they were before the call."""


class TrainEngine(EngineState):
    """Model, optional reference model and critic, AdamW and the warm-up schedule; see the module doc."""

    def __init__(
        self,
        model: nn.Module,
        algorithm: Algorithm,
        settings: EngineSettings,
        *,
        ref_model: nn.Module | None = None,
        critic: ValueModel | None = None,
        device: str | torch.device = "cpu",
        dist: DistContext | None = None,
    ) -> None:
        self.dist = dist
        # Set from another thread to give up the step in progress (a stop that ran out of time).
        self.abandon = threading.Event()
        self.device = dist.device if dist is not None else torch.device(device)
        self.model = model.to(self.device)
        self.algorithm = algorithm
        # an Algorithm written before token shares (a plugin's) takes row shares only
        self._token_scaled = "token_scale" in inspect.signature(algorithm.compute_loss).parameters
        self.settings = settings
        self.ref_model = ref_model.to(self.device).eval() if ref_model is not None else None
        self.critic = critic.to(self.device) if critic is not None else None
        if algorithm.use_reference and self.ref_model is None and not is_lora(model):
            raise InvalidArgument(
                f"algorithm {algorithm.name} needs a reference model", field="algorithm.kl_loss_fn"
            )
        if algorithm.use_critic and self.critic is None:
            raise InvalidArgument(f"algorithm {algorithm.name} needs a critic", field="algorithm.use_critic")
        noisy = [n for n, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p > 0]
        if algorithm.needs_update_prepass and noisy:
            # the prepass (one forward) and the update (another) must see the same policy
            raise InvalidArgument(
                f"algorithm {algorithm.name}'s batch-wide prepass needs a deterministic model; "
                f"dropout is active in {', '.join(noisy[:3])}",
                field="model.model_path",
            )
        if settings.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
            if self.critic is not None:
                enable_gradient_checkpointing(self.critic.backbone)
        # Ulysses: attention through the all-to-all; the ranks of a group read the same micro-batches
        self.sp = setup_sequence_parallel(
            dist, settings.ulysses_size, self.model, self.ref_model, self.critic
        )
        if dist is not None:  # shard before the optimizer sees the parameters (they become DTensors)
            shard(self.model)
            if self.critic is not None:
                shard(self.critic)
        self._trainables = nn.ModuleDict(
            {"policy": self.model, **({"critic": self.critic} if self.critic is not None else {})}
        )
        self.optimizer = torch.optim.AdamW(
            self._param_groups(settings),
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.weight_decay,
            foreach=self.device.type == "cuda" or None,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, settings))
        self.step = 0
        self._logits_to_keep = accepts_logits_to_keep(model)
        self.peaks = PhasePeaks(self.device)

    def _param_groups(self, settings: EngineSettings) -> list[dict[str, Any]]:
        """One group at settings.lr; the critic gets a group of its own only at a different critic_lr
        (so the optimizer state of a one-lr run keeps its layout)."""
        policy = [p for p in self.model.parameters() if p.requires_grad]
        critic = [p for p in self.critic.parameters() if p.requires_grad] if self.critic is not None else []
        if critic and settings.critic_lr is not None and settings.critic_lr != settings.lr:
            return [{"params": policy}, {"params": critic, "lr": settings.critic_lr}]
        return [{"params": policy + critic}]

    def trainable_modules_parameters(self) -> Iterator[nn.Parameter]:
        yield from self.model.parameters()
        if self.critic is not None:
            yield from self.critic.parameters()

    # ---- forward passes -------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.device.type == "cuda" and self.settings.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _logprobs(
        self, model: nn.Module, inputs: ModelInputs, *, with_entropy: bool, entropy_grad: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Logprob (and entropy) [b, T] of the response tokens under `model`, temperature applied."""
        options = LogprobOptions(
            self.settings.temperature, self.settings.logprob_chunk_size, with_entropy, entropy_grad
        )
        if self.sp is not None:  # Ulysses: this rank's positions, the group's gathered
            return sharded_logprobs(model, inputs, self.sp, self._autocast(), options)
        with self._autocast():
            logits, start = response_logits(model, inputs, logits_to_keep=self._logits_to_keep)
        return response_logprobs(logits, start, inputs.responses, **options._asdict())

    def policy(self, inputs: ModelInputs, *, with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
        """Current policy's logprob and entropy over the response, [b, T] each (grad flows)."""
        grad = bool(getattr(self.algorithm, "entropy_needs_grad", True))
        return self._logprobs(self.model, inputs, with_entropy=with_entropy, entropy_grad=grad)

    @torch.no_grad()
    def logprobs_of(self, model: nn.Module, batch: Batch) -> Tensor:
        """Logprobs [B, T] of `model` for every row, without grad, micro-batch by micro-batch."""
        out = torch.zeros_like(batch.train.action_mask)
        for idx in micro_batches(batch, self.settings.micro_batch_size, self.settings.tokens_per_micro_batch):
            inputs = batch.inputs.select(idx)
            logprob, _ = self._logprobs(model, inputs, with_entropy=False)
            out[idx, : inputs.response_width] = logprob
        return out

    @torch.no_grad()
    def entropy_of(self, batch: Batch) -> Tensor:
        """The current model's entropy [B, T] at every response position, without grad."""
        out = torch.zeros_like(batch.train.action_mask)
        for idx in micro_batches(batch, self.settings.micro_batch_size, self.settings.tokens_per_micro_batch):
            inputs = batch.inputs.select(idx)
            _, entropy = self._logprobs(self.model, inputs, with_entropy=True)
            assert entropy is not None
            out[idx, : inputs.response_width] = entropy
        return out

    def reference_logprobs(self, batch: Batch) -> Tensor:
        """The reference model's logprobs [B, T]; with LoRA and no separate reference model, the
        policy's with its adapter disabled (the frozen base: Trinity's reference under LoRA)."""
        if self.ref_model is not None:
            return self.logprobs_of(self.ref_model, batch)
        with cast(Any, self.model).disable_adapter():
            return self.logprobs_of(self.model, batch)

    @torch.no_grad()
    def values_of(self, batch: Batch) -> Tensor:
        assert self.critic is not None
        out = torch.zeros_like(batch.train.action_mask)
        for idx in micro_batches(batch, self.settings.micro_batch_size, self.settings.tokens_per_micro_batch):
            inputs = batch.inputs.select(idx)
            with self._autocast():
                out[idx, : inputs.response_width] = self.critic(inputs).float()
        return out

    # ---- the step -------------------------------------------------------------------------------

    def prepare(self, batch: Batch) -> dict[str, float]:
        """Everything computed once per batch before the update; fills the batch in place."""
        train = batch.train
        timings: dict[str, float] = {}
        was_training = self.model.training
        self.model.eval()
        recompute_all = self.algorithm.recompute_old_logprob  # bypass_old_logprobs false
        if self.algorithm.needs_old_logprob and (recompute_all or bool(batch.needs_logprob.any())):
            with self._phase("recompute_logprob", timings):
                recomputed = self.logprobs_of(self.model, batch) * train.action_mask
            if recompute_all:  # the engine's logprobs stay, as the rollout policy (rows without: ratio 1)
                train.rollout_logprob = torch.where(
                    batch.needs_logprob.unsqueeze(-1), recomputed, train.old_logprob
                )
                train.old_logprob = recomputed
            else:
                rows = batch.needs_logprob
                train.old_logprob[rows] = recomputed[rows]
        if getattr(self.algorithm, "needs_entropy", False):
            with self._phase("entropy", timings):
                train.entropy = self.entropy_of(batch) * train.action_mask
        if self.algorithm.use_reference:
            with self._phase("ref", timings):
                train.ref_logprob = self.reference_logprobs(batch)
        self.model.train(was_training)
        if self.algorithm.use_critic:
            with self._phase("values", timings):
                train.values = self.values_of(batch)
        t0 = time.perf_counter()
        adv_metrics = self.algorithm.compute_advantages(train)  # keeps producer-given advantages
        timings["time/advantage"] = time.perf_counter() - t0
        correction = self.algorithm.correct_batch(train)  # after the advantages, as veRL's trainer
        return {**adv_metrics, **correction, **timings}

    @contextlib.contextmanager
    def _phase(self, name: str, timings: dict[str, float]) -> Iterator[None]:
        """Time the block (timings["time/<name>"]) and record its peak memory (self.peaks)."""
        t0 = time.perf_counter()
        with self.peaks.phase(name):
            yield
        timings[f"time/{name}"] = time.perf_counter() - t0

    def _check_abandon(self) -> None:
        # FSDP ranks must run the same collectives, so a distributed step always finishes.
        if self.abandon.is_set() and self.dist is None:
            self.optimizer.zero_grad(set_to_none=True)
            raise StepAbandoned(f"step {self.step + 1} abandoned before its optimizer step")

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step per ppo epoch over `batch`; returns metrics (loss parts, grad norm, lr,
        each phase's peak memory and the whole step's, memory/step_peak_mb...)."""
        with self.peaks.phase("step"):
            metrics = self._train_step(batch)
        metrics.update(self.peaks.metrics())
        return metrics

    def _train_step(self, batch: Batch) -> dict[str, float]:
        start = time.perf_counter()
        batch = Batch(
            batch.inputs.to(self.device), batch.train.to(self.device), batch.needs_logprob.to(self.device)
        )
        self._check_abandon()
        metrics = self.prepare(batch)
        self.model.train()
        t_update = time.perf_counter()
        n = len(batch)
        world = self.dist.world_size if self.dist is not None else 1
        sums: dict[str, float | Tensor] = {}
        grad_norm = 0.0
        active = rows_to_train(batch, self.algorithm.zero_advantage_is_inert)
        metrics["batch/skipped_rows"] = float(n - len(active))
        warming_up = self.critic is not None and self.step < self.settings.critic_warmup
        if self.critic is not None:
            metrics["critic/warmup"] = float(warming_up)
        shares = MicroShares(batch)  # the action mask is set: prepare() ran
        for _epoch in range(self.settings.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            sums = {"loss": 0.0}
            if self.algorithm.needs_update_prepass:  # e.g. M2PO's batch-wide mask, current weights
                with self._phase("prepass", metrics):
                    prepass = self.algorithm.before_update(batch.train, self.logprobs_of(self.model, batch))
                metrics.update({f"actor/{k}": v for k, v in prepass.items()})
            chunks = self._chunks(batch, active)
            if self.dist is not None:  # to data-parallel ranks: the groups under Ulysses
                dp_rank, dp_size = (self.sp.dp_rank, self.sp.dp_size) if self.sp else (self.dist.rank, world)
                mine = deal_micro_batches(chunks, dp_rank, dp_size)
            else:
                mine = [(c, True) for c in chunks]
            for idx, real in mine:
                if _epoch == 0:  # once an optimizer step ran, the step is finished, not abandoned
                    self._check_abandon()
                # a dummy (share 0) keeps the ranks' collectives in step
                self._micro_step(batch.select(idx), shares.of(idx) if real else (0.0, 0.0), world, sums)
            if warming_up:  # veRL's critic warm-up: the policy's gradients are dropped, it does not move
                for p in self.model.parameters():
                    p.grad = None
            with self._phase("optimizer", metrics):
                grad_norm = self._clip_and_step()
        totals = read_sums(sums)  # the step's one device sync for its loss metrics
        if self.dist is not None:
            totals = all_reduce_sums(totals, self.device)
        metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]  # the lr this step used
        self.scheduler.step()
        self.step += 1
        metrics.update({k if k.startswith(TOP_LEVEL) else f"actor/{k}": v for k, v in totals.items()})
        metrics["actor/grad_norm"] = grad_norm
        metrics["time/update"] = time.perf_counter() - t_update
        metrics["time/step"] = time.perf_counter() - start
        metrics.update(batch_metrics(batch))
        return metrics

    def _micro_step(
        self, mb: Batch, shares: tuple[float, float], world: int, sums: dict[str, float | Tensor]
    ) -> None:
        """Forward, loss and backward of one micro-batch, its gradients added to the parameters' .grad;
        its loss parts added to `sums`, weighted by its share of the batch's rows. `shares`: of the
        batch's rows and of its action tokens (token-mean terms take the latter, so the gradient is
        the whole batch's however it is split). Tensors stay on the device (read_sums reads them
        once per step): nothing here waits for the GPU."""
        share, token_share = shares
        with self.peaks.phase("forward"):
            logprob, entropy = self.policy(mb.inputs)
            values = self.critic(mb.inputs) if self.critic is not None else None
            # FSDP averages gradients over ranks; `world` turns that average back into the sum.
            scales = {"loss_scale": share * world}
            if self._token_scaled:
                scales["token_scale"] = token_share * world
            loss, parts = self.algorithm.compute_loss(mb.train, logprob, entropy, values, **scales)
        with self.peaks.phase("backward"):
            loss.backward()
        copies = self.sp.size if self.sp is not None else 1  # a group's ranks all add the same numbers
        sums["loss"] = sums.get("loss", 0.0) + loss.detach() / world / copies
        for key, value in parts.items():
            part = value.detach() if isinstance(value, Tensor) else float(value)
            sums[key] = sums.get(key, 0.0) + part * share / copies
        if entropy is not None:
            mask = mb.train.action_mask
            mean_entropy = (entropy.detach() * mask).sum() / mask.sum().clamp(min=1)
            sums["entropy"] = sums.get("entropy", 0.0) + mean_entropy * share / copies

    def _chunks(self, batch: Batch, rows: Tensor) -> list[Tensor]:
        """Micro-batches (row indices into `batch`) over `rows`."""
        size, tokens = self.settings.micro_batch_size, self.settings.tokens_per_micro_batch
        if len(rows) == len(batch):
            return micro_batches(batch, size, tokens)
        return [rows[c] for c in micro_batches(batch.select(rows), size, tokens)] if len(rows) else []

    def _clip_and_step(self) -> float:
        params = [p for p in self.trainable_modules_parameters() if p.grad is not None]
        max_norm = self.settings.grad_clip if self.settings.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):  # FSDP: a DTensor holding the global norm
            norm = norm.full_tensor()
        if torch.isfinite(norm):
            self.optimizer.step()
        # A non-finite norm skips the update (the grads are garbage) but still counts the step.
        return float(norm)

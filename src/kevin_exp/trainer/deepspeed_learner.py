"""The policy update under DeepSpeed ZeRO (stage 2 or 3) over every rank of the run.

Each rank holds its own share of the step's samples (whole task groups: see ``run/training.py``). The update
is the single-process one (``TorchLearner``) computed over the union of the ranks' samples:

- Gradient steps: the same seeded mini-batch split, drawn over the whole step (``batching.minibatch_plan``).
- Normalisation: the loss of a gradient step is divided by the step's global sequence and token counts, and
  scaled by the world size, which cancels DeepSpeed's averaging of gradients over ranks: the summed gradient is
  the one a single rank computes on the whole batch.
- Micro-batches: at most ``trainer.micro_batch_tokens`` padded tokens each. Ranks hold different numbers of
  tokens (multi-turn rollouts), and ZeRO-3 gathers parameters collectively in every forward and backward, so
  all ranks must run as many passes: the count is all-reduced (max) first and a rank that runs out pads with
  zero-weight micro-batches (a one-token forward/backward whose loss is multiplied by 0).
- DeepSpeed's accumulation boundary is set by hand on each gradient step's last micro-batch, so the number
  of micro-batches per step follows from the batch (``ds_config`` states one).
- Metrics are reduced over ranks (sums of token statistics, the max of ``logprob_diff_max``); every rank
  returns the same dict.
- ZeRO-3 trains a copy of the model built partitioned (``_partitioned_copy``); the model the generator
  samples from (``self.model``) stays whole and is refreshed after each step parameter by parameter
  (``GatheredParameters``), never the whole model gathered at once. Under ZeRO-2 the engine trains
  ``self.model`` itself.

Samples with a zero advantage carry no gradient (there is no KL term under this backend) and are not run,
but count in every normaliser, as in ``TorchLearner``.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from kevin_exp.config import AlgorithmConfig, TrainerConfig
from kevin_exp.launch.world import context_from_env, join_process_group
from kevin_exp.models.loading import _enable_checkpointing as enable_checkpointing
from kevin_exp.models.partial_checkpointing import limit_checkpointing
from kevin_exp.rl.loss import clipped_policy_loss
from kevin_exp.trainer import collectives
from kevin_exp.trainer.batching import minibatch_plan, token_micro_batches
from kevin_exp.trainer.ds_config import run_deepspeed_config
from kevin_exp.trainer.learner import (
    LearnerSample,
    TrainBatch,
    UpdateStats,
    add_micro_batch,
    scatter_rows,
    set_means,
    warmup_lambda,
)
from kevin_exp.trainer.logprobs import chunk_count, pack, response_logprobs

DS_CONFIG_FILE = "deepspeed_config.json"


def import_deepspeed(device: torch.device):
    """DeepSpeed, imported once the accelerator is known (it picks one at import)."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    return deepspeed


class DeepSpeedLearner:
    def __init__(self, model: torch.nn.Module, pad_id: int, trainer: TrainerConfig, algorithm: AlgorithmConfig,
                 max_new_tokens: int, total_steps: int, device: torch.device, temperature: float = 1.0,
                 top_p: float = 1.0, run_dir: str | Path | None = None, load_universal: bool = False,
                 keep_generator_copy: bool = True, *, normalization: str) -> None:
        if algorithm.kl_coef > 0:
            raise ValueError("trainer=deepspeed has no reference policy: algorithm.kl_coef must be 0")  # refused at composition
        self.ctx = context_from_env()
        self.deepspeed = import_deepspeed(device)
        join_process_group(self.ctx, device, trainer.dist_timeout_s)
        self.deepspeed.init_distributed(dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False)
        self.model, self.pad_id, self.cfg, self.algo = model, pad_id, trainer, algorithm
        self.normalization = normalization  # the run's headline `normalization` of the loss
        self.max_new_tokens, self.device = max_new_tokens, device
        self.temperature, self.top_p = temperature, top_p
        self.world = collectives.world_size()
        self.rank = collectives.rank()
        self.ds_config = run_deepspeed_config(trainer, self.world, load_universal)
        train_model = self._partitioned_copy(model) if trainer.zero_stage == 3 else model
        if trainer.activation_checkpointing:
            enable_checkpointing(train_model)
            if trainer.checkpoint_layers < 1.0:
                limit_checkpointing(train_model, trainer.checkpoint_layers)
        if run_dir is not None and self.rank == 0:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            (Path(run_dir) / DS_CONFIG_FILE).write_text(json.dumps(self.ds_config, indent=1))
        lr_lambda = warmup_lambda(trainer, total_steps)
        self.engine, self.optimizer, _, self.scheduler = self.deepspeed.initialize(
            model=train_model, config=self.ds_config,
            model_parameters=[p for p in train_model.parameters() if p.requires_grad],
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda), dist_init_required=False)
        if self.engine.module is not model:
            if keep_generator_copy:
                self.model.to(dtype=next(self.engine.module.parameters()).dtype)
            else:
                # the generator holds its own weights: the whole model was only the source of the partitioned copy
                model.to("meta")
                self.model = self.engine.module
        self.last_micro_batches = 0

    def _partitioned_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model ZeRO-3 trains: built partitioned (``zero.Init``), so a rank never holds a second whole
        copy, then given ``model``'s weights one gathered parameter at a time."""
        from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

        # transformers builds under zero.Init (skipping its weight init and keeping the rotary buffers' dtype)
        # while this object lives; it must not outlive the build, or generate() would sync the ranks' GPUs
        zero3 = HfDeepSpeedConfig(self.ds_config)
        try:
            copy = type(model)._from_config(model.config)
        finally:
            unset_hf_deepspeed_config()
            del zero3
        params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
        with torch.no_grad():
            for name, param in copy.named_parameters():
                with self.deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                    if self.rank == 0:
                        param.copy_(params[name])
            for name, buffer in copy.named_buffers():
                if name in buffers:
                    buffer.copy_(buffers[name])
        if getattr(model, "generation_config", None) is not None:
            copy.generation_config = model.generation_config
        return copy

    # ------------------------------------------------------------------ the Learner protocol
    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError("DeepSpeed checkpoints are sharded: Checkpointer.save_sharded writes them")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError("DeepSpeed checkpoints are sharded: Checkpointer.load_sharded reads them")

    def train_step(self, batch: TrainBatch) -> dict[str, Any]:
        stats = asdict(self.update(batch.samples, batch.seed))
        stats["micro_batches"] = self.last_micro_batches
        return stats

    # ------------------------------------------------------------------ the update
    def update(self, samples: Sequence[LearnerSample], seed: int) -> UpdateStats:
        samples = [s for s in samples if s.response_ids]
        stats = UpdateStats(lr=self.scheduler.get_last_lr()[0])
        per_rank = collectives.all_gather_objects([len(s.response_ids) for s in samples])
        offset = sum(len(r) for r in per_rank[: self.rank])
        global_len = [n for r in per_rank for n in r]
        if not global_len:
            return stats
        lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
        active = [i for i, s in enumerate(samples) if s.advantage != 0.0]
        # under ZeRO-2 the engine's module is the generator's model: give it back in the mode it came in
        was_training = self.engine.module.training
        self.engine.eval()
        old = dict(zip(active, self._logprobs(samples, active, lengths)))
        if collectives.reduce_values([len(active)], "sum")[0] > 0:
            probe = old
        else:  # no sample carries a gradient: compare on a micro-batch of the others
            first = token_micro_batches(range(len(samples)), lengths, self.cfg.micro_batch_tokens)[:1]
            probed = first[0] if first else []
            probe = dict(zip(probed, self._logprobs(samples, probed, lengths)))
        diff_sum, diff_n, diff_max = _logprob_diff_parts(samples, probe)
        self.engine.train()
        totals = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip": 0.0, "tokens": 0.0}
        norms, micro_batches = [], 0
        active_set = set(active)
        for idx in minibatch_plan(len(global_len), self.cfg.minibatches, self.cfg.epochs, seed):
            n_tokens = sum(global_len[i] for i in idx)
            mine = [i - offset for i in idx if offset <= i < offset + len(samples) and (i - offset) in active_set]
            micros = token_micro_batches(mine, lengths, self.cfg.micro_batch_tokens)
            count = max(1, collectives.max_int(len(micros)))
            micro_batches += count
            for k in range(count):
                self.engine.set_gradient_accumulation_boundary(k == count - 1)
                if k < len(micros):
                    loss = self._micro_loss(samples, micros[k], old, len(idx), n_tokens, totals)
                else:
                    loss = self._padding_loss()
                self.engine.backward(loss * self.world)
                self.engine.step()
            norms.append(float(self.engine.get_global_grad_norm() or 0.0))
            stats.gradient_steps += 1
        loss, kl, entropy, clip, tokens, dsum, dn = collectives.reduce_values(
            [totals["loss"], totals["kl"], totals["entropy"], totals["clip"], totals["tokens"], diff_sum, diff_n], "sum")
        dmax = collectives.reduce_values([diff_max if diff_max is not None else -1.0], "max")[0]
        set_means(stats, loss, kl, entropy, clip, tokens)
        stats.grad_norm = sum(norms) / max(1, len(norms))
        stats.logprob_diff_mean, stats.logprob_diff_max = (dsum / dn, dmax) if dn > 0 else (None, None)
        self.last_micro_batches = micro_batches
        self.engine.module.train(was_training)
        self.sync_generator_weights()
        return stats

    def _micro_loss(self, samples, micro, old, n_sequences, n_tokens, totals) -> torch.Tensor:
        batch = pack([samples[i].prompt_ids for i in micro], [samples[i].response_ids for i in micro], self.pad_id,
                     self.device)
        logp, entropy = self._score(batch, with_entropy=True)
        mask = batch.mask
        adv = torch.tensor([samples[i].advantage for i in micro], dtype=torch.float32, device=self.device)
        res = clipped_policy_loss(logp, scatter_rows(old, micro, mask), adv, mask, self.normalization,
                                  self.max_new_tokens, self.algo.clip_low, self.algo.clip_high,
                                  total_sequences=n_sequences, total_tokens=n_tokens)
        add_micro_batch(totals, res, logp, entropy, mask)
        return res.loss

    def _padding_loss(self) -> torch.Tensor:
        """A forward and backward through the whole model that changes no gradient (see the module doc)."""
        batch = pack([[self.pad_id]], [[self.pad_id]], self.pad_id, self.device)
        logp, _ = self._score(batch)
        return logp.sum() * 0.0

    def _score(self, batch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        chunks = collectives.max_int(chunk_count(batch, self.cfg.logprob_chunk_tokens))
        return response_logprobs(self.engine, batch, with_entropy=with_entropy, temperature=self.temperature,
                                 top_p=self.top_p, chunk_tokens=self.cfg.logprob_chunk_tokens, min_chunks=chunks)

    def _logprobs(self, samples: Sequence[LearnerSample], indices: Sequence[int], lengths: Sequence[int]) -> list[torch.Tensor]:
        """Response log-probs of ``samples[indices]`` under the current weights; every rank runs as many forward
        passes (ZeRO-3 gathers parameters collectively)."""
        micros = token_micro_batches(list(indices), lengths, self.cfg.micro_batch_tokens)
        count = collectives.max_int(len(micros))
        out: list[torch.Tensor] = []
        with torch.no_grad():
            for k in range(count):
                if k >= len(micros):
                    self._padding_loss()
                    continue
                micro = micros[k]
                batch = pack([samples[i].prompt_ids for i in micro], [samples[i].response_ids for i in micro],
                             self.pad_id, self.device)
                logp, _ = self._score(batch)
                out.extend(row[batch.mask[j].bool()].cpu() for j, row in enumerate(logp))
        return out

    def generator_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The whole weights, one parameter at a time (a collective under ZeRO-3: every rank iterates them all);
        each tensor is valid until the next one is asked for."""
        with torch.no_grad():
            for name, param in self.engine.module.named_parameters():
                with self.deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                    yield name, param.data

    def consolidated_state(self) -> dict[str, torch.Tensor] | None:
        """The whole weights as one state dict on rank 0 (None elsewhere), every tensor in storage of its own and
        tied names sharing one; without a whole copy it is gathered parameter by parameter (a collective)."""
        if not _partitioned(self.model):
            return _own_storage_state(self.model) if self.rank == 0 else None
        names: dict[int, list[str]] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
        state: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for param in self.model.parameters():
                with self.deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                    if self.rank == 0:
                        whole = param.data.detach().to("cpu", copy=True)
                        for name in names[id(param)]:
                            state[name] = whole
        return state if self.rank == 0 else None

    def parameter_count(self) -> int:
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.engine.module.parameters())

    def sync_generator_weights(self) -> None:
        """The generator's model gets the updated weights (ZeRO-3: one gathered parameter at a time)."""
        if self.engine.module is self.model:
            return
        targets = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, param in self.engine.module.named_parameters():
                with self.deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                    targets[name].copy_(param.data)

    def named_parameters(self):
        return self.model.named_parameters()


def _partitioned(model: torch.nn.Module) -> bool:
    return any(hasattr(p, "ds_id") for p in model.parameters())


def _own_storage_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict with every tensor in storage of its own (tied weights still sharing one): ZeRO-2
    makes the parameters views into one flat buffer, which safetensors refuses."""
    copies: dict[tuple, torch.Tensor] = {}
    out = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if key not in copies:
            copies[key] = tensor.detach().clone()
        out[name] = copies[key]
    return out


def _logprob_diff_parts(samples: Sequence[LearnerSample], learner_logp: Mapping[int, torch.Tensor]) -> tuple[float, int, float | None]:
    """Sum, count and max of |generator log-prob - learner log-prob| over this rank's response tokens."""
    diffs = [(torch.tensor(samples[i].sampled_logprobs, dtype=torch.float64) - row.double()).abs()
             for i, row in learner_logp.items() if len(samples[i].sampled_logprobs) == len(row)]
    if not diffs:
        return 0.0, 0, None
    flat = torch.cat(diffs)
    return float(flat.sum()), int(flat.numel()), float(flat.max())

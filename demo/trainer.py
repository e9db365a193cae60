"""A trainer rank: a tiny policy trained with DDP on its slice of every step, with
torch.distributed.checkpoint saves, checkpoint markers and retention."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lakestream.demo.rollout import VOCAB, varied_rewards
from lakestream.loaders import StreamDataset, load_checkpoint, save_checkpoint
from lakestream.stream import Stream


class Policy(nn.Module):
    """Next-token log-probabilities from an embedding of the previous token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(tokens[:, :-1].long()))
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(-1, tokens[:, 1:].long().unsqueeze(-1)).squeeze(-1)


def grpo_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Clipped importance-weighted policy gradient with group-relative advantages; the
    behaviour log-probs stored with each sample give the off-policy ratio."""
    logp = model(batch["tokens"])
    behaviour = batch["logprobs"][:, 1:]
    mask = batch["loss_mask"][:, 1:].float()
    mask = mask * (torch.arange(mask.shape[1])[None, :] < (batch["tokens_lengths"] - 1)[:, None])
    reward = batch["reward"]
    groups = batch["prompt_id"]
    adv = reward.clone()
    for g in groups.unique():
        members = groups == g
        adv[members] = reward[members] - reward[members].mean()
    ratio = torch.exp((logp - behaviour).clamp(-20, 20))
    clipped = torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    return -(clipped * mask).sum() / mask.sum().clamp(min=1)


def main() -> None:
    uri, rank, world, init, steps, every, log_dir, max_staleness = sys.argv[1], \
        int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), \
        sys.argv[7], int(sys.argv[8])
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(Policy())
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    # Read-time policies: groups staler than the bound are dropped and the step refilled,
    # groups without reward signal skipped, and each step's groups dealt to ranks by tokens.
    ds = StreamDataset(uri, group="train", timeout=300, max_steps=steps, keep_last=2,
                       progress_interval_s=0.05, max_staleness=max_staleness,
                       accept=varied_rewards, accept_columns=["reward"], balance="tokens")
    # This trainer's checkpoints, where producers cannot write: a marker is read from the
    # stream's log, and its checkpoint is loaded only from under this root.
    ckpt_root = os.path.join(log_dir, "ckpt")
    markers = Stream.open(uri).checkpoints("train")
    if markers:  # restart: resume from the last durable checkpoint
        state = {"model": model.state_dict(), "optim": optim.state_dict()}
        load_checkpoint(state, markers[-1], ds, root=ckpt_root)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
    ds.policy_version = ds.start_step
    log = open(os.path.join(log_dir, f"rank{rank}-{os.getpid()}.jsonl"), "a")  # noqa: SIM115
    waited = 0.0
    t = time.perf_counter()
    for batch in ds:  # num_workers=0: decoding runs in the reader's threads
        waited += time.perf_counter() - t
        step = int(batch["step"])
        loss = grpo_loss(model, batch)
        optim.zero_grad()
        loss.backward()
        optim.step()
        ds.policy_version = step + 1
        log.write(json.dumps({
            "step": step, "t": time.time(), "loss": float(loss),
            "ids": [[int(p), int(r)] for p, r in zip(batch["prompt_id"], batch["response"],
                                                      strict=True)],
            "versions": [int(v) for v in batch["policy_version"]],
            "rewards": [float(r) for r in batch["reward"]],
            "read_policy": batch["read_policy"],
            "wait_s": waited}) + "\n")
        log.flush()
        if (step + 1) % every == 0:
            save_checkpoint({"model": model.state_dict(), "optim": optim.state_dict()},
                            f"step-{step + 1}", ds, root=ckpt_root)
        t = time.perf_counter()
    reader = ds.last_reader
    if reader is not None:
        with open(os.path.join(log_dir, f"reads-rank{rank}.json"), "a") as f:
            f.write(json.dumps({"latencies_s": list(reader.read_latencies_s),
                                "wait_s": reader.wait_s,
                                "cursor": json.loads(ds.state_dict()["mix"])["cursors"][0]})
                    + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Training backends behind one Protocol (train/base.py), built by one factory (train/factory.py).

base.py       TrainBackend: what the loop, the update and the rollout engines ask of a trainer
factory.py    build_trainer(cfg, model_dir) -> (TrainGroup | None, backend): what the loop calls
rank.py       one rank's device and backend (the controller and every follower build the same)
lora.py       LoRA / QLoRA on a frozen base
full.py       full fine-tuning's shared base: FullBackend over a Sharding, the log-prob head, weights IO
fsdp.py       the FSDP2 sharding and its backend (train.backend=fsdp)
zero3.py      the ZeRO-3 sharding and its backend (train.backend=deepspeed)
group.py      several ranks: the controller (TrainGroup) and rank 0's backend (GroupBackend)
follower.py   a follower rank's process; commands.py: the messages between them
dist.py       the torch.distributed group, and how W ranks share one update
head.py       the LM head in fp32 and fused log-probs; optim.py: AdamW with bf16 moments
"""

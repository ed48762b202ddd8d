"""Data-parallel training on PyTorch's own runtime: torchrun processes, FSDP2 sharding, DCP checkpoints.

- `context`: the process group and device mesh of a run (`DistContext`), built once, passed explicitly.
- `launcher`: `relm train` starting torchrun itself (on one node, or on each of several with
  `MASTER_ADDR` set) or printing the command for several nodes.
- `layout`: whether each model is replicated or sharded over the ranks (verl's `fsdp_size`, or planned).
- `fsdp`: `fully_shard` of actor, reference and critic; full weights for the rollout engine.
- `gathering`: weights gathered and gradients reduced once per optimizer step, not per micro-batch.
- `rollout`: `DataParallelEngine`, each rank generating for its share of the prompts.
- `balance`: which rows of a step each rank trains on, balanced by token count.
- `steps`: the trainer's per-step glue (forwards on this rank's rows, metric reduction).
- `checkpoint`: sharded checkpoints (torch.distributed.checkpoint) and their export to an HF folder.

Nothing here runs in a single-process run: there `DistContext()` is the single-process context whose
collectives return their input, `gathering`'s wrappers leave a plain model alone, and the trainer
takes exactly the code path it had before.
"""

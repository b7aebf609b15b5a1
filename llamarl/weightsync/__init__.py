"""The weight-sync channel: trainer -> generators, apart from the data bus.

Transports: `shm` (one host: a file in /dev/shm written atomically) and `gloo` (point-to-point
torch.distributed send/recv in a two-rank group per transfer, so generators join and leave without
a global world; `nccl` has the same shape on GPUs). A receiver verifies size and checksum before
it hands weights over, so a corrupted or truncated transfer is never swapped in.
"""

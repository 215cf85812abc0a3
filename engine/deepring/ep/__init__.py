"""Expert parallelism: the expert load balancer (placement), the expert-parallel MoE layer
over torch.distributed (moe), and the group's per-step driver (group)."""

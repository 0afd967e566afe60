"""Running plans for real with torch.distributed (the only package besides profiling that starts
processes and touches devices)."""

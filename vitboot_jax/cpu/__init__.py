"""The CPU layer: the `cpu` kernel set and what only it uses (matmul, conv, softmax_attention),
and the host set-up for CPU runs (devices, features, host_memory)."""

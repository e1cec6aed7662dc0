"""The CPU layer: the `cpu` kernel set (kernels) and what only it uses (matmul, conv,
softmax_attention, attention_chunks, slices), and the host set-up for CPU runs (devices,
features, host_memory). It builds on models/ (the `Kernels` record); models never import it."""

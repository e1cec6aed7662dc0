"""Performance tools: step benchmark, input-pipeline rate, kernel A/Bs, step profiles, GPU/TPU
lowering. One flag style (absl), one trainer setup (vitboot_jax.trainer)."""

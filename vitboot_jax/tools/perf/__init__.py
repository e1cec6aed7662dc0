"""Performance tools: step benchmark, input-pipeline rate, kernel A/Bs, step profiles, GPU/TPU
lowering, checkpoint and recipe costs. One flag style (absl), one trainer setup
(vitboot_jax.trainer). The project's own instruments built on them (the plan of a lent
accelerator's call, host memory over many saves) are in launch/."""

"""The models' allowed choices, one list each: configlib checks them before jax is imported (this
module imports nothing), and the modules that implement them name them in their errors."""

AGENT_STEMS = ("res_like", "patch", "small", "small_full")  # agent.py
TAPS = ("official", "centered")  # agent.py: where the CONV's heads read.
INITS = ("official", "standard")  # agent.py, vit.py
KERNELS = ("auto", "xla", "cpu")  # kernels.py

"""Tables of runs: their rows (tables), running them (runs), the report beside the paper's
numbers (report, paper_results); `python -m vitboot_jax.tools.sweep` is the command line."""

"""What keeps a run safe and recorded: the start-up checks (startup), the workdir's rules and its
one-run claim (workdir_rules, workdir_claim), stop requests (preemption), every process failing
together with one line (failing), and what a run writes: provenance, metrics and progress."""

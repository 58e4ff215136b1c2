"""A sandbox for each local rollout's harness (bubblewrap): its working copy writable, nothing else of the machine
but the system and the interpreter read-only, its own processes, an unprivileged user, limits, and a network
where only the gateway answers. `policy` plans it (pure), `launch` makes and watches it, `inside` runs in it."""

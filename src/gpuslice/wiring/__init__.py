"""The composition root: the one place that chooses the host (wiring.host) and builds
each command's objects from its resolved options (config.options.RunOptions). It
composes; it decides nothing. One module per concern, imported by what needs it, so
that a small command (`gpuslice mps-control`, wiring.mps_control) loads only its own:
host (the host), agent (node state and front-ends), node (`run`'s node), run (`run`'s
process), commands (`labels`, `advise`), mps_control."""

"""One module per CLI command that does more than compose: each imports only wiring,
config and core (the demos also the testing kit, their simulated cluster)."""

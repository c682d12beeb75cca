"""Entry point: the `fanout` command line (serve, token, demo, replay, rebuild, verify, analyze)."""

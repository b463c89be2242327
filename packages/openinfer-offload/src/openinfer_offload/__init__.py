"""openinfer-offload: KV tiers below device memory. `host` (pinned DRAM, the first tier) and
`disk` (a local directory that survives restarts), chosen with `--kv-offload host,disk`."""

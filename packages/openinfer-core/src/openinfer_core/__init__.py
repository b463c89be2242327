"""openinfer-core: the engine contract, plugins, engine loop, sampler, text and weights."""

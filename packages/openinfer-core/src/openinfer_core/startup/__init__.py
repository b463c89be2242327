"""Start-up: everything between the plugins and the engine's first step (`bring_up.bring_up`,
the one entry point the engine calls), and the work begun before it (`prefetch`,
`kernel_compilers.start_compile_workers`, which the engine process runs before importing torch:
this package's `__init__` imports nothing, so those stay torch-free)."""

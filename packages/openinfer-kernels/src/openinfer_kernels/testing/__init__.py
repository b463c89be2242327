"""Test support for Triton kernels on a machine without a GPU.

The Triton interpreter (`TRITON_INTERPRET=1`) runs the kernels on CPU tensors for their
numbers but never runs Triton's front end, so a kernel can pass every CPU test and still fail
to compile on the GPU. `ttir` compiles a launch to TTIR, Triton's first IR, for an sm90 target
(no GPU needed); `ttir_plugin` is a pytest plugin that compiles every launch a test session
makes that way instead of running it; `compiled_session` runs a test file in a process with
the interpreter off (a compiling test cannot share one with interpreted kernels);
`jit_sources` lists the `@triton.jit` functions a source tree defines, so a check can tell
which of them no launch reached; `ranks` runs a collective kernel's ranks as forked processes
over CPU shared memory."""

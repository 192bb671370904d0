"""The symbolic tracer: a training step on the meta device, recorded as allocator requests."""

"""Code of every job's wrapper process: attempts, heartbeats, the GPU sampler, shared memory, how a job ended."""

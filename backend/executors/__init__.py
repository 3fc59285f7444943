"""Executors run JobSpecs: `LocalExecutor` as local processes, `HfJobsExecutor` on Hugging Face Jobs."""

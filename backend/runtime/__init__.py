"""Code that runs inside a job: trainer entry point, LoRA-aware proxy, samplers, rewards, CPU fallbacks.

It imports nothing from the panel or the rest of `backend`: it is uploaded into the bucket with each run
(`runs/<run_id>/code/runtime/`) and started there with `python -m runtime.<module>`.
"""

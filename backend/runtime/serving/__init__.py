"""Code of the serving processes: a replica job's vLLM servers, the LoRA-aware proxy, and what they share."""

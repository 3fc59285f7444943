"""Backend of the GRPO panel: run specs, recipes, executors, bucket stores and run views. No Gradio here."""

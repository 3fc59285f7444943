"""The Gradio panel: turns user events into backend calls and RunView frames into plotly figures."""

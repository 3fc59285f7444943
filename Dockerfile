# The panel as a Docker Space (README front matter: `sdk: docker`, `app_port: 7860`) or on any container host.
# It installs the panel only (requirements.txt): runs go to Hugging Face Jobs, the image has no training runtime.
#   docker build -t grpo-panel . && docker run -p 7860:7860 grpo-panel
ARG BASE=python:3.11-slim
FROM ${BASE}
# Spaces run the container as user 1000; the panel's data (runs, caches, the webhook key) lives in its home.
RUN useradd -m -u 1000 user
WORKDIR /home/user/app
COPY --chown=user requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY --chown=user . .
USER user
ENV HOME=/home/user PYTHONUNBUFFERED=1 GRADIO_SERVER_NAME=0.0.0.0 PORT=7860 GRPO_PANEL_HOME=/home/user/data
EXPOSE 7860
CMD ["python", "app.py"]

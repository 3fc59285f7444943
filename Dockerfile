# The panel as a Docker Space (or any container host), serving on port 7860.
FROM python:3.11-slim
RUN useradd -m -u 1000 user
WORKDIR /home/user/app
COPY --chown=user requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY --chown=user . .
USER user
ENV GRADIO_SERVER_NAME=0.0.0.0 PORT=7860 GRPO_PANEL_HOME=/home/user/data
EXPOSE 7860
CMD ["python", "app.py"]

"""Runs as operations: launch, resume and cancel with their policy (`operations`), the run registry over an executor
(`registry`), who may see and do what (`access`, `hub_auth`, `directory`), and the background watch (budget cap,
alerts, orphans)."""

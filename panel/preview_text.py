"""What the launch form's preview says about the jobs: their engine, their cost, a sweep's members and fleet, its
early-stop rule and budget cap (Markdown, from a RunSpec or a sweep's preview; no I/O)."""


from backend.plan import recipe
from backend.plan.cost import format_usd
from backend.plan.jobspec import JobSpec
from backend.plan.shared_gpu import measured_reason, slower_warning
from backend.plan.spec import RunSpec
from backend.plan.task_spec import held_out_summary
from backend.runs.operations import CostEstimate, SweepPreview
from backend.runtime.tiny_model import benchmark_note
from backend.view.sweep import Halving
from panel.markdown import code_span, fenced, masked, plain


def jobs_cost_line(jobs: list[JobSpec], cost: CostEstimate) -> str:
    if cost.usd is None:
        return f"**Cannot estimate the cost:** {cost.problem}"
    per_job = ", ".join(f"{j.role} on {j.flavor}" for j in jobs)
    note = " (built-in price list: the Hub could not be asked)" if cost.fallback_prices else ""
    attempts = f" x {jobs[0].attempts} attempts (a retry can run its timeout again)" if jobs[0].attempts > 1 else ""
    return (f"Estimated cost at most **${cost.usd:.2f}**{note}: price per hour x timeout "
            f"({jobs[0].timeout_s // 60} min){attempts} for each job: {per_job}.")


def trackio_line(spec: RunSpec) -> str:
    """Where the run also logs to trackio, as the preview says it."""
    where = (f"the Space `{spec.trackio_space}` (created if need be)" if spec.trackio_space else
             f"the run's own folder `{spec.run_path}/trackio/` (`TRACKIO_DIR=<it> trackio show`)")
    return f"Also logs to trackio: project `{spec.trackio_project}`, run `{spec.name}`, in {where}."


FED_PER_SERVER = 64   # requests in flight a GPU server needs before a second one on its GPU pays (replica-scaling.md)


def distributed_engine(spec: RunSpec) -> str:
    """The replicas, their servers, and the requests in flight each server gets: more servers need more in flight."""
    servers = recipe.server_count(spec)
    per_job = servers // spec.replicas
    shape = (f"{spec.replicas} replica job(s) x {per_job} vLLM servers ({spec.servers_per_gpu} a GPU) = {servers}"
              if per_job > 1 else f"vLLM server x{spec.replicas}")
    per_server = spec.max_inflight_tasks / servers
    line = (f"{shape} behind the proxy (async GRPO); {spec.max_inflight_tasks} requests in flight "
            f"(max_inflight_tasks), {per_server:.0f} a server")
    if spec.servers_per_gpu > 1 and per_server < FED_PER_SERVER:
        line += (f" ⚠️ fewer than {FED_PER_SERVER} a server leave the added servers unfed: raise max_inflight_tasks "
                 f"to {FED_PER_SERVER * servers} or more")
    if spec.engine.replica_shares_trainer_gpu(spec):
        warning = slower_warning(spec)
        line += (f"; ⚠️ {warning}" if warning else
                 f"; the replicas share the trainer's GPU, so 1 server a GPU: {measured_reason()}")
    return line


def engine_label(spec: RunSpec) -> str:
    note = benchmark_note(spec.model)
    return _engine(spec) + (f"; model {note}" if note else "")


def _engine(spec: RunSpec) -> str:
    if spec.mode == "distributed":
        return distributed_engine(spec)
    if spec.use_vllm and spec.engine.chooses_hardware:
        sleep = "on" if spec.vllm_enable_sleep_mode else "off"
        return f"vLLM colocated (gpu_memory_utilization={spec.vllm_gpu_memory_utilization}, sleep mode {sleep})"
    if spec.use_vllm:
        return "vLLM colocated if the machine has a GPU, else transformers"
    return "transformers generate() (no vLLM)"


def sweep_markdown(shown: SweepPreview, labels: dict[str, str]) -> str:
    """A sweep's preview: its members (what sets each apart, its run id), the one fleet they need, what they can cost
    in all and the review code, then the first member's jobs (the others' differ only in their settings)."""
    base, sweep, fleet = shown.base, shown.sweep, shown.fleet
    swept = list(sweep.swept)
    heads = " | ".join(plain(labels.get(name, name)) + f" ({code_span(name)})" for name in swept)
    rows = "\n".join(f"| {p.spec.sweep_member} | `{p.spec.run_id}` | "
                     + " | ".join(masked(str(v)) for v in sweep.member_settings(p.spec).values()) + " |"
                     for p in shown.members)
    kind = "a grid of" if sweep.grid else "side by side,"
    head = (f"**Sweep `{sweep.sweep_id}`: {len(shown.members)} members** ({kind} {', '.join(swept)}), each an "
            f"ordinary distributed run (own folder, checkpoints, resume) of {len(shown.members[0].jobs)} job(s). "
            f"Engine: {engine_label(base)}.")
    table = f"| member | run id | {heads} |\n|---|---|{'---|' * len(swept)}\n{rows}"
    sizes = (f"`--max-loras {fleet.max_loras}` (each member's max_staleness + 2, summed), `--max-lora-rank "
             f"{fleet.max_lora_rank}` (the largest member's)")
    if shown.fleet_jobs:
        fleet_line = (f"**One fleet** for all members: {len(shown.fleet_jobs)} replica job(s) started once (run id "
                      f"`{shown.members[0].spec.fleet}`), each server with {sizes}; each member runs only its "
                      "trainer, whose proxy loads and serves only that member's adapter versions.")
    else:
        fleet_line = (f"**Fleet** all members need at once: {sizes}. Not shared on {engine_label(base)}: each "
                      f"member starts its own {base.replicas} replica(s).")
    lines = [head, table, fleet_line, *(f"⚠️ {note}" for note in fleet.notes), early_stop_line(sweep)]
    if shown.cost is not None:
        lines += [_sweep_cost_line(shown), sweep_budget_line(sweep, bool(shown.fleet_jobs))]
    first = shown.members[0]
    if first.expiry:
        lines.append(f"⚠️ Not launchable as it is: {first.expiry}")
    if first.note:
        lines.append(first.note)
    lines.append(held_out_summary(base))
    for job, command in zip(shown.fleet_jobs, shown.fleet_commands):
        lines.append(fenced(f"# fleet {job.role}\n{command}", "bash"))
    for job, command in zip(first.jobs, first.commands):
        lines.append(fenced(f"# m0 {job.role}\n{command}", "bash"))
    return "\n\n".join(line for line in lines if line)


def early_stop_line(sweep) -> str:
    """The sweep's stated early-stop rule, as its record keeps it and the Sweep tab carries it out."""
    if sweep.early_stop_after:
        return f"**Early stop:** {Halving(sweep.early_stop_after).text()}; each stop is recorded with the scores."
    return "**Early stop:** by hand only (the Sweep tab's *Stop this member*)."


def sweep_budget_line(sweep, fleet: bool) -> str:
    """What the preview says about the sweep's one budget cap (billed engines)."""
    over = "every member's jobs and the shared fleet's" if fleet else "every member's jobs"
    if not sweep.budget_usd:
        return (f"**Sweep budget cap:** none (give one to cap {over} together; each member's own *Budget cap* "
                "covers its own jobs only).")
    return (f"**Sweep budget cap {format_usd(sweep.budget_usd)}:** once the spend of {over} together reaches it, the "
            "panel cancels every member still running and then the fleet. Whichever panel process is running "
            "enforces it, as it does a run's cap (every 30 s by default, also after a restart); the job timeout stays "
            "the hard limit.")


def _sweep_cost_line(shown: SweepPreview) -> str:
    cost, n = shown.cost, len(shown.members)
    if cost.usd is None:
        return f"**Cannot estimate the cost:** {cost.problem}"
    note = " (built-in price list: the Hub could not be asked)" if cost.fallback_prices else ""
    return (f"Estimated cost of all {n} members at most **${cost.usd:.2f}**{note} (price per hour x timeout for each "
            f"member's jobs). Review code **`{shown.fingerprint}`**.")

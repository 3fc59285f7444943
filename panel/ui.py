"""The Gradio Blocks: a launch form, a runs list, and a live dashboard. Declarative; logic is in actions.py."""

import gradio as gr

from backend.spec import BUILTIN_DATASETS, BUILTIN_MODEL, BUILTIN_REWARDS, LORA_TARGET_CHOICES, RunSpec
from panel import dashboard
from panel.actions import Panel, full_log_file
from panel.presets import PRESETS, TINY_DEMO

TICK_S = 2.0
SCROLL_LOG_TO_END = ("() => { const t = document.querySelector('#log-box textarea'); "
                     "if (t) t.scrollTop = t.scrollHeight; }")
_D = RunSpec()


def _field(name: str, label: str, **kw):
    default = getattr(_D, name)
    info = kw.pop("info", None)
    if isinstance(default, bool):
        return gr.Checkbox(value=default, label=label, info=info, elem_id=f"f-{name}")
    if isinstance(default, list):
        return gr.CheckboxGroup(choices=kw.pop("choices"), value=default, label=label, info=info, elem_id=f"f-{name}")
    if "choices" in kw:
        return gr.Dropdown(choices=kw.pop("choices"), value=default, label=label, info=info, elem_id=f"f-{name}", **kw)
    if isinstance(default, int):
        return gr.Number(value=default, label=label, precision=0, info=info, elem_id=f"f-{name}")
    if isinstance(default, float):
        return gr.Number(value=default, label=label, info=info, elem_id=f"f-{name}")
    return gr.Textbox(value=default, label=label, info=info, elem_id=f"f-{name}", **kw)


def _flavor_choices(flavors) -> list[tuple[str, str]]:
    return [(f"{f.name} · {f.pretty} · ${f.price_per_hour_usd:.2f}/h", f.name) for f in flavors]


def _form(panel: Panel) -> dict[str, gr.components.Component]:
    f = {}
    with gr.Row():
        f["name"] = _field("name", "Run name")
        f["mode"] = gr.Radio(["colocated", "distributed"], value=_D.mode, label="Mode", elem_id="f-mode",
                             info="colocated: one job, vLLM inside the trainer · distributed: trainer + vLLM replicas")
        f["executor"] = gr.Radio(["local", "hf_jobs"], value=_D.executor, label="Run on", elem_id="f-executor",
                                 info="local processes on this machine, or Hugging Face Jobs")
    with gr.Row():
        f["model"] = _field("model", "Model", info=f"a local folder, a Hub id, or {BUILTIN_MODEL} (built on the spot)")
        f["dataset"] = gr.Dropdown(list(BUILTIN_DATASETS), value=_D.dataset, allow_custom_value=True, label="Dataset",
                                   elem_id="f-dataset", info="builtin prompt sets, or a Hub dataset id (HF Jobs)")
        f["rewards"] = _field("rewards", "Rewards", choices=list(BUILTIN_REWARDS))
    with gr.Accordion("LoRA", open=False):
        with gr.Row():
            f["lora_r"] = _field("lora_r", "Rank r")
            f["lora_alpha"] = _field("lora_alpha", "Alpha")
            f["lora_dropout"] = _field("lora_dropout", "Dropout")
        f["lora_target_modules"] = _field("lora_target_modules", "Target modules", choices=list(LORA_TARGET_CHOICES))
    with gr.Accordion("GRPO training", open=False):
        with gr.Row():
            for name, label in [("learning_rate", "Learning rate"), ("max_steps", "Steps"),
                                ("per_device_batch_size", "Batch size / device"),
                                ("num_generations", "Generations / prompt")]:
                f[name] = _field(name, label)
        with gr.Row():
            for name, label in [("max_completion_length", "Max completion tokens"), ("temperature", "Temperature"),
                                ("beta", "KL beta"), ("seed", "Seed")]:
                f[name] = _field(name, label)
        with gr.Row():
            f["adapter_every"] = _field("adapter_every", "Publish adapter every K steps")
            f["checkpoint_every"] = _field("checkpoint_every", "Checkpoint every K steps")
            f["logging_steps"] = _field("logging_steps", "Log every K steps")
    with gr.Accordion("vLLM (colocated)", open=False):
        with gr.Row():
            f["use_vllm"] = _field("use_vllm", "Generate with colocated vLLM",
                                   info="needs a GPU; on CPU the trainer generates with transformers")
            f["vllm_gpu_memory_utilization"] = _field("vllm_gpu_memory_utilization", "vLLM GPU memory share")
            f["vllm_enable_sleep_mode"] = _field(
                "vllm_enable_sleep_mode", "Sleep between generations",
                info="level 2: weights and KV cache freed; TRL re-syncs the weights after every step anyway")
        with gr.Row():
            f["vllm_tensor_parallel_size"] = _field("vllm_tensor_parallel_size", "Tensor parallel",
                                                    choices=[1, 2, 4, 8])
            f["num_processes"] = _field("num_processes", "Data-parallel processes")
    with gr.Accordion("Distributed (async GRPO)", open=False):
        with gr.Row():
            f["replicas"] = _field("replicas", "vLLM replicas")
            f["max_staleness"] = _field("max_staleness", "Max staleness", info="vLLM keeps max_staleness + 2 adapters")
            f["vllm_flavor"] = gr.Dropdown(_flavor_choices(panel.flavors()), value=_D.vllm_flavor,
                                           allow_custom_value=True, label="Replica flavor", elem_id="f-vllm_flavor")
        with gr.Row():
            f["max_tokens_per_batch"] = _field("max_tokens_per_batch", "Token budget / batch")
            f["max_inflight_tasks"] = _field("max_inflight_tasks", "Max in-flight tasks")
            f["queue_maxsize"] = _field("queue_maxsize", "Rollout queue size")
            f["gradient_checkpointing"] = _field("gradient_checkpointing", "Gradient checkpointing")
    with gr.Accordion("Hardware and storage", open=False), gr.Row():
        f["flavor"] = gr.Dropdown(_flavor_choices(panel.flavors()), value=_D.flavor, allow_custom_value=True,
                                  label="Trainer flavor", elem_id="f-flavor", info="HF Jobs hardware, price per hour")
        f["timeout_minutes"] = _field("timeout_minutes", "Timeout (minutes)")
        f["bucket"] = _field("bucket", "Bucket (namespace/name)")
        f["mount_path"] = _field("mount_path", "Mount path in every job")
    return f


def build_ui(panel: Panel) -> gr.Blocks:
    # Gradio keeps a copy of every file it serves (downloads); delete_cache drops copies older than a day, hourly.
    with gr.Blocks(title="GRPO + LoRA control panel", delete_cache=(3600, 86400)) as demo:
        with gr.Row():
            gr.Markdown("# GRPO + LoRA control panel\nLaunch GRPO runs with LoRA, colocated or distributed, "
                        "locally or on Hugging Face Jobs, and watch them live.")
            if panel.settings.on_space:
                gr.LoginButton()
        with gr.Tabs() as tabs:
            with gr.Tab("Launch", id="launch"):
                preset = gr.Dropdown(list(PRESETS), value=TINY_DEMO, label="Preset", elem_id="preset")
                form = _form(panel)
                names = list(form)
                with gr.Row():
                    preview_btn = gr.Button("Preview jobs", elem_id="preview-btn")
                    confirm = gr.Checkbox(False, label="I reviewed the jobs and the estimated cost (HF Jobs)",
                                          elem_id="confirm")
                    launch_btn = gr.Button("Launch", variant="primary", elem_id="launch-btn")
                launch_msg = gr.Markdown(elem_id="launch-msg")
            with gr.Tab("Runs", id="runs"):
                with gr.Row():
                    run_pick = gr.Dropdown([], label="Run", elem_id="run-pick", scale=3)
                    cancel_btn = gr.Button("Cancel run", variant="stop", elem_id="cancel-btn", scale=1)
                    resume_btn = gr.Button("Resume run", elem_id="resume-btn", scale=1)
                runs_table = gr.Dataframe(headers=["run", "executor", "jobs", "created"], interactive=False,
                                          elem_id="runs-table")
                action_msg = gr.Markdown(elem_id="action-msg")
                status = gr.Markdown(elem_id="run-status")
                with gr.Row():
                    reward_plot = gr.Plot(elem_id="reward-plot")
                    staleness_plot = gr.Plot(elem_id="staleness-plot")
                with gr.Row():
                    util_plot = gr.Plot(elem_id="util-plot")
                    memory_plot = gr.Plot(elem_id="memory-plot")
                with gr.Row():
                    kl_plot = gr.Plot(elem_id="kl-plot")
                    length_plot = gr.Plot(elem_id="length-plot")
                ratio_plot = gr.Plot(elem_id="ratio-plot")
                adapters = gr.Dataframe(headers=["adapter", "step", "published", "size (MB)", "on replicas", "note"],
                                        interactive=False, label="Adapter versions in the bucket",
                                        elem_id="adapters-table")
                replicas = gr.Dataframe(headers=["replica", "health", "in flight", "served", "errors", "adapters"],
                                        interactive=False, label="vLLM replicas (distributed runs)",
                                        elem_id="replicas-table")
                final_btn = gr.DownloadButton("Download final adapter (.zip)", interactive=False, elem_id="final-btn")
                with gr.Row():
                    log_role = gr.Dropdown(["trainer"], value="trainer", label="Job", elem_id="log-role", scale=1)
                    log_query = gr.Textbox(label="Search the log", elem_id="log-query", scale=3)
                    log_btn = gr.DownloadButton("Download full log", elem_id="log-btn", scale=1)
                log_box = gr.Textbox(label="Log (tail)", lines=16, max_lines=16, autoscroll=True, elem_id="log-box")
        timer = gr.Timer(TICK_S)
        drawn = gr.State(None)      # (run_id, RunView.version) this browser session last drew
        listed = gr.State(None)     # the runs table this browser session last received

        inputs = [form[n] for n in names]
        dash_outputs = [status, reward_plot, staleness_plot, util_plot, memory_plot, kl_plot, length_plot,
                        ratio_plot, adapters, replicas]

        def on_preset(choice):
            overrides = PRESETS[choice]
            return [gr.update(value=overrides[n]) if n in overrides else gr.skip() for n in names]

        def on_preview(*values):
            return panel.preview(dict(zip(names, values)))

        def on_launch(*values, oauth_token: gr.OAuthToken | None = None):
            token = oauth_token.token if oauth_token else None
            *values, confirmed = values
            message, run_id = panel.launch(dict(zip(names, values)), token, confirmed=confirmed)
            if run_id is None:
                return message, gr.skip(), gr.skip()
            return message, gr.update(choices=_run_choices(panel), value=run_id), gr.Tabs(selected="runs")

        def frame_outputs(view, role, query):
            frame = dashboard.build_frame(view)
            final = panel.final_adapter(view.run_id) if view.final_files else None
            roles = sorted(view.jobs)
            return [frame.status, frame.reward, frame.staleness, frame.utilisation, frame.memory, frame.kl,
                    frame.length, frame.ratio, frame.adapters, frame.replicas, dashboard.log_text(view, role, query),
                    gr.update(value=final, interactive=final is not None),
                    gr.update(choices=roles, value=role if role in roles else "trainer")]

        def on_tick(run_id, role, query, last, last_rows, oauth_token: gr.OAuthToken | None = None):
            token = oauth_token.token if oauth_token else None
            rows = panel.runs_table(token)
            # Re-send the runs table only when it changed: a re-render resets the table for the visitor.
            listed = [gr.skip(), gr.skip(), last_rows] if rows == last_rows else [
                rows, gr.update(choices=[r[0] for r in rows]), rows]
            skip = [gr.skip()] * (len(dash_outputs) + 3)
            if not run_id:
                return [*listed, *skip, last]
            try:
                view = panel.view(run_id, token)
            except KeyError:
                return [*listed, *skip, None]     # signed out, or not this visitor's run
            view.refresh()
            if last == (run_id, view.version):
                return [*listed, *skip, last]    # nothing new since this session last drew
            return [*listed, *frame_outputs(view, role, query), (run_id, view.version)]

        def on_select(run_id, role, query, oauth_token: gr.OAuthToken | None = None):
            if not run_id:
                return [*[gr.skip()] * (len(dash_outputs) + 3), None]
            try:
                view = panel.view(run_id, oauth_token.token if oauth_token else None)
            except KeyError as exc:
                return [str(exc), *[gr.skip()] * (len(dash_outputs) + 2), None]
            view.refresh()
            return [*frame_outputs(view, role, query), (run_id, view.version)]

        def on_log_filter(run_id, role, query, oauth_token: gr.OAuthToken | None = None):
            try:
                view = panel.view(run_id, oauth_token.token if oauth_token else None) if run_id else None
            except KeyError:
                view = None
            return dashboard.log_text(view, role, query) if view else ""

        def on_cancel(run_id, oauth_token: gr.OAuthToken | None = None):
            if not run_id:
                return "Pick a run first."
            return panel.cancel(run_id, oauth_token.token if oauth_token else None)

        preset.change(on_preset, preset, inputs)
        preview_btn.click(on_preview, inputs, launch_msg)
        launch_btn.click(on_launch, [*inputs, confirm], [launch_msg, run_pick, tabs])
        tick_outputs = [runs_table, run_pick, listed, *dash_outputs, log_box, final_btn, log_role, drawn]
        timer.tick(on_tick, [run_pick, log_role, log_query, drawn, listed], tick_outputs, show_progress="hidden")
        run_pick.change(on_select, [run_pick, log_role, log_query],
                        [*dash_outputs, log_box, final_btn, log_role, drawn])
        log_query.change(on_log_filter, [run_pick, log_role, log_query], log_box)
        log_role.change(on_log_filter, [run_pick, log_role, log_query], log_box)
        def on_full_log(run_id, role, oauth_token: gr.OAuthToken | None = None):
            if not run_id:
                return None
            try:
                return full_log_file(panel, run_id, role, oauth_token.token if oauth_token else None)
            except KeyError:
                return None

        log_btn.click(on_full_log, [run_pick, log_role], log_btn)
        # A tail is read from the bottom; the textbox's own autoscroll does not fire on timer updates here.
        log_box.change(None, None, None, js=SCROLL_LOG_TO_END)
        cancel_btn.click(on_cancel, run_pick, action_msg)

        def on_resume(run_id, oauth_token: gr.OAuthToken | None = None):
            if not run_id:
                return "Pick a run first."
            return panel.resume(run_id, oauth_token.token if oauth_token else None)

        resume_btn.click(on_resume, run_pick, action_msg)
        demo.load(lambda: gr.update(choices=_run_choices(panel)), None, run_pick)
    return demo


def _run_choices(panel: Panel) -> list[str]:
    return [r[0] for r in panel.runs_table()]

"""A run's notes and tags on its screen: read when the run is opened, saved into its folder with *Save notes*
(`Panel.save_notes`: who may cancel the run may write them). The runs list shows the tags and its filter matches
them. Handlers are plain functions (see `panel.page`)."""

import gradio as gr

from backend.runs.notes import MAX_NOTE_CHARS, MAX_TAGS


def build(page, panel) -> None:
    """The notes' controls (below the adapter versions), added to `page`."""
    with gr.Accordion("Notes and tags", open=False, elem_id="notes-section"):
        tags = gr.Textbox(label="Tags", elem_id="notes-tags", max_lines=1,
                          info=f"up to {MAX_TAGS}, separated by commas or spaces (baseline, lr-sweep); the runs "
                               "list shows them and its filter finds them")
        text = gr.Textbox(label="Notes", lines=3, max_length=MAX_NOTE_CHARS, elem_id="notes-text")
        save = gr.Button("Save notes", elem_id="notes-save", size="sm")
        message = gr.Markdown(elem_id="notes-msg")
    page.add(notes_tags=tags, notes_text=text, notes_save=save, notes_msg=message)


def wire(page) -> None:
    page.on(page["run_pick"].change, on_open, ["run_pick"], ["notes_tags", "notes_text", "notes_msg"],
            show_progress="hidden")
    page.on(page["notes_save"].click, on_save, ["run_pick", "notes_text", "notes_tags"], ["notes_tags", "notes_msg"])


def on_open(panel, visitor, run_id) -> dict:
    """The opened run's notes and tags, as saved."""
    try:
        notes = panel.run_notes(run_id, visitor) if run_id else None
    except KeyError:
        notes = None
    if notes is None:
        return {"notes_tags": "", "notes_text": "", "notes_msg": ""}
    return {"notes_tags": ", ".join(notes.tags), "notes_text": notes.text, "notes_msg": ""}


def on_save(panel, visitor, run_id, text, tags) -> dict:
    if not run_id:
        return {"notes_msg": "Pick a run first."}
    message = panel.save_notes(run_id, visitor, text, tags)
    out = {"notes_msg": message}
    if not message.startswith("**Notes not saved"):
        out["notes_tags"] = ", ".join(panel.run_notes(run_id, visitor).tags)     # as saved: '#' and repeats gone
    return out

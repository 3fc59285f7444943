"""A run's display name, notes and tags on its screen: read when the run is opened, saved into its folder with
*Rename* and *Save notes* (`Panel.rename_run`, `Panel.save_notes`: who may cancel the run may write them). The runs
list and the run's header show the name; the list shows the tags and its filter matches them. Handlers are plain
functions (see `panel.page`)."""

import gradio as gr

from backend.runs.notes import MAX_NAME_CHARS, MAX_NOTE_CHARS, MAX_TAGS

SECTION = "Name, notes and tags"


def build(page, panel) -> None:
    """The notes' controls (below the adapter versions), added to `page`."""
    with gr.Accordion(SECTION, open=False, elem_id="notes-section"):
        with gr.Row(equal_height=True):
            name = gr.Textbox(label="Name", elem_id="run-name", max_lines=1, scale=3,
                              info=f"what the runs list and the header call this run (up to {MAX_NAME_CHARS} "
                                   "characters of plain text; empty: the name it was launched with); its id stays")
            rename = gr.Button("Rename", elem_id="rename-btn", size="sm", scale=1)
        tags = gr.Textbox(label="Tags", elem_id="notes-tags", max_lines=1,
                          info=f"up to {MAX_TAGS}, separated by commas or spaces (baseline, lr-sweep); the runs "
                               "list shows them and its filter finds them")
        text = gr.Textbox(label="Notes", lines=3, max_length=MAX_NOTE_CHARS, elem_id="notes-text")
        save = gr.Button("Save notes", elem_id="notes-save", size="sm")
        message = gr.Markdown(elem_id="notes-msg")
    page.add(run_name=name, rename=rename, notes_tags=tags, notes_text=text, notes_save=save, notes_msg=message)


def wire(page) -> None:
    page.on(page["run_pick"].change, on_open, ["run_pick"], ["run_name", "notes_tags", "notes_text", "notes_msg"],
            show_progress="hidden")
    page.on(page["notes_save"].click, on_save, ["run_pick", "notes_text", "notes_tags"], ["notes_tags", "notes_msg"])
    page.on([page["rename"].click, page["run_name"].submit], on_rename, ["run_pick", "run_name"],
            ["run_name", "notes_msg"])


def on_open(panel, visitor, run_id) -> dict:
    """The opened run's name, notes and tags, as saved."""
    try:
        notes = panel.run_notes(run_id, visitor) if run_id else None
    except KeyError:
        notes = None
    if notes is None:
        return {"run_name": "", "notes_tags": "", "notes_text": "", "notes_msg": ""}
    return {"run_name": notes.name, "notes_tags": ", ".join(notes.tags), "notes_text": notes.text, "notes_msg": ""}


def on_save(panel, visitor, run_id, text, tags) -> dict:
    if not run_id:
        return {"notes_msg": "Pick a run first."}
    message = panel.save_notes(run_id, visitor, text, tags)
    out = {"notes_msg": message}
    if not message.startswith("**Notes not saved"):
        out["notes_tags"] = ", ".join(panel.run_notes(run_id, visitor).tags)     # as saved: '#' and repeats gone
    return out


def on_rename(panel, visitor, run_id, name) -> dict:
    if not run_id:
        return {"notes_msg": "Pick a run first."}
    message = panel.rename_run(run_id, visitor, name or "")
    out = {"notes_msg": message}
    if not message.startswith("**Not renamed"):
        out["run_name"] = panel.run_notes(run_id, visitor).name      # as saved: spaces around it gone
    return out

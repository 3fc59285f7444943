"""The Gradio Blocks: the Launch tab (`launch_view`), the Runs tab (`runs_view` and the open run's
`dashboard_view`), the Compare tab (`compare_view`) and the Sweep tab (`sweep_view`), assembled on one page
(`panel.page`). Declarative; the handlers are plain functions in those modules, over the backend and `panel/actions.py`.
"""

import json

import gradio as gr

from panel import cheap_skips, compare_view, dashboard_view, launch_view, runs_view, sweep_view, tick
from panel.actions import Panel
from panel.markdown import no_latex
from panel.page import Page, visitor_of

CACHE_SWEEP_S = 1800          # how often Gradio's cache (uploads, served copies of downloads) is swept
UPLOADS_KEPT_S = 2 * 3600     # how old a file there may get: an upload is gone within hours, not days
# A field the last preview or launch refused is marked until the next one (passed to launch(css=...)).
CSS = ".field-error { outline: 2px solid #dc2626; outline-offset: 2px; border-radius: 6px; }" + """
.jump-bar { font-size: 0.9em; } .jump-bar a { margin: 0 0.2em; }
#jump-bar { background: var(--background-fill-primary); padding: 4px 0; }
#jump-bar.pinned { position: fixed; top: 0; z-index: 50; box-shadow: 0 1px 4px rgba(0, 0, 0, 0.15); }
""" + ", ".join(f"#{target}" for target, _ in dashboard_view.SECTION_LINKS) + " { scroll-margin-top: 56px; }\n"
# A run's header stays a few short lines whatever it says (engine, alerts, verdict), so that its key charts stay on
# the first screen at 1440x900: its paragraphs close up as a status block's lines do, not as an article's.
CSS += """
#run-status, #run-cost { font-size: 0.92em; }
#run-status p, #run-cost p { margin: 0.1em 0 !important; line-height: 1.35; }
#run-status h3 { margin: 0 0 0.25em !important; }
#run-cost { margin-top: -12px; }
#action-msg { margin-top: -16px; }
#key-charts { margin-top: -8px; }
#jump-bar .html-container { padding: 0 !important; }
#jump-bar nav { line-height: 1.6; }
"""
# The charts follow the page's theme: plotly draws its white template with inline colours, which a dark page (Gradio's
# `.dark`, e.g. `?__theme=dark`) overrides here, on every redraw alike.
CSS += """
.dark .js-plotly-plot .main-svg { background: transparent !important; }
.dark .js-plotly-plot .bg { fill: #111827 !important; }
.dark .js-plotly-plot .main-svg text { fill: #e5e7eb !important; }
.dark .js-plotly-plot .gridlayer path, .dark .js-plotly-plot .zerolinelayer path { stroke: #374151 !important; }
.dark .js-plotly-plot .legend .bg { fill: transparent !important; }
"""
# On a phone's width plotly's toolbar (zoom, pan, download) covers the chart's lines and legend: hidden there; a chart
# still zooms by dragging and resets by a double tap.
CSS += """
@media (max-width: 640px) { .js-plotly-plot .modebar-container { display: none !important; } }
"""
# A jump bar's link scrolls to its section in place: followed, '#id' would resolve against the page's base address and
# reload the page without its `?run=`.
JUMP_TO_SECTION = """document.addEventListener('click', (e) => {
    const link = e.target instanceof Element ? e.target.closest('.jump-bar a') : null;
    const target = link && document.getElementById(link.getAttribute('href').slice(1));
    if (target) { e.preventDefault(); target.scrollIntoView({block: 'start'}); }
});
"""
# The jump bar stays at the top of the window once the page scrolls past it: pinned (fixed, at its own left and width)
# with a spacer of its height in its place, unpinned when that spot comes back. (CSS sticky does not hold here: one
# of Gradio's wrappers around the tab clips it.)
PIN_JUMP_BAR = """(() => {
    let spacer = null;
    const unpin = (bar) => {
        spacer.remove(); spacer = null;
        bar.classList.remove('pinned'); bar.style.left = bar.style.width = '';
    };
    const place = () => {
        const bar = document.getElementById('jump-bar');
        if (!bar) return;
        if (spacer && (spacer.getBoundingClientRect().top >= 0 || spacer.offsetParent === null)) unpin(bar);
        if (!spacer && bar.offsetParent !== null && bar.getBoundingClientRect().top < 0) {
            const r = bar.getBoundingClientRect();
            spacer = document.createElement('div');
            spacer.style.height = `${r.height}px`;
            bar.before(spacer);
            Object.assign(bar.style, {left: `${r.left}px`, width: `${r.width}px`});
            bar.classList.add('pinned');
        }
    };
    window.addEventListener('scroll', place, {passive: true});
    window.addEventListener('resize', () => {
        const bar = document.getElementById('jump-bar');
        if (bar && spacer) unpin(bar);
        place();
    });
})();
"""
# A zoom on one of the open run's charts zooms the others on the same kind of x axis (the figure's `meta.x_axis`:
# steps, wall time, dollars); a reset (double-click, autoscale) on one resets them all, as W&B and TensorBoard do.
# Gradio draws each chart with Plotly.react, which can start a chart afresh and drop its listeners: each chart's
# listener is tied to the event emitter it was added to, and added again where that has changed.
SYNC_X_RANGES = """(() => {
    const ids = PLOT_IDS;
    const hooked = new WeakMap();
    const kind = (gd) => (gd.layout && gd.layout.meta && gd.layout.meta.x_axis) || '';
    const charts = () => ids.map((id) => document.querySelector(`#${id} .js-plotly-plot`)).filter(Boolean);
    const follow = (source, change) => {
        for (const gd of charts()) {
            if (gd === source || kind(gd) !== kind(source) || !gd.layout.xaxis) continue;
            const axis = gd.layout.xaxis;
            if (change.reset ? axis.autorange === true
                : (axis.autorange === false && axis.range && axis.range[0] === change.range[0]
                   && axis.range[1] === change.range[1])) continue;     // already there: no echo back
            window.Plotly.relayout(gd, change.reset ? {'xaxis.autorange': true}
                                                    : {'xaxis.range': change.range.slice()});
        }
    };
    const onRelayout = (gd) => (event) => {
        if (!event) return;
        if (event['xaxis.autorange'] === true) return follow(gd, {reset: true});
        const range = event['xaxis.range'] || (event['xaxis.range[0]'] !== undefined
            ? [event['xaxis.range[0]'], event['xaxis.range[1]']] : null);
        if (range) follow(gd, {range: range});
    };
    const hook = () => {
        for (const gd of charts()) {
            if (gd._ev && typeof gd.on === 'function' && hooked.get(gd) !== gd._ev) {
                hooked.set(gd, gd._ev);
                gd.on('plotly_relayout', onRelayout(gd));
            }
        }
    };
    setInterval(hook, 500);
})();
""".replace("PLOT_IDS", json.dumps(dashboard_view.CHART_IDS))
# Gradio's dropdown takes Enter in an emptied box as "pick the first option": a required choice that was cleared
# must stay empty and be refused by the form's checks, not silently become the first dataset or flavor.
KEEP_CLEARED_CHOICES = """document.addEventListener('keydown', (e) => {
    const box = e.target;
    if (e.key === 'Enter' && box instanceof HTMLInputElement && box.closest('.required-choice')
        && box.value.trim() === '') { e.stopImmediatePropagation(); e.preventDefault(); box.blur(); }
}, true);
"""
# The page's own script (launch(js=...)).
PAGE_JS = "() => {\n" + KEEP_CLEARED_CHOICES + JUMP_TO_SECTION + PIN_JUMP_BAR + SYNC_X_RANGES + "}"


def build_ui(panel: Panel) -> gr.Blocks:
    cheap_skips.install()       # a tick's unchanged outputs cost every session nothing (see the module)
    page = Page(panel)
    # Gradio keeps a copy of every file it serves (downloads) and every file a visitor uploads: delete_cache drops
    # those older than UPLOADS_KEPT_S every CACHE_SWEEP_S. No usage analytics (app.py turns them off for the process).
    with gr.Blocks(title="GRPO + LoRA control panel", delete_cache=(CACHE_SWEEP_S, UPLOADS_KEPT_S),
                   analytics_enabled=False) as demo:
        with gr.Row():
            gr.Markdown("# GRPO + LoRA control panel\nLaunch GRPO runs with LoRA, colocated or distributed, "
                        "on this machine or on Hugging Face Jobs, and watch them live.")
            if panel.settings.on_space:
                gr.LoginButton()
        # Where visitors' code runs, or why it runs nowhere here: said once, for the whole page.
        gr.Markdown(panel.isolation(), elem_id="isolation")
        with gr.Tabs() as tabs:
            launch_view.build(page, panel)
            with gr.Tab("Runs", id="runs"):
                runs_view.build(page, panel)
                dashboard_view.build(page, panel)
                runs_view.build_orphans(panel)
            compare = compare_view.build(panel, visitor_of)
            sweep_view.build(page, panel)
        page.add(demo=demo, tabs=tabs, compare_picks=compare["picks"])
        tick.build(page)     # the fast timer, the idle check's (panel/tick.py)
        for view in (launch_view, runs_view, dashboard_view, sweep_view):
            view.wire(page)
    no_latex(demo)      # a visitor's `$$x$$` reads as itself, never as math
    return demo

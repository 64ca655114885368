() => {
  // Keyboard: S step, P play/pause, R run to end (or stop), N / B next / previous phase;
  // Ctrl+Enter (or Cmd+Enter) in the prompt steps.  Letters are ignored while typing in a field.
  const click = (id) => { const b = document.querySelector(`#${id}`); if (b && !b.disabled && b.offsetParent) b.click(); };
  document.addEventListener("keydown", (e) => {
    const el = e.target;
    const typing = el && (el.tagName === "TEXTAREA" || el.tagName === "INPUT" || el.isContentEditable);
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && el && el.closest && el.closest("#prompt")) {
      e.preventDefault(); click("step"); return;
    }
    if (typing || e.ctrlKey || e.metaKey || e.altKey) return;
    const key = e.key.toLowerCase();
    const map = {s: "step", p: "play", n: "phase-next", b: "phase-prev"};
    if (map[key]) { e.preventDefault(); click(map[key]); }
    if (key === "r") { e.preventDefault(); const stop = document.querySelector("#stop"); click(stop && stop.offsetParent ? "stop" : "run"); }
  });
  // Linked views: a click on a tree node or on a token writes into a hidden field, whose input event
  // the server answers (outline the node's matrix rows; move the history to the token's step).
  const send = (id, value) => {
    const box = document.querySelector(`#${id} textarea, #${id} input`);
    if (!box) return;
    box.value = `${value}:${Date.now()}`;
    box.dispatchEvent(new Event("input", {bubbles: true}));
  };
  document.addEventListener("click", (e) => {
    const tok = e.target.closest && e.target.closest("#output-text .tok[data-pos]");
    if (tok) send("token-pick", tok.dataset.pos);
  });
  const hook = () => {
    const plot = document.querySelector("#tree-plot .js-plotly-plot");
    if (plot && plot.on && !plot.dataset.trHooked) {
      plot.dataset.trHooked = "1";
      plot.on("plotly_click", (ev) => {
        const pt = ev.points && ev.points[0];
        if (pt && pt.customdata !== undefined && pt.customdata !== null) send("node-pick", pt.customdata);
      });
    }
  };
  // A step waiting in its queue: Gradio's text on the status line ("queue: 3/5", this event's place counted
  // from 1) becomes a sentence of ours under it; the panels stay as they are meanwhile.
  const waitNote = () => {
    const status = document.querySelector("#status");
    if (!status) return;
    let note = document.querySelector("#wait-note");
    if (!note) {
      note = document.createElement("div");
      note.id = "wait-note";
      note.setAttribute("role", "status");
      status.insertAdjacentElement("afterend", note);
    }
    const shown = status.querySelector(".progress-text");
    const queued = /queue:\s*(\d+)\s*\//.exec(shown ? shown.textContent : "");
    const ahead = queued ? Number(queued[1]) - 1 : 0;
    const place = ahead > 0 ? `${ahead} ahead of this one in the queue` : "this one is next in the queue";
    const text = queued ? `Waiting for the model: ${place}. The server runs only so many steps at once; ` +
      "this one follows in turn, and the panels stay as they are." : "";
    if (note.textContent !== text) {
      note.textContent = text;
      if (text) (window.trWaitNotes = window.trWaitNotes || []).push(text);  // read by the browser tests
      if (window.trWaitNotes && window.trWaitNotes.length > 50) window.trWaitNotes.shift();
    }
  };
  new MutationObserver(() => { hook(); waitNote(); }).observe(document.body, {childList: true, subtree: true, characterData: true});
  const status = document.querySelector("#status");
  if (status) { status.setAttribute("role", "status"); status.setAttribute("aria-live", "polite"); }
}

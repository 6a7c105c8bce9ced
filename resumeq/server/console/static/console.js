// resumeq console: the live parts of its pages. Text from jobs is untrusted: it is only
// ever set as textContent, never as HTML.
"use strict";

function refreshEvery(element) {
  // A server-rendered fragment, fetched again every few seconds.
  const url = element.dataset.refresh;
  const every = Number(element.dataset.every || 3000);
  const tick = async () => {
    try {
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (response.ok && !response.redirected) {
        element.innerHTML = await response.text();  // the server escaped every value
      }
    } catch (error) { /* offline for a moment: the next tick tries again */ }
  };
  setInterval(tick, every);
}

function followText(pre) {
  // The job's text as it grows, over its event stream; a new attempt that goes on from
  // the stored text is marked where it splices.
  const state = document.getElementById("job-state");
  let segment = pre.querySelector("span.seg:last-of-type");
  let since = segment ? segment.textContent.length : 0;
  let attempts = 0;
  const newSegment = () => {
    segment = document.createElement("span");
    segment.className = "seg";
    pre.appendChild(segment);
  };
  if (!segment) newSegment();
  const source = new EventSource(pre.dataset.events);
  source.addEventListener("delta", (event) => {
    const data = JSON.parse(event.data);
    segment.textContent += data.text;
    since += data.text.length;
    pre.dataset.revision = String(data.revision);
    pre.scrollTop = pre.scrollHeight;
  });
  source.addEventListener("tool_call", (event) => {
    // A call is sent once whole: its arguments as text, never as HTML.
    const data = JSON.parse(event.data);
    const list = document.getElementById("tool-calls");
    if (!list) return;
    const item = document.createElement("li");
    const name = document.createElement("code");
    name.className = "tool-name";
    name.textContent = data.name;
    const id = document.createElement("span");
    id.className = "hint";
    id.textContent = " " + data.id;
    const args = document.createElement("pre");
    args.className = "arguments";
    args.textContent = data.arguments;
    item.append(name, id, args);
    list.appendChild(item);
  });
  source.addEventListener("reset", () => {
    // The answer so far was not what was asked: it is asked again from the start.
    pre.textContent = "";
    newSegment();
    since = 0;
  });
  source.addEventListener("state", (event) => {
    const data = JSON.parse(event.data);
    if (state) {
      state.textContent = data.state;
      state.className = "state " + data.state;
    }
    if (data.state === "running") {
      attempts += 1;
      if (since > 0 && pre.textContent.length > 0) {
        const mark = document.createElement("mark");
        mark.className = "splice";
        mark.textContent = "↯";
        mark.title = "a later attempt goes on here";
        pre.appendChild(mark);
        newSegment();
        since = 0;
      }
    }
  });
  source.addEventListener("end", (event) => {
    source.close();
    const data = JSON.parse(event.data);
    if (state) {
      state.textContent = data.state;
      state.className = "state " + data.state;
    }
    pre.dataset.ended = data.state;
  });
}

function selectAllRows(box) {
  box.addEventListener("change", () => {
    for (const row of document.querySelectorAll("input[name=ids]")) row.checked = box.checked;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  for (const element of document.querySelectorAll("[data-refresh]")) refreshEvery(element);
  const text = document.querySelector("pre.text[data-events]");
  if (text) followText(text);
  const all = document.getElementById("all-rows");
  if (all) selectAllRows(all);
});

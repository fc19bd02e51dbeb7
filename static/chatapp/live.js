// The live chat: keyboard, Stop/Retry/queue actions over the websocket, busy state, auto-scroll,
// resuming after a reconnect. (chat.js keeps aria-current right after sidebar swaps.)
// htmx's ws extension does the socket and the swaps; this file only adds what htmx cannot do.
(function () {
  "use strict";

  const transcript = () => document.getElementById("transcript");
  const runningRuns = () => Array.from(document.querySelectorAll('#transcript .run[data-status="running"]'));
  let connections = 0;

  // Every (re)connect says what the page already shows, so the server sends only what it missed:
  // the newest run on the page, the runs it shows as running, the chat's name in the sidebar, what its
  // state panel was drawn from, and whether this is a reconnect. A new chat's landing connects to
  // /ws/new/ until its first message makes the chat, and to the chat's socket after that.
  const makeSocket = htmx.createWebSocket;
  htmx.createWebSocket = function (url) {
    const full = new URL(url, window.location.href);
    const app = document.getElementById("app");
    if (full.pathname === "/ws/new/" && app && app.dataset.currentSession) {
      full.pathname = `/ws/sessions/${app.dataset.currentSession}/`;  // the landing's socket made this chat
    }
    const runs = document.querySelectorAll("#transcript .run[data-run-id]");
    full.searchParams.set("last_run", runs.length ? runs[runs.length - 1].dataset.runId : "");
    const running = runningRuns().map((run) => run.dataset.runId).join(",");
    if (running) full.searchParams.set("running", running);
    const shown = document.querySelector(".session-link[aria-current=page]");
    if (shown) full.searchParams.set("shown_name", shown.closest(".session-item").dataset.name);
    const panel = document.getElementById("state-panel");
    if (panel) full.searchParams.set("panel", panel.dataset.stamp);
    if (connections++ > 0) full.searchParams.set("reconnect", "1");
    return makeSocket(full.toString());
  };

  // One hidden ws-send form carries Stop, Retry and queue actions.
  function act(type, fields) {
    const form = document.getElementById("live-action");
    if (!form) return;
    form.elements.type.value = type;
    form.elements.run_id.value = (fields && fields.run_id) || "";
    form.elements.queued_id.value = (fields && fields.queued_id) || "";
    if (form.elements.text) form.elements.text.value = (fields && fields.text) || "";
    form.requestSubmit();
  }

  function stop() {
    const running = runningRuns();
    act("stop", { run_id: running.length ? running[running.length - 1].dataset.runId : "" });
  }

  // While a reply is being written, the status line says so again every few seconds, unless
  // something else was said meanwhile: a polite live region is announced when its text changes, and
  // a long reply is otherwise silent for a screen reader user (LibreChat does the same).
  let stillTimer = null;
  function syncStillWriting(busy) {
    if (!busy) {
      clearInterval(stillTimer);
      stillTimer = null;
      return;
    }
    const line = document.getElementById("run-status");
    if (stillTimer || !line) return;
    let seen = line.textContent;
    let said = null;
    stillTimer = setInterval(() => {
      const now = line.textContent;
      if (now !== seen && now !== said) {  // a new status arrived during this interval: let it stand
        seen = now;
        return;
      }
      said = said === "Still writing the reply…" ? "Still writing the reply." : "Still writing the reply…";
      const span = document.createElement("span");
      span.className = "status-info";
      span.textContent = said;
      line.replaceChildren(span);
      seen = said;
    }, parseInt(line.dataset.stillEvery, 10) || 7000);
  }

  // Busy state follows the DOM: a run shown as running means Stop is on and the log is busy.
  function syncBusy() {
    const busy = runningRuns().length > 0;
    const log = transcript();
    if (log) log.setAttribute("aria-busy", busy ? "true" : "false");
    syncStillWriting(busy);
    const button = document.getElementById("stop-button");
    if (!button) return;
    if (!busy && document.activeElement === button) {
      const box = document.getElementById("composer-text");
      if (box) box.focus();  // do not leave focus on a button that disappears
    }
    button.hidden = button.disabled = !busy;
  }

  // Stay at the bottom while the user is there; leave them alone when they scrolled up to read.
  let pinned = true;
  function atBottom() {
    const box = transcript();
    return !box || box.scrollHeight - box.scrollTop - box.clientHeight < 48;
  }
  function toBottom() {
    const box = transcript();
    if (box) box.scrollTop = box.scrollHeight;
  }

  // The queue of waiting messages takes no room while it is empty.
  function syncQueue() {
    const queue = document.getElementById("queue");
    if (queue) queue.hidden = queue.children.length === 0;
  }

  document.addEventListener("keydown", (event) => {
    const box = event.target;
    if (box && box.id === "composer-text" && event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      if (box.value.trim()) box.form.requestSubmit();
    } else if (event.key === "Escape" && runningRuns().length && !event.defaultPrevented) {
      // Esc inside an open rename field cancels the rename instead (that handler prevents default).
      if (box && box.closest && box.closest(".rename-form")) return;
      event.preventDefault();
      stop();
    }
  });

  document.addEventListener("click", (event) => {
    const target = event.target.closest("#stop-button, .retry[data-run-id], .queued-cancel[data-queued-id]");
    if (!target) return;
    event.preventDefault();
    if (target.id === "stop-button") stop();
    else if (target.classList.contains("retry")) act("retry", { run_id: target.dataset.runId });
    else act("stop", { queued_id: target.dataset.queuedId });
  });

  // Branches: a new version of a reply, an edited message run again, another version shown.
  function editForm(runId) {
    return document.querySelector(`.edit-form[data-run-id="${CSS.escape(runId)}"]`);
  }
  function openEdit(runId) {
    const form = editForm(runId);
    if (!form) return;
    const said = form.closest(".user-message").querySelector(".message-text");
    form.elements.text.value = said ? said.textContent : "";  // filled here: the page holds the text once
    form.hidden = false;
    form.elements.text.focus();
    form.elements.text.select();
  }
  function closeEdit(form) {
    const focused = form.contains(document.activeElement);
    form.hidden = true;
    form.reset();
    const edit = form.closest(".user-message").querySelector(".edit-run");
    if (focused && edit) edit.focus();  // back to the button, shown again with the message
  }
  document.addEventListener("click", (event) => {
    const target = event.target.closest(".regenerate[data-run-id], .branch-switch[data-run-id], .edit-run, .edit-cancel");
    if (!target || target.disabled) return;
    event.preventDefault();
    if (target.classList.contains("regenerate")) act("regenerate", { run_id: target.dataset.runId });
    else if (target.classList.contains("branch-switch")) act("branch", { run_id: target.dataset.runId });
    else if (target.classList.contains("edit-run")) openEdit(target.dataset.runId);
    else closeEdit(target.closest(".edit-form"));
  });
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!form.classList || !form.classList.contains("edit-form")) return;
    event.preventDefault();
    const text = form.elements.text.value.trim();
    if (text) act("edit", { run_id: form.dataset.runId, text: text });
  });
  document.addEventListener("keydown", (event) => {
    const box = event.target;
    const form = box && box.closest && box.closest(".edit-form");
    if (form && event.key === "Escape") {
      event.preventDefault();
      closeEdit(form);
    } else if (form && event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    } else if (box && box.id === "composer-text" && event.key === "ArrowUp" && !box.value) {
      // Up in an empty composer edits your last message.
      const runs = document.querySelectorAll("#transcript .run .edit-run");
      if (runs.length) {
        event.preventDefault();
        openEdit(runs[runs.length - 1].dataset.runId);
      }
    } else if (event.altKey && (event.key === "r" || event.key === "R") && !runningRuns().length) {
      // Alt+R regenerates the last reply.
      const buttons = document.querySelectorAll("#transcript .run .regenerate");
      if (buttons.length) {
        event.preventDefault();
        act("regenerate", { run_id: buttons[buttons.length - 1].dataset.runId });
      }
    }
  });

  document.addEventListener("htmx:wsAfterSend", (event) => {
    const form = event.target;
    if (form && form.id === "composer") {
      form.reset();
      const box = document.getElementById("composer-text");
      if (box) box.focus();
      pinned = true;
      toBottom();
    }
  });

  // A streamed reply's frame (<template data-stream-run data-keep>, chatapp/markdown_stream.py): keep the
  // reply's first `keep` elements (its completed blocks), replace the rest (the open block) with the frame's
  // sanitized HTML. The reply then holds exactly what the finished reply's render will.
  function applyStreamFrame(message) {
    const holder = document.createElement("template");
    holder.innerHTML = message;
    const frame = holder.content.firstElementChild;
    const reply = frame && document.getElementById("reply-" + frame.dataset.streamRun);
    if (!reply) return;  // not on this page (yet): the run's fragment brings the text so far
    const keep = parseInt(frame.dataset.keep, 10) || 0;
    if (keep === 0) {
      reply.replaceChildren();
    } else {
      const cut = reply.children[keep];
      if (cut) {
        while (cut.nextSibling) cut.nextSibling.remove();
        cut.remove();
      }
    }
    reply.appendChild(frame.content);
  }

  function afterMessage() {
    syncBusy();
    syncQueue();
    if (pinned) toBottom();
  }

  document.addEventListener("htmx:wsBeforeMessage", (event) => {
    pinned = atBottom();
    const message = event.detail && event.detail.message;
    if (typeof message === "string" && message.startsWith("<template data-stream-run=")) {
      event.preventDefault();  // not an htmx swap: applied here
      applyStreamFrame(message);
      afterMessage();
    }
  });

  document.addEventListener("htmx:wsAfterMessage", afterMessage);

  // A run fragment for a run this page never saw (it started while the page loaded): append it.
  document.body.addEventListener("htmx:oobErrorNoTarget", (event) => {
    const content = event.detail && event.detail.content;
    const run = content && (content.matches(".run[id^='run-']") ? content : null);
    const log = transcript();
    if (run && log && !document.getElementById(run.id)) {
      log.appendChild(run);
      htmx.process(run);
    }
  });

  // The socket's state on the element that owns it: data-live="open" / "closed" (styles, tests).
  document.addEventListener("htmx:wsOpen", (event) => {
    event.target.dataset.live = "open";
    syncBusy();
  });
  document.addEventListener("htmx:wsClose", (event) => {
    event.target.dataset.live = "closed";
  });
  document.addEventListener("DOMContentLoaded", () => {
    syncBusy();
    syncQueue();
  });
})();

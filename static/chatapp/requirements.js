// Replies that wait for the user (templates/chatapp/_requirements.html): each card's answer (Approve or
// Reject with a note, the form's fields, a step's review) is checked in the page (the browser's own
// validation of the typed fields) and, once every card of the reply has one, sent over the chat's socket
// as one "answer" frame (chatapp/consumers.py); the reply then goes on in every tab. Also: Alt+A goes to
// the first request that waits, "Stop waiting" stops it, a note when a newer message sits below a
// request that still waits, and the tab's title marked while one waits.
(function () {
  "use strict";

  const MARK = "(Waiting) ";
  const answers = {};  // run id -> {requirement id: answer}, until the reply's last card is answered

  const waitingSections = () => Array.from(document.querySelectorAll("#transcript .requirements.is-waiting"));
  const openForms = (section) => Array.from(section.querySelectorAll(".requirement-form"))
    .filter((form) => !form.dataset.answered);

  // The frames go out through a ws-send form of the socket's own element, as the composer's do.
  function sendFrame(fields) {
    let form = document.getElementById("answer-action");
    const live = document.getElementById("live-action");
    if (!form) {
      if (!live) return false;
      form = document.createElement("form");
      form.id = "answer-action";
      form.hidden = true;
      form.setAttribute("ws-send", "");
      for (const name of ["type", "run_id", "answers"]) {
        const input = document.createElement("input");
        input.type = "hidden";
        input.name = name;
        form.appendChild(input);
      }
      live.after(form);
      htmx.process(form);
    }
    for (const [name, value] of Object.entries(fields)) form.elements[name].value = value;
    form.requestSubmit();
    return true;
  }

  function say(text) {
    const line = document.getElementById("run-status");
    if (!line) return;
    const span = document.createElement("span");
    span.className = "status-info";
    span.textContent = text;
    line.replaceChildren(span);
  }

  function fieldValue(control) {
    const value = control.value.trim();
    if (value === "") return null;
    const kind = control.dataset.fieldType;
    if (kind === "int") return parseInt(value, 10);
    if (kind === "float") return parseFloat(value);
    if (kind === "bool") return value === "true";
    return value;
  }

  function answerOf(form, decision) {
    const answer = { id: form.dataset.requirementId };
    if (decision === "approve" || decision === "reject") answer.approve = decision === "approve";
    if (form.elements.note && form.elements.note.value.trim()) answer.note = form.elements.note.value.trim();
    const input = {};
    for (const control of form.querySelectorAll("[data-field-type]")) {
      const value = fieldValue(control);
      if (value !== null) input[control.name] = value;
    }
    if (decision !== "reject") answer.input = input;
    return answer;
  }

  function showError(form, text) {
    const error = form.querySelector(".requirement-error");
    if (!error) return;
    error.textContent = text;
    error.hidden = !text;
  }

  document.addEventListener("submit", (event) => {
    const form = event.target.closest(".requirement-form");
    if (!form) return;
    event.preventDefault();
    const decision = event.submitter ? event.submitter.value : "send";
    // Approve and Send: every field as its schema types it (the browser has checked required fields,
    // numbers and steps before this event; a whole number is checked again, as some browsers take "2.5").
    if (decision !== "reject") {
      for (const control of form.querySelectorAll('[data-field-type="int"]')) {
        if (control.value.trim() && !/^-?\d+$/.test(control.value.trim())) {
          showError(form, `${control.name} must be a whole number.`);
          control.setAttribute("aria-invalid", "true");
          control.focus();
          return;
        }
        control.removeAttribute("aria-invalid");
      }
    }
    showError(form, "");
    const runId = form.dataset.runId;
    const section = form.closest(".requirements");
    (answers[runId] = answers[runId] || {})[form.dataset.requirementId] = answerOf(form, decision);
    form.dataset.answered = decision;
    for (const control of form.elements) control.disabled = true;
    const left = openForms(section);
    if (left.length) {  // the reply goes on once all its requests have an answer
      say(`Answer noted. ${left.length} more request${left.length > 1 ? "s" : ""} of this reply wait${left.length > 1 ? "" : "s"} for you.`);
      const next = left[0].querySelector("input, select, button");
      if (next) next.focus();
      return;
    }
    if (sendFrame({ type: "answer", run_id: runId, answers: JSON.stringify(Object.values(answers[runId])) })) {
      delete answers[runId];
      say("Sending your answer…");
    }
  });

  document.addEventListener("click", (event) => {
    const stop = event.target.closest(".requirement-stop[data-run-id]");
    if (!stop) return;
    event.preventDefault();
    const live = document.getElementById("live-action");
    if (!live) return;
    live.elements.type.value = "stop";
    live.elements.run_id.value = stop.dataset.runId;
    live.elements.queued_id.value = "";
    live.requestSubmit();
  });

  // Alt+A: to the first request that waits (its first field, else its Approve or Send button).
  document.addEventListener("keydown", (event) => {
    if (!(event.altKey && !event.ctrlKey && !event.metaKey && (event.key === "a" || event.key === "A" || event.code === "KeyA"))) return;
    for (const section of waitingSections()) {
      const form = openForms(section)[0];
      if (!form) continue;
      event.preventDefault();
      const target = form.querySelector("input:not([type=hidden]), select") || form.querySelector("button[type=submit]");
      target.scrollIntoView({ block: "center" });
      target.focus();
      return;
    }
  });

  // A newer message below a request that still waits: say so above the composer, with a link to it.
  function syncReminder() {
    const sections = waitingSections();
    const runs = document.querySelectorAll("#transcript .run[data-run-id]");
    const last = runs.length ? runs[runs.length - 1] : null;
    const earlier = sections.find((section) => last && !last.contains(section));
    let note = document.getElementById("waiting-reminder");
    const composer = document.getElementById("composer");
    if (!earlier) {
      if (note) note.hidden = true;
      return;
    }
    if (!note && composer) {
      note = document.createElement("p");
      note.id = "waiting-reminder";
      note.className = "waiting-reminder";
      note.setAttribute("role", "status");
      composer.before(note);
    }
    if (!note) return;
    const card = earlier.querySelector('.requirement-card[data-outcome="waiting"]');
    const link = document.createElement("a");
    link.href = "#" + (card ? card.id : earlier.id);
    link.textContent = "Go to it";
    link.addEventListener("click", (event) => {
      event.preventDefault();
      const target = card || earlier;
      target.scrollIntoView({ block: "center" });
      const control = target.querySelector("input, select, button");
      if (control) control.focus();
    });
    note.replaceChildren("An earlier request still waits for your answer. ", link);
    note.hidden = false;
  }

  // The tab's title says a reply of this chat waits for the user (chat.js sets the title itself).
  function syncTitle() {
    const waiting = waitingSections().length > 0;
    const title = document.title;
    if (waiting && !title.startsWith(MARK)) document.title = MARK + title;
    else if (!waiting && title.startsWith(MARK)) document.title = title.slice(MARK.length);
  }

  function sync() {
    syncReminder();
    syncTitle();
  }

  document.addEventListener("DOMContentLoaded", () => {
    sync();
    const title = document.querySelector("title");
    if (title) new MutationObserver(syncTitle).observe(title, { childList: true, characterData: true, subtree: true });
    const log = document.getElementById("transcript");
    if (log) new MutationObserver(sync).observe(log, { childList: true, subtree: true });
  });
})();

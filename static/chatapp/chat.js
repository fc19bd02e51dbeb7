// The little the page needs beyond htmx: inline rename keys, Ctrl/Cmd+K, toasts, pane toggles,
// code copy buttons, keeping aria-current right after live swaps, and not losing a state edit in progress.
(function () {
  "use strict";

  function currentSession() {
    var app = document.getElementById("app");
    return app ? app.dataset.currentSession : null;
  }

  // Rows pushed from other tabs are rendered without knowing which chat this tab shows.
  function markCurrent(root) {
    var id = currentSession();
    if (!id) return;
    (root || document).querySelectorAll(".session-item").forEach(function (item) {
      var link = item.querySelector(".session-link");
      if (!link) return;
      if (item.dataset.sessionId === id) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    });
  }

  // --- inline rename ---------------------------------------------------------------------------
  function openRename(item) {
    var form = item.querySelector(".rename-form");
    if (!form) return;
    item.classList.add("editing");
    form.hidden = false;
    var input = form.querySelector("input[name=name]");
    input.focus();
    input.select();
  }

  function closeRename(item) {
    var form = item.querySelector(".rename-form");
    var input = form.querySelector("input[name=name]");
    input.value = input.dataset.original || "";
    form.hidden = true;
    item.classList.remove("editing");
    var error = form.querySelector(".field-error");
    if (error) error.remove();
    var link = item.querySelector(".session-link");
    if (link) link.focus();
  }

  document.addEventListener("click", function (event) {
    var opener = event.target.closest(".rename-open");
    if (opener) { openRename(opener.closest(".session-item")); return; }
    var copy = event.target.closest(".copy-code");
    if (copy) {
      var code = copy.closest(".codeblock").querySelector("pre code");
      navigator.clipboard.writeText(code.innerText).then(function () {
        copy.textContent = "Copied";
        setTimeout(function () { copy.textContent = "Copy"; }, 1500);
      });
      return;
    }
    var close = event.target.closest(".toast-close");
    if (close) { close.closest(".toast").remove(); return; }
    var toggle = event.target.closest("[data-toggle]");
    if (toggle) {
      var pane = document.getElementById(toggle.dataset.toggle);
      var open = !pane.classList.contains("open");
      pane.classList.toggle("open", open);
      toggle.setAttribute("aria-expanded", String(open));
    }
  });

  // A double-click on a title renames it, so a single click follows the link only once it is
  // clear no second click is coming (the current chat's link never needs to navigate).
  var pendingNavigation = null;
  document.addEventListener("click", function (event) {
    var link = event.target.closest(".session-link");
    if (!link || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
    event.preventDefault();
    clearTimeout(pendingNavigation);
    if (event.detail > 1 || link.getAttribute("aria-current") === "page") return;
    pendingNavigation = setTimeout(function () { window.location.assign(link.href); }, 250);
  });

  document.addEventListener("dblclick", function (event) {
    var title = event.target.closest(".session-link");
    if (title) {
      event.preventDefault();
      clearTimeout(pendingNavigation);
      openRename(title.closest(".session-item"));
    }
  });

  document.addEventListener("keydown", function (event) {
    var input = event.target.closest && event.target.closest(".rename-form input");
    if (input && event.key === "Escape") {
      event.preventDefault();
      event.stopPropagation();
      closeRename(input.closest(".session-item"));
      return;
    }
    if ((event.ctrlKey || event.metaKey) && !event.altKey && event.key.toLowerCase() === "k") {
      var filter = document.getElementById("session-filter");
      if (filter) {
        event.preventDefault();
        document.getElementById("sidebar").classList.add("open");
        filter.focus();
        filter.select();
      }
    }
  });

  // --- toasts ----------------------------------------------------------------------------------
  function armToasts(root) {
    (root || document).querySelectorAll(".toast[data-timeout]:not([data-armed])").forEach(function (toast) {
      toast.dataset.armed = "1";
      setTimeout(function () { toast.remove(); }, parseInt(toast.dataset.timeout, 10));
    });
  }

  // --- a state edit in progress survives live panel updates --------------------------------------
  // The kept text is saved against the version it was based on, so the server refuses it as stale
  // (with a message) rather than silently overwriting what changed meanwhile. A panel sent while a
  // reply changes the state has no editor: the text waits for the next panel that has one.
  var pendingEdit = null;
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    if (!event.detail.target || event.detail.target.id !== "state-panel") return;
    var details = document.getElementById("state-edit");
    var textarea = document.getElementById("state-json");
    if (details && details.open && textarea && textarea.value !== textarea.defaultValue) {
      pendingEdit = {text: textarea.value, version: details.querySelector("input[name=version]").value};
    }
  });

  document.addEventListener("htmx:oobAfterSwap", function () {
    if (pendingEdit) {
      var details = document.getElementById("state-edit");
      if (details) {
        details.open = true;
        document.getElementById("state-json").value = pendingEdit.text;
        details.querySelector("input[name=version]").value = pendingEdit.version;
        pendingEdit = null;
      }
    }
  });

  document.addEventListener("htmx:afterSettle", function () {
    markCurrent();
    armToasts();
  });
  document.addEventListener("htmx:oobAfterSwap", function () {
    markCurrent();
    armToasts();
  });
  // A link to one run (a search hit: /s/<id>/#run-<run_id>) scrolls to it, loading earlier pages of
  // the transcript until it is there (at most 100 pages).
  var runPagesLoaded = 0, revealing = false;
  function revealLinkedRun() {
    var match = /^#(run-[\w-]+)$/.exec(window.location.hash);
    revealing = false;
    if (!match) return false;
    var run = document.getElementById(match[1]);
    if (run) {
      run.scrollIntoView({block: "center"});
      run.classList.add("linked");
      return true;
    }
    var earlier = document.querySelector("#transcript .load-earlier a");
    if (earlier && runPagesLoaded < 100) {
      runPagesLoaded += 1;
      revealing = true;
      htmx.trigger(earlier, "click");
    }
    return true;
  }
  document.addEventListener("htmx:afterSettle", function () {
    if (revealing) revealLinkedRun();
  });
  window.addEventListener("hashchange", function () { runPagesLoaded = 0; revealLinkedRun(); });

  document.addEventListener("DOMContentLoaded", function () {
    markCurrent();
    armToasts();
    var transcript = document.getElementById("transcript");
    if (revealLinkedRun()) return;
    if (transcript) transcript.scrollTop = transcript.scrollHeight;  // open at the newest message
  });
})();

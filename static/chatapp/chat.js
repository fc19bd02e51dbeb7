// The little the page needs beyond htmx: inline rename keys, the sidebar rows' menus, search by keyboard,
// the keyboard shortcuts and their help, toasts, the drawers and the state panel's fold, code copy buttons,
// keeping aria-current right after live swaps, drafts, and not losing a state edit in progress.
(function () {
  "use strict";

  // Sidebar rows and queued messages are pushed to every tab, and a tab may not show the one a
  // fragment replaces or removes (a row beyond the loaded pages, a new chat's first push): drop those
  // swaps here rather than have htmx report a missing target (htmx:oobErrorNoTarget) for each.
  var OPTIONAL_TARGET = /^(session-item|queued)-/;
  htmx.defineExtension("oob-if-present", {
    transformResponse: function (text) {
      if (text.indexOf('id="session-item-') < 0 && text.indexOf('id="queued-') < 0) return text;
      var holder = document.createElement("template");
      holder.innerHTML = text;
      leaveIfRemoved(holder);
      Array.from(holder.content.children).forEach(function (part) {
        var swap = part.getAttribute("hx-swap-oob");
        if (OPTIONAL_TARGET.test(part.id) && /^(true|delete|outerHTML)$/.test(swap || "true") &&
            !document.getElementById(part.id)) part.remove();
      });
      return holder.innerHTML;
    },
  });

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
  // A row's menu and rename form are made from the sidebar's templates when first opened, their
  // action URLs under the row's data-url (templates/chatapp/_row_actions.html).
  function fromTemplate(id, item) {
    var template = document.getElementById(id);
    if (!template) return null;
    var made = template.content.firstElementChild.cloneNode(true);
    var targets = Array.from(made.querySelectorAll("[data-action]"));
    if (made.matches("[data-action]")) targets.push(made);
    targets.forEach(function (element) {
      var url = item.dataset.url + element.dataset.action;
      if (element.tagName === "FORM") {
        element.action = url;
        element.setAttribute("hx-post", url);
      } else {
        element.href = url;
      }
    });
    return made;
  }
  function rowTitle(item) { return item.querySelector(".session-title").textContent; }
  function rowMenu(item) {
    var id = "row-menu-" + item.id.replace("session-item-", ""), menu = document.getElementById(id);
    if (menu || !(menu = fromTemplate("row-menu-template", item))) return menu;
    menu.id = id;
    menu.setAttribute("aria-label", rowTitle(item));
    var pinned = item.classList.contains("is-pinned");
    menu.querySelector("input[name=pinned]").value = pinned ? "0" : "1";
    menu.querySelector(".pin-label").textContent = pinned ? "Unpin" : "Pin";
    item.querySelector(".session-row").appendChild(menu);
    htmx.process(menu);
    return menu;
  }
  function renameForm(item) {
    var form = item.querySelector(".rename-form");
    if (form || !(form = fromTemplate("rename-form-template", item))) return form;
    var input = form.querySelector("input[name=name]");
    input.value = input.dataset.original = item.dataset.name || "";
    input.setAttribute("aria-label", "New title for " + rowTitle(item));
    item.appendChild(form);
    htmx.process(form);
    return form;
  }

  function openRename(item) {
    var form = renameForm(item);
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
      if (pane.classList.contains("open")) closeDrawers(true);
      else openDrawer(pane, true);
      return;
    }
    if (event.target.id === "backdrop") { closeDrawers(true); return; }
    var collapse = event.target.closest(".state-collapse");
    if (collapse) setStateCollapsed(collapse.getAttribute("aria-expanded") === "true", true);
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

  // Clicking away from an open rename saves a changed title, or cancels when nothing changed.
  document.addEventListener("focusout", function (event) {
    var input = event.target.closest && event.target.closest(".rename-form input[name=name]");
    if (!input || !input.isConnected) return;  // the row was just replaced (Enter saved it)
    var item = input.closest(".session-item");
    if (!item.classList.contains("editing") || item.dataset.saving) return;
    var value = input.value.trim();
    if (value && value !== (input.dataset.original || "")) input.form.requestSubmit();
    else if (!(event.relatedTarget && input.form.contains(event.relatedTarget))) {
      var form = input.form;
      input.value = input.dataset.original || "";
      form.hidden = true;
      item.classList.remove("editing");
    }
  });

  document.addEventListener("submit", function (event) {
    var form = event.target.closest && event.target.closest(".rename-form");
    if (form) form.closest(".session-item").dataset.saving = "1";
  }, true);

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
    // Enter saves (the form's own submit): the focus comes back to the renamed row's title, as after Esc,
    // rather than to the page when the row is replaced.
    if (input && event.key === "Enter" && !event.isComposing) refocusAfterSwap(input.closest(".session-item"), ".session-link");
    if ((event.ctrlKey || event.metaKey) && !event.altKey && event.key.toLowerCase() === "k") {
      var filter = document.getElementById("session-filter");
      if (filter) {
        event.preventDefault();
        openDrawer(document.getElementById("sidebar"), false);
        filter.focus();
        filter.select();
      }
    }
  });

  // --- toasts ----------------------------------------------------------------------------------
  // Armed whenever toasts may have arrived: after settles, after out-of-band swaps and on load. A toast
  // the pointer or the keyboard is on waits until it is left, so Undo is never pulled away mid-reach.
  function armToasts() {
    document.querySelectorAll(".toast[data-timeout]:not([data-armed])").forEach(function (toast) {
      toast.dataset.armed = "1";
      var wait = parseInt(toast.dataset.timeout, 10);
      var timer = setTimeout(function dismiss() {
        if (toast.matches(":hover, :focus-within")) { timer = setTimeout(dismiss, 1000); return; }
        toast.remove();
      }, wait);
    });
  }
  // A toast can come in a response whose own target leaves the page (the deleted row): htmx's settle
  // events then fire on a detached element and never reach the document, so watch the container.
  function watchToasts() {
    var box = document.getElementById("toasts");
    if (box) new MutationObserver(armToasts).observe(box, {childList: true});
  }

  // --- a state edit in progress survives live panel updates --------------------------------------
  // An editor open in this tab stays open when another tab's save or a reply sends a new panel: untouched,
  // it shows the new state; with changes, they are kept and saved against the version they were based on,
  // so the server refuses them as stale (with a message) rather than silently overwriting what changed
  // meanwhile. A panel sent while a reply changes the state has no editor: the editor waits for the next
  // panel that has one. The user's own save is not an edit in progress: its panel comes back over the
  // socket before the HTTP response, and keeping the text then would keep the old version, refusing the
  // next save as stale.
  var pendingEdit = null, savingText = null;
  document.addEventListener("htmx:beforeRequest", function (event) {
    if (event.target.closest && event.target.closest("#state-edit")) {
      var textarea = document.getElementById("state-json");
      savingText = textarea ? textarea.value : null;
    }
  });
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    if (!event.detail.target || event.detail.target.id !== "state-panel") return;
    var details = document.getElementById("state-edit");
    var textarea = document.getElementById("state-json");
    var saving = savingText !== null && textarea && textarea.value === savingText;
    savingText = null;
    if (!details || !details.open || !textarea || saving) return;
    pendingEdit = {text: null, version: null, height: textarea.style.height};
    if (textarea.value !== textarea.defaultValue) {
      pendingEdit.text = textarea.value;
      pendingEdit.version = details.querySelector("input[name=version]").value;
    }
  });

  document.addEventListener("htmx:oobAfterSwap", function () {
    var details = pendingEdit && document.getElementById("state-edit");
    if (!details) return;
    var textarea = document.getElementById("state-json");
    details.open = true;
    if (pendingEdit.text !== null) {
      textarea.value = pendingEdit.text;
      details.querySelector("input[name=version]").value = pendingEdit.version;
    }
    textarea.style.height = pendingEdit.height;  // the size the user dragged it to
    pendingEdit = null;
  });

  // --- the tab's title and the header follow the chat's title (a rename, a generated title) --------
  var SITE = " · Sessions chat";
  function syncTitle() {
    var id = currentSession();
    if (!id) return;
    var row = document.querySelector('.session-item[data-session-id="' + id + '"] .session-title');
    if (!row) return;
    var title = row.textContent.trim();
    if (document.title !== title + SITE) document.title = title + SITE;
    ["chat-title", "topbar-title"].forEach(function (headerId) {
      var header = document.getElementById(headerId);
      if (header && header.textContent !== title) header.textContent = title;
    });
  }

  // --- drafts: what is typed in the composer survives a reload and the chat going to the trash ------
  function draftKey(id) { return "chat-draft:" + id; }
  // A new chat (nothing stored yet) keeps its draft as "new".
  function draftId() {
    var app = document.getElementById("app");
    return currentSession() || (app && app.dataset.landing ? "new" : null);
  }
  function saveDraft() {
    var box = document.getElementById("composer-text"), id = draftId();
    if (!box || !id) return;
    try {
      if (box.value) sessionStorage.setItem(draftKey(id), box.value);
      else sessionStorage.removeItem(draftKey(id));
    } catch (e) { /* storage off: nothing to keep */ }
  }
  document.addEventListener("input", function (event) {
    if (event.target.id === "composer-text") saveDraft();
  });
  document.addEventListener("htmx:wsAfterSend", function (event) {
    if (event.target.id === "composer") {  // sent (a refused message comes back into the box, and is kept again)
      try { sessionStorage.removeItem(draftKey(draftId())); } catch (e) { /* nothing kept */ }
    }
  });
  function restoreDraft() {
    var app = document.getElementById("app"), box = document.getElementById("composer-text");
    if (!app || !box || box.disabled) return;
    try {
      var from = app.dataset.draftFrom;  // the chat this tab was on went to the trash: its draft moves here
      var text = sessionStorage.getItem(draftKey(draftId())) || "";
      if (from) {
        var carried = sessionStorage.getItem(draftKey(from));
        if (carried) text = text ? text + "\n" + carried : carried;
        sessionStorage.removeItem(draftKey(from));
      }
      if (text && !box.value) box.value = text;
      saveDraft();
    } catch (e) { /* storage off */ }
    if (from && window.history.replaceState) {  // ?deleted= did its job; a reload should not repeat the toast
      var url = new URL(window.location.href);
      url.searchParams.delete("deleted");
      window.history.replaceState(null, "", url.toString());
    }
  }

  // The open chat's row removed (it went to the trash, here or in another tab) and not put back (a row
  // moved to the top is removed and inserted in one message): go on to the next chat, taking the unsent
  // text along, with the Undo toast there.
  function leaveIfRemoved(holder) {
    var id = currentSession();
    var row = id && document.querySelector('.session-item[data-session-id="' + id + '"]');
    if (!row) return;
    var parts = holder.content.querySelectorAll('[id="' + row.id + '"]');
    if (parts.length === 1 && parts[0].getAttribute("hx-swap-oob") === "delete") {
      saveDraft();
      window.location.assign("/?deleted=" + encodeURIComponent(id));
    }
  }

  // "Load earlier messages" keeps the reader's place: the run at the top stays where it was.
  var keepPlace = null;
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target, log = document.getElementById("transcript");
    if (!log || !target || !target.classList.contains("load-earlier") || revealing) return;
    var anchor = target.nextElementSibling;
    if (anchor) keepPlace = {anchor: anchor, offset: anchor.getBoundingClientRect().top};
  });
  function restorePlace() {
    if (!keepPlace || !keepPlace.anchor.isConnected) return;
    var log = document.getElementById("transcript");
    log.scrollTop += keepPlace.anchor.getBoundingClientRect().top - keepPlace.offset;
    keepPlace = null;
  }

  document.addEventListener("htmx:afterSettle", function () {
    markCurrent();
    armToasts();
    syncTitle();
    restorePlace();
  });
  document.addEventListener("htmx:oobAfterSwap", function () {
    markCurrent();
    armToasts();
    syncTitle();
  });
  document.addEventListener("htmx:afterSwap", restorePlace);
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
    watchToasts();
    armToasts();
    syncTitle();
    restoreDraft();
    composerChanged();
    restoreStateCollapsed();
    focusComposer();
    var transcript = document.getElementById("transcript");
    if (revealLinkedRun()) return;
    if (transcript) transcript.scrollTop = transcript.scrollHeight;  // open at the newest message
  });

  // --- the composer, the skip link --------------------------------------------------------------
  function isPhone() { return window.matchMedia("(max-width: 800px)").matches; }
  function focusComposer() {
    // Not on a phone, where focusing the box would pull up the keyboard over the chat.
    var box = document.getElementById("composer-text");
    if (box && !box.disabled && !isPhone()) box.focus({preventScroll: true});
  }
  // The box grows with its text up to its CSS max-height, then scrolls; a reader at the newest message
  // stays there as it grows.
  function fitComposer(box) {
    var log = document.getElementById("transcript");
    var atEnd = log && log.scrollHeight - log.scrollTop - log.clientHeight < 48;
    box.style.height = "auto";  // back to its rows, to measure the text's own height
    box.style.height = box.scrollHeight + box.offsetHeight - box.clientHeight + "px";
    if (atEnd) log.scrollTop = log.scrollHeight;
  }
  // The length the server counts (chatapp/forms.py message_text): trimmed, in characters, not UTF-16 units.
  function messageLength(text) { return Array.from(text.trim()).length; }
  function numberText(value) { return value.toLocaleString("en"); }
  function messageLimit() {
    var count = document.getElementById("composer-count");
    return count ? parseInt(count.dataset.max, 10) || 0 : 0;
  }
  // From 90 % of the limit the count shows what is left (or how far over it is); the polite live region
  // says it once the typing pauses, rather than at every key.
  var countSaid = null;
  function countComposer(box) {
    var count = document.getElementById("composer-count"), max = messageLimit();
    if (!count || !max) return;
    var length = box.value.length < max * 0.9 ? 0 : messageLength(box.value);
    var text = "";
    if (length > max) text = numberText(length - max) + " characters over the limit of " + numberText(max);
    else if (length >= max * 0.9) text = numberText(max - length) + " characters left";
    count.hidden = !text;
    count.textContent = text;
    count.classList.toggle("over", length > max);
    clearTimeout(countSaid);
    countSaid = setTimeout(function () {
      var said = document.getElementById("composer-count-said");
      if (said && said.textContent !== text) said.textContent = text;
    }, 1000);
  }
  function composerChanged() {
    var box = document.getElementById("composer-text");
    if (!box) return;
    fitComposer(box);
    countComposer(box);
  }
  document.addEventListener("input", function (event) {
    if (event.target.id === "composer-text") composerChanged();
  });
  // Emptied once sent (live.js resets the form after this event): measured again after the reset.
  document.addEventListener("reset", function (event) {
    if (event.target.id === "composer") queueMicrotask(composerChanged);
  });
  window.addEventListener("resize", composerChanged);
  // A message over the limit is not sent: it stays in the box, and the status line says why (the server
  // would refuse it with the same words).
  document.addEventListener("submit", function (event) {
    var box = document.getElementById("composer-text"), max = messageLimit();
    if (event.target.id !== "composer" || !box || !max) return;
    var length = messageLength(box.value);
    if (length <= max) return;
    event.preventDefault();
    event.stopImmediatePropagation();  // before htmx's ws-send (or the new chat's post) sees it
    var line = document.getElementById("run-status"), note = document.createElement("span");
    note.className = "status-error";
    note.textContent = "The message is " + numberText(length) + " characters long; the limit is " + numberText(max) + ".";
    if (line) line.replaceChildren(note);
    box.focus();
  }, true);
  // A message the server did not take comes back in a new text box (out of band): kept as the draft,
  // measured, and focused again if the focus went with the old box.
  document.addEventListener("htmx:oobAfterSwap", function (event) {
    var box = event.target;
    if (!box || box.id !== "composer-text") return;
    saveDraft();
    composerChanged();
    if (!document.activeElement || document.activeElement === document.body) {
      box.focus();
      box.setSelectionRange(box.value.length, box.value.length);
    }
  });
  document.addEventListener("click", function (event) {
    if (!event.target.closest(".skip-link")) return;
    var box = document.getElementById("composer-text");
    if (box) { event.preventDefault(); closeDrawers(false); box.focus(); }
  });

  // --- a new chat: the assistant's description follows the pick, one send only --------------------
  document.addEventListener("change", function (event) {
    if (event.target.id !== "assistant-picker") return;
    var option = event.target.selectedOptions[0], line = document.getElementById("assistant-description");
    if (option && line) line.textContent = option.dataset.description || "";
  });
  // The first message went over the landing's socket: the server sends the chat's header (its id and URL),
  // composer and state pane out of band (chatapp/new_chats.py), and this page becomes the chat's page, the
  // reply streaming into it meanwhile. The socket, should it drop, reconnects as the chat's (live.js).
  document.addEventListener("htmx:wsAfterMessage", function () {
    var app = document.getElementById("app"), header = document.getElementById("chat-header");
    if (!app || !app.dataset.landing || !header || !header.dataset.sessionId) return;
    app.dataset.currentSession = header.dataset.sessionId;
    delete app.dataset.landing;
    var area = document.getElementById("session-area"), main = document.getElementById("main");
    if (area) area.classList.remove("landing");
    if (main) main.setAttribute("aria-label", "Conversation");  // as a chat's page names it
    window.history.replaceState(null, "", header.dataset.url);
    restoreStateCollapsed();
    markCurrent();
    syncTitle();
    var box = document.getElementById("composer-text");  // the new composer, where the old one had focus
    if (box && (!document.activeElement || document.activeElement === document.body)) box.focus();
  });

  // --- drawers (a phone's sidebar and state panel) and the state panel's fold (desktop) ------------
  function drawers() {
    return ["sidebar", "state-pane"].map(function (id) { return document.getElementById(id); })
      .filter(Boolean);
  }
  function setDrawer(pane, open) {
    pane.classList.toggle("open", open);
    document.querySelectorAll('[data-toggle="' + pane.id + '"]').forEach(function (button) {
      button.setAttribute("aria-expanded", String(open));
    });
  }
  function openDrawer(pane, moveFocus) {
    if (!pane) return;
    drawers().forEach(function (other) { if (other !== pane) setDrawer(other, false); });
    setDrawer(pane, true);
    var backdrop = document.getElementById("backdrop");
    if (backdrop) backdrop.hidden = !isPhone();
    if (moveFocus && isPhone()) {
      var first = pane.querySelector("a[href], button:not([disabled]), input, summary, textarea");
      if (first) first.focus();
    }
  }
  // Close the open drawer; with `focusToggle`, focus goes back to the button that opened it.
  function closeDrawers(focusToggle) {
    var opened = drawers().filter(function (pane) { return pane.classList.contains("open"); });
    opened.forEach(function (pane) { setDrawer(pane, false); });
    var backdrop = document.getElementById("backdrop");
    if (backdrop) backdrop.hidden = true;
    if (focusToggle && opened.length && isPhone()) {
      var toggle = document.querySelector('[data-toggle="' + opened[0].id + '"]');
      if (toggle) toggle.focus();
    }
    return opened.length > 0 && isPhone();
  }
  var STATE_FOLD = "chat-state-pane";
  function setStateCollapsed(collapsed, remember) {
    var area = document.querySelector(".session-area");
    if (!area || !document.getElementById("state-pane")) return;
    area.classList.toggle("state-collapsed", collapsed);
    document.querySelectorAll(".state-collapse").forEach(function (button) {
      button.setAttribute("aria-expanded", String(!collapsed));
      button.title = collapsed ? "Show the state panel" : "Hide the state panel";
    });
    if (remember) {
      try { localStorage.setItem(STATE_FOLD, collapsed ? "collapsed" : "open"); } catch (e) { /* storage off */ }
    }
  }
  function restoreStateCollapsed() {
    var folded = false;
    try { folded = localStorage.getItem(STATE_FOLD) === "collapsed"; } catch (e) { /* storage off */ }
    if (folded) setStateCollapsed(true, false);
  }
  window.matchMedia("(max-width: 800px)").addEventListener("change", function () { closeDrawers(false); });

  // --- one "more" menu per sidebar row ------------------------------------------------------------
  // Made for the row when first opened (rowMenu above), so rows pushed by htmx (renames, other tabs) get
  // theirs too. It is placed with fixed coordinates so the sidebar's scrolling box never clips it.
  var openMenu = null, refocusRow = null;
  function menuItems(menu) { return Array.from(menu.querySelectorAll('[role="menuitem"]')); }
  function placeMenu(button, menu) {
    var box = button.getBoundingClientRect();
    menu.style.top = "0px";
    menu.style.left = "0px";
    var width = menu.offsetWidth, height = menu.offsetHeight;
    var top = box.bottom + 2;
    if (top + height > window.innerHeight - 4) top = Math.max(4, box.top - height - 2);
    menu.style.top = top + "px";
    menu.style.left = Math.max(4, Math.min(box.right - width, window.innerWidth - width - 4)) + "px";
  }
  function openRowMenu(button, focusLast) {
    closeRowMenu(false);
    var menu = rowMenu(button.closest(".session-item"));
    if (!menu) return;
    menu.hidden = false;
    button.setAttribute("aria-expanded", "true");
    button.closest(".session-item").classList.add("menu-open");
    placeMenu(button, menu);
    openMenu = {button: button, menu: menu};
    var items = menuItems(menu);
    if (items.length) items[focusLast ? items.length - 1 : 0].focus();
  }
  function closeRowMenu(focusButton) {
    if (!openMenu) return false;
    var menu = openMenu.menu, button = openMenu.button;
    openMenu = null;
    menu.hidden = true;
    button.setAttribute("aria-expanded", "false");
    var item = button.closest(".session-item");
    if (item) item.classList.remove("menu-open");
    if (focusButton && button.isConnected) button.focus();
    return true;
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest(".row-menu-button");
    if (button) {
      var wasOpen = openMenu && openMenu.button === button;
      if (wasOpen) closeRowMenu(true);
      else openRowMenu(button, false);
      return;
    }
    var item = event.target.closest(".row-menu .menu-item");
    if (item) {
      if (item.form) {
        // After the action's swap, focus comes back to the row (or what replaced it) rather than the page.
        refocusAfterSwap(item.closest(".session-item"), ".row-menu-button");
        closeRowMenu(false);
      } else {
        closeRowMenu(!item.classList.contains("rename-open"));  // Rename has focused its field
      }
      return;
    }
    if (openMenu && !event.target.closest(".row-menu")) closeRowMenu(false);
  });
  document.addEventListener("keydown", function (event) {
    var button = event.target.closest && event.target.closest(".row-menu-button");
    if (button && (event.key === "ArrowDown" || event.key === "ArrowUp")) {
      event.preventDefault();
      openRowMenu(button, event.key === "ArrowUp");
      return;
    }
    if (!openMenu || !openMenu.menu.contains(event.target)) return;
    var items = menuItems(openMenu.menu), at = items.indexOf(document.activeElement);
    var moves = {ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: items.length - 1};
    if (event.key in moves) {
      event.preventDefault();
      items[(moves[event.key] + items.length) % items.length].focus();
    } else if (event.key === "Escape") {
      event.preventDefault();  // not a Stop of the reply
      event.stopPropagation();
      closeRowMenu(true);
    } else if (event.key === "Tab") {
      closeRowMenu(false);
    }
  });
  document.addEventListener("scroll", function (event) {
    if (openMenu && !openMenu.menu.contains(event.target)) closeRowMenu(false);
  }, true);
  window.addEventListener("resize", function () { closeRowMenu(false); });
  // A row's action replaces the row: once it has, the focus goes to `part` of the row that replaced it (or
  // to the open chat's link when the row is gone), unless it is somewhere on the page already.
  function refocusAfterSwap(row, part) { refocusRow = {row: row, part: part}; }
  // htmx:load, not afterSettle: the request's own element (the menu's form) may have left the page with
  // the swap, and its settle events then never reach the document; new content always fires load (after
  // the settle: the new row no longer wears the old one's classes, which may hide its parts).
  document.addEventListener("htmx:load", function () {
    if (openMenu && !openMenu.menu.isConnected) openMenu = null;  // its row was replaced
    if (!refocusRow || refocusRow.row.isConnected) return;  // other content; the row's swap is still to come
    var active = document.activeElement, part = refocusRow.part, row = document.getElementById(refocusRow.row.id);
    refocusRow = null;
    if (active && active !== document.body && active.isConnected) return;  // a refused title's own field, say
    var target = row && row.querySelector(part);
    if (target) target.focus();
    else if ((target = document.querySelector('.session-link[aria-current="page"]'))) target.focus();
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (refocusRow && !event.detail.successful && refocusRow.row.contains(event.detail.elt)) refocusRow = null;
  });

  // --- the chat list is one Tab stop: arrows move through it ----------------------------------------
  // One row's link is in the Tab order (the last one the keyboard was on, else the open chat's, else the
  // first); ↑/↓, Home and End move between rows, → reaches the row's "more" button (← comes back), and the
  // context-menu key or Shift+F10 opens the row's menu. Rows pushed live are taken in by syncRoving.
  function listLinks() {
    return Array.from(document.querySelectorAll(".session-nav .session-item:not([hidden]) .session-link"));
  }
  function syncRoving() {
    var links = listLinks();
    if (!links.length) return;
    var stop = links.find(function (link) { return link.getAttribute("tabindex") === "0"; }) ||
      links.find(function (link) { return link.getAttribute("aria-current") === "page"; }) || links[0];
    links.forEach(function (link) { link.setAttribute("tabindex", link === stop ? "0" : "-1"); });
    document.querySelectorAll(".session-nav .row-menu-button").forEach(function (button) {
      button.setAttribute("tabindex", "-1");
    });
  }
  function moveTo(link) {
    listLinks().forEach(function (other) { other.setAttribute("tabindex", other === link ? "0" : "-1"); });
    link.focus();
  }
  document.addEventListener("keydown", function (event) {
    var link = event.target.closest && event.target.closest(".session-nav .session-link");
    var more = !link && event.target.closest && event.target.closest(".session-nav .row-menu-button");
    if (more && event.key === "ArrowLeft") {
      event.preventDefault();
      moveTo(more.closest(".session-item").querySelector(".session-link"));
      return;
    }
    if (!link || event.altKey || event.ctrlKey || event.metaKey) return;
    var links = listLinks(), at = links.indexOf(link);
    var moves = {ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: links.length - 1};
    if (event.key in moves && !event.shiftKey) {
      event.preventDefault();
      var next = links[Math.max(0, Math.min(links.length - 1, moves[event.key]))];
      if (next) moveTo(next);
    } else if (event.key === "ArrowRight" && !event.shiftKey) {
      event.preventDefault();
      link.closest(".session-item").querySelector(".row-menu-button").focus();
    } else if (event.key === "ContextMenu" || (event.shiftKey && event.key === "F10")) {
      event.preventDefault();
      openRowMenu(link.closest(".session-item").querySelector(".row-menu-button"), false);
    }
  });
  document.addEventListener("focusin", function (event) {
    var link = event.target.closest && event.target.closest(".session-nav .session-link");
    if (link && link.getAttribute("tabindex") !== "0") moveTo(link);
  });
  document.addEventListener("htmx:load", syncRoving);
  document.addEventListener("DOMContentLoaded", syncRoving);

  // --- search by keyboard: arrows move through the hits, Enter opens one, Esc closes the search ------
  function searchLinks() {
    return Array.from(document.querySelectorAll("#session-filter-results .search-hit a, #session-filter-results .search-more a"));
  }
  function closeSearch() {
    var filter = document.getElementById("session-filter"), results = document.getElementById("session-filter-results");
    if (!filter || !results) return;
    var open = filter.value !== "" || results.children.length > 0;
    filter.value = "";
    results.replaceChildren();
    // As if typed: htmx's "input changed" trigger learns the empty value (typing the same query again
    // searches again), and a request still on its way is followed by the empty box.
    if (open) filter.dispatchEvent(new Event("input", {bubbles: true}));
    filter.focus();
    return open;
  }
  document.addEventListener("keydown", function (event) {
    var inFilter = event.target.id === "session-filter";
    var hit = !inFilter && event.target.closest && event.target.closest("#session-filter-results a");
    if (!inFilter && !hit) return;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      var links = searchLinks();
      if (!links.length) return;
      event.preventDefault();
      var next = (hit ? links.indexOf(hit) : -1) + (event.key === "ArrowDown" ? 1 : -1);
      if (next < 0) document.getElementById("session-filter").focus();
      else links[Math.min(next, links.length - 1)].focus();
    } else if (event.key === "Escape") {
      event.preventDefault();  // not a Stop of the reply
      if (!closeSearch() && inFilter) closeDrawers(true);  // Esc in an empty search closes a phone's drawer
    }
  });

  // --- keyboard shortcuts and their help ----------------------------------------------------------
  function typing(target) {
    return target && target.closest && target.closest("input, textarea, select, [contenteditable]");
  }
  function shortcutsDialog() { return document.getElementById("shortcuts"); }
  function openShortcuts() {
    var dialog = shortcutsDialog();
    if (dialog && !dialog.open) { closeRowMenu(false); dialog.showModal(); }
  }
  document.addEventListener("click", function (event) {
    if (event.target.closest(".shortcuts-open")) { openShortcuts(); return; }
    var dialog = shortcutsDialog();
    // The close button, or a click on the dialog's backdrop (the dialog itself, outside its content).
    if (dialog && dialog.open && (event.target.closest(".shortcuts-close") || event.target === dialog)) dialog.close();
  });
  document.addEventListener("keydown", function (event) {
    var dialog = shortcutsDialog();
    if (dialog && dialog.open) {
      if (event.key === "Escape") { event.preventDefault(); dialog.close(); }  // closed here: no Stop behind it
      return;
    }
    var ctrl = event.ctrlKey || event.metaKey;
    if ((ctrl && event.key === "/") || (event.key === "?" && !ctrl && !event.altKey && !typing(event.target))) {
      event.preventDefault();
      openShortcuts();
    } else if ((event.altKey && !ctrl && event.code === "KeyN") || (ctrl && event.shiftKey && event.code === "KeyO")) {
      var link = document.querySelector(".new-chat");
      if (link) { event.preventDefault(); window.location.assign(link.href); }
    } else if (event.key === "Escape" && event.shiftKey) {
      event.preventDefault();  // focus, never a Stop
      closeDrawers(false);
      var box = document.getElementById("composer-text");
      if (box) box.focus();
    } else if (event.key === "Escape" && !event.defaultPrevented && closeDrawers(true)) {
      event.preventDefault();  // an open drawer closes first; the next Esc stops a reply
    }
  });
})();

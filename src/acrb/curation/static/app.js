// Keyboard shortcuts for the curation pages. Everything works without this file.
"use strict";

(function () {
  const TEXT_INPUTS = new Set(["text", "password", "search", "email", "url", "number", "tel"]);

  function typing(target) {
    if (!(target instanceof HTMLElement)) {
      return false;
    }
    if (target.isContentEditable || target.tagName === "TEXTAREA" || target.tagName === "SELECT") {
      return true;
    }
    return target.tagName === "INPUT" && TEXT_INPUTS.has((target.type || "text").toLowerCase());
  }

  function go(url) {
    if (url) {
      window.location.assign(url);
    }
  }

  function submitWith(action) {
    const button = document.querySelector('form.decide button[name="action"][value="' + action + '"]');
    if (button && button.form) {
      button.form.requestSubmit(button);
    }
  }

  function toggleCriteria() {
    const boxes = Array.from(document.querySelectorAll("fieldset.criteria input[type=checkbox]"));
    const all = boxes.length > 0 && boxes.every(function (box) { return box.checked; });
    boxes.forEach(function (box) { box.checked = !all; });
  }

  function choose(number) {
    const radios = document.querySelectorAll('form.decide input[type=radio][name="candidate_id"]');
    const radio = radios[number - 1];
    if (radio) {
      radio.checked = true;
      radio.focus();
    }
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) {
      return;
    }
    const page = document.body.dataset.page;
    const nav = document.body.dataset;
    const key = event.key;
    let handled = true;
    if (page === "cell" && key >= "1" && key <= "9") {
      choose(Number(key));
    } else if (page === "cell" && key === "a") {
      toggleCriteria();
    } else if (page === "cell" && key === "s") {
      submitWith("select");
    } else if (page === "cell" && key === "x") {
      submitWith("reject");
    } else if (page === "cell" && key === "/") {
      const box = document.getElementById("rationale");
      if (box) {
        box.focus();
      }
    } else if (key === "n" && (page === "cell" || page === "grid")) {
      go(nav.next);
    } else if (key === "p" && page === "cell") {
      go(nav.prev);
    } else if (key === "g" && page === "cell") {
      go(nav.grid || "/");
    } else {
      handled = false;
    }
    if (handled) {
      event.preventDefault();
    }
  });
})();

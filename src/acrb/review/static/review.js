// Keyboard answers for the rating page. Everything works without this file (a plain form).
"use strict";

(function () {
  const form = document.querySelector("form.rate");
  if (!form) {
    return;
  }
  const groups = Array.from(form.querySelectorAll("fieldset.axis"));
  const started = performance.now();
  let current = 0;

  function answered(group) {
    return group.querySelector("input[type=radio]:checked") !== null;
  }

  function mark(index) {
    current = Math.max(0, Math.min(index, groups.length - 1));
    groups.forEach(function (group, at) {
      group.classList.toggle("current", at === current);
    });
    groups[current].scrollIntoView({ block: "nearest" });
  }

  function answer(value) {
    const radio = groups[current].querySelector('input[type=radio][value="' + value + '"]');
    if (!radio) {
      return;
    }
    radio.checked = true;
    // On to the next question still open after this one, else simply the next one.
    let next = groups.findIndex(function (group, at) { return at > current && !answered(group); });
    if (next < 0) {
      next = current + 1;
    }
    mark(next);
  }

  groups.forEach(function (group, at) {
    group.addEventListener("focusin", function () { mark(at); });
    group.addEventListener("click", function () { mark(at); });
  });

  form.addEventListener("submit", function () {
    form.elements.namedItem("duration_ms").value = String(Math.round(performance.now() - started));
  });

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) {
      return;
    }
    const target = event.target;
    if (target instanceof HTMLElement && (target.tagName === "BUTTON" || target.tagName === "A")) {
      return;
    }
    const key = event.key;
    if (key >= "1" && key <= "5" && key.length === 1) {
      answer(key);
    } else if (key === "0") {
      answer("cannot_tell");
    } else if (key === "Enter") {
      form.requestSubmit();
    } else {
      return;
    }
    event.preventDefault();
  });

  const first = groups.findIndex(function (group) { return !answered(group); });
  mark(first < 0 ? 0 : first);
})();

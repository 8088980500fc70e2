// Focus view keyboard: a label's key selects it, "/" focuses the note, "n" saves and moves on, "s" skips.
// Keys typed into a field stay in the field; Escape leaves it.
(function () {
  const form = document.getElementById("ann-focus-form");
  if (!form) return;
  const skip = document.getElementById("ann-skip-form");
  const byKey = {};
  form.querySelectorAll(".ann-choice[data-key]").forEach((el) => {
    if (el.dataset.key) byKey[el.dataset.key] = el.querySelector("input");
  });
  document.addEventListener("keydown", (ev) => {
    const t = ev.target;
    const typing = t && (t.tagName === "TEXTAREA" || (t.tagName === "INPUT" && t.type !== "radio") || t.tagName === "SELECT" || t.isContentEditable);
    if (typing) {
      if (ev.key === "Escape") t.blur();
      return;
    }
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    if (byKey[ev.key]) {
      byKey[ev.key].checked = true;
      byKey[ev.key].focus();
      ev.preventDefault();
    } else if (ev.key === "n") {
      ev.preventDefault();
      form.requestSubmit();
    } else if (ev.key === "s") {
      ev.preventDefault();
      skip.requestSubmit();
    } else if (ev.key === "/") {
      ev.preventDefault();
      document.getElementById("ann-note").focus();
    }
  });
})();

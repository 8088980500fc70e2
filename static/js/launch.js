// The launch form's summary: what will run, rebuilt from the form's own values on every change, so the
// last look before "Launch" shows the model, data, length, weights and every value changed from its default.
(function () {
  "use strict";
  var form = document.getElementById("launch-form");
  var list = document.getElementById("launch-summary-list");
  if (!form || !list) return;

  function value(el) {
    if (el.type === "checkbox") return el.checked ? "yes" : "no";
    if (el.tagName === "SELECT") return el.options[el.selectedIndex] ? el.options[el.selectedIndex].text : "";
    return el.value;
  }
  function initial(el) {
    if (el.type === "checkbox") return el.defaultChecked ? "yes" : "no";
    if (el.tagName === "SELECT") {
      for (var i = 0; i < el.options.length; i++) if (el.options[i].defaultSelected) return el.options[i].text;
      return el.options[0] ? el.options[0].text : "";
    }
    return el.defaultValue;
  }
  function label(el) {
    var l = form.querySelector('label[for="' + el.id + '"]');
    return l ? l.textContent : el.name;
  }
  function row(term, text) {
    var dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = term;  // textContent: names and values are never parsed as markup
    dd.textContent = text;
    list.appendChild(dt);
    list.appendChild(dd);
  }
  function field(name) { return form.elements[name]; }

  function render() {
    list.textContent = "";
    ["name", "environment", "base_model", "parent"].forEach(function (n) {
      var el = field(n);
      if (el && el.value) row(label(el), value(el));  // an empty select ("---------") is not shown
    });
    var steps = field("cfg_max_steps");
    if (steps) row("steps", steps.value);
    var weights = Array.prototype.filter.call(form.elements, function (el) { return el.name.indexOf("weight_") === 0; });
    if (weights.length) row("reward weights", weights.map(function (el) { return label(el) + " " + el.value; }).join(", "));
    var changed = Array.prototype.filter.call(form.elements, function (el) {
      return el.name && el.name.indexOf("cfg_") === 0 && el.name !== "cfg_max_steps" && value(el) !== initial(el);
    });
    row("changed", changed.length ? changed.map(function (el) { return label(el) + " = " + value(el); }).join(", ")
                                  : "nothing else (defaults)");
  }
  // Reward weights are per environment: another environment reloads the form with its components.
  var env = field("environment");
  if (env && form.querySelector('[name^="weight_"]')) {
    env.addEventListener("change", function () {
      var url = new URL(window.location.href);
      url.searchParams.set("environment", env.value);
      url.searchParams.set("base_model", "tiny:" + env.value);
      window.location.href = url.toString();
    });
  }
  form.addEventListener("input", render);
  form.addEventListener("change", render);
  render();
})();

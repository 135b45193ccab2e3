// The front end of flowmagic.jupyter.controls.Controls (an anywidget module).
// A click sends one message holding the action and what every dropdown shows and every
// text field holds at that moment, so the kernel acts on what the user saw even when the
// widget's own change is still held back by ipywidgets (it sends one change at a time per
// widget). Option texts, labels and field texts are set as text, never as markup.

function labelled(className, control) {
  const box = document.createElement("div");
  box.className = `${className} widget-inline-hbox`;
  const label = document.createElement("label");
  label.className = "widget-label";
  box.append(label, control);
  return { box, label };
}

function pickerView(model, name, selects) {
  const select = document.createElement("select");
  const { box, label } = labelled("flowmagic-picker widget-dropdown", select);
  selects.set(name, select);
  const spec = () => (model.get("pickers") || {})[name] || { options: [] };
  const show = () => {
    const { label: text, width, options } = spec();
    label.textContent = text || "";
    box.style.width = width || "";
    const texts = options.map((o) => String(o[0]));
    if (texts.join("\u0000") !== [...select.options].map((o) => o.textContent).join("\u0000")
        || texts.length !== select.options.length) {
      select.replaceChildren(...texts.map((t, i) => {
        const option = document.createElement("option");
        option.value = String(i);
        option.textContent = t;
        return option;
      }));
    }
    const want = JSON.stringify((model.get("choices") || {})[name] ?? null);
    select.selectedIndex = options.findIndex((o) => JSON.stringify(o[1]) === want);
  };
  select.addEventListener("change", () => {
    const option = spec().options[select.selectedIndex];
    model.set("choices", { ...model.get("choices"), [name]: option ? option[1] : null });
    model.save_changes();
  });
  return { box, show };
}

function fieldView(model, name, inputs) {
  const input = document.createElement("input");
  input.type = "text";
  const { box, label } = labelled("flowmagic-field widget-text", input);
  inputs.set(name, input);
  const show = () => {
    const spec = (model.get("fields") || {})[name] || {};
    label.textContent = spec.label || "";
    box.style.width = spec.width || "";
    input.placeholder = spec.placeholder || "";
    const value = (model.get("choices") || {})[name];
    // what the user is typing stays: the kernel's copy may be a change or two behind
    if (document.activeElement !== input) input.value = typeof value === "string" ? value : "";
  };
  input.addEventListener("input", () => {
    model.set("choices", { ...model.get("choices"), [name]: input.value });
    model.save_changes();
  });
  return { box, show };
}

function buttonView(model, name, selects, inputs) {
  const button = document.createElement("button");
  button.className = "jupyter-widgets jupyter-button widget-button";
  const show = () => {
    const spec = (model.get("buttons") || {})[name] || {};
    button.replaceChildren();
    if (spec.icon) {
      const icon = document.createElement("i");
      icon.className = `fa fa-${spec.icon}`;
      button.append(icon);
    }
    button.append(document.createTextNode(spec.label || ""));
    button.title = spec.tip || "";
    button.disabled = Boolean(spec.disabled);
  };
  button.addEventListener("click", () => {
    const pickers = model.get("pickers") || {};
    const choices = {};
    for (const [picker, select] of selects) {
      const option = (pickers[picker] || { options: [] }).options[select.selectedIndex];
      choices[picker] = option ? option[1] : null;
    }
    for (const [field, input] of inputs) choices[field] = input.value;
    model.send({ action: name, choices });
  });
  return { box: button, show };
}

function render({ model, el }) {
  el.classList.add("flowmagic-controls");
  let parts = [];
  const build = () => {
    const selects = new Map(), inputs = new Map();
    const views = { picker: pickerView, field: fieldView, button: buttonView };
    parts = [];
    el.replaceChildren(...(model.get("rows") || []).map((row) => {
      const line = document.createElement("div");
      line.className = "flowmagic-row";
      for (const item of row) {
        const [kind, name] = item.split(":");
        const part = views[kind](model, name, kind === "field" ? inputs : selects, inputs);
        parts.push(part);
        line.append(part.box);
      }
      return line;
    }));
    update();
  };
  const update = () => {
    const hidden = model.get("hidden") || [];
    [...el.children].forEach((line, i) => {
      line.style.display = hidden.includes(i) ? "none" : "";
    });
    parts.forEach((part) => part.show());
  };
  const shown = ["hidden", "fields", "pickers", "choices", "buttons"];
  model.on("change:rows", build);
  shown.forEach((name) => model.on(`change:${name}`, update));
  build();
  return () => {
    model.off("change:rows", build);
    shown.forEach((name) => model.off(`change:${name}`, update));
  };
}

export default { render };

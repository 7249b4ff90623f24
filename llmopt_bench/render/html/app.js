// llmopt's report viewer: lays out the page's data (the JSON block #llmopt-data) with the DOM and
// plotly.js. Every string from the run is set with textContent, never parsed as markup.
"use strict";
(function () {
  const page = JSON.parse(document.getElementById("llmopt-data").textContent);
  const plots = [];

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function cell(v) {
    if (v === null || v === undefined) return "-";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v === "number") {
      if (Number.isInteger(v)) return String(v);
      const a = Math.abs(v);
      return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : String(Number(v.toPrecision(4)));
    }
    if (Array.isArray(v)) return v.map(cell).join(", ");
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  function table(headers, rows, caption) {
    const wrap = el("div", "table-wrap");
    const t = el("table");
    if (caption) t.appendChild(el("caption", null, caption));
    const head = el("tr");
    headers.forEach((h) => head.appendChild(el("th", null, h)));
    t.appendChild(el("thead")).appendChild(head);
    const body = el("tbody");
    rows.forEach((r) => {
      const tr = el("tr");
      r.forEach((v) => tr.appendChild(el("td", typeof v === "number" ? "num" : null, cell(v))));
      body.appendChild(tr);
    });
    t.appendChild(body);
    wrap.appendChild(t);
    return wrap;
  }

  function chart(item) {
    const fig = el("figure", "chart");
    fig.id = "fig-" + item.id;
    const bar = el("div", "chart-bar");
    bar.appendChild(el("figcaption", null, item.title));
    const toggle = el("button", "toggle", "table");
    toggle.type = "button";
    bar.appendChild(toggle);
    fig.appendChild(bar);
    if (item.note) fig.appendChild(el("p", "note", item.note));
    const plot = el("div", "plot");
    plot.id = item.id;
    plot.dataset.chart = item.id;
    fig.appendChild(plot);
    const numbers = table(item.table.headers, item.table.rows);
    numbers.classList.add("chart-table");
    numbers.hidden = true;
    fig.appendChild(numbers);
    toggle.addEventListener("click", () => {
      numbers.hidden = !numbers.hidden;
      toggle.textContent = numbers.hidden ? "table" : "hide table";
    });
    plots.push([plot, item.figure]);
    return fig;
  }

  function picker(item) {
    const box = el("div", "picker");
    const label = el("label", null, item.label + " ");
    const select = el("select");
    select.id = item.id;
    item.options.forEach((o, i) => {
      const opt = el("option", null, o.name);
      opt.value = String(i);
      select.appendChild(opt);
    });
    label.appendChild(select);
    box.appendChild(label);
    const shown = el("div", "picked");
    box.appendChild(shown);
    function show(i) {
      shown.querySelectorAll(".plot").forEach((p) => Plotly.purge(p));
      shown.replaceChildren();
      const start = plots.length;
      item.options[i].items.forEach((it) => shown.appendChild(render(it)));
      return draw(plots.splice(start));
    }
    select.addEventListener("change", () => {
      box.dataset.ready = "0";
      show(Number(select.value)).then(() => { box.dataset.ready = "1"; });
    });
    box.show = show;
    return box;
  }

  function render(item) {
    switch (item.kind) {
      case "text": return el("p", null, item.text);
      case "heading": return el("h3", null, item.text);
      case "list": {
        const ul = el("ul");
        item.items.forEach((x) => ul.appendChild(el("li", null, x)));
        return ul;
      }
      case "table": return table(item.headers, item.rows, item.title);
      case "chart": return chart(item);
      case "code": {
        const pre = el("pre");
        pre.appendChild(el("code", null, item.text));
        return pre;
      }
      case "picker": return picker(item);
      default: return el("p", "note", "(an item this viewer does not know: " + item.kind + ")");
    }
  }

  function draw(list) {
    const config = { responsive: true, displaylogo: false };
    return Promise.all(list.map(([div, fig]) => Plotly.newPlot(div, fig.data, fig.layout, config)));
  }

  function headerBlock(h) {
    const box = el("header");
    if (page.kind === "run") {
      box.appendChild(el("h1", null, "llmopt report: " + h.run_id));
      const facts = [["model", h.model], ["weights", h.weights], ["device", h.device], ["status", h.status],
        ["created", h.created_at], ["workload", h.workload], ["llmopt", h.llmopt]];
      const dl = el("dl");
      facts.forEach(([k, v]) => { dl.appendChild(el("dt", null, k)); dl.appendChild(el("dd", null, v)); });
      box.appendChild(dl);
      const pre = el("pre");
      pre.appendChild(el("code", null, h.command));
      box.appendChild(pre);
    } else {
      box.appendChild(el("h1", null, "llmopt: " + h.runs.length + " runs, baseline " + h.baseline));
    }
    return box;
  }

  const app = document.getElementById("app");
  app.appendChild(headerBlock(page.header));
  const nav = el("nav");
  page.sections.forEach((s) => {
    const a = el("a", null, s.title);
    a.href = "#" + s.id;
    nav.appendChild(a);
  });
  app.appendChild(nav);
  const pickers = [];
  page.sections.forEach((s) => {
    const sec = el("section");
    sec.id = s.id;
    sec.appendChild(el("h2", null, s.title));
    if (!s.items.length) sec.appendChild(el("p", "note", "Nothing recorded for this section."));
    s.items.forEach((it) => {
      const node = render(it);
      if (it.kind === "picker") pickers.push(node);
      sec.appendChild(node);
    });
    app.appendChild(sec);
  });
  const first = plots.splice(0);
  Promise.all([draw(first), ...pickers.map((p) => p.show(0).then(() => { p.dataset.ready = "1"; }))]).then(
    () => { document.body.dataset.drawnMs = String(Math.round(performance.now())); document.body.dataset.ready = "1"; },
    (e) => { document.body.dataset.ready = "error"; console.error("llmopt report: a chart failed: " + e); });
})();

// mqk console: reads the broker's JSON API (/api/...) and renders it. Everything is rendered with textContent and
// attributes set one by one, never as markup: message bytes and names are untrusted.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const MAX_POINTS = 60;
  const REFRESH_MS = 2000;
  const view = document.getElementById("view");
  const samples = [];
  let writes = false;
  let generation = 0;
  let refresh = null;

  // --- DOM helpers ------------------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = String(v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, String(v));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function table(id, headings, rows) {
    const head = el("tr", {}, ...headings.map((h) => el("th", { text: h })));
    return el("table", { id }, el("thead", {}, head), el("tbody", {}, ...rows));
  }

  function num(value, attrs) {
    return el("td", Object.assign({ class: "num", text: value === null || value === undefined ? "–" : value }, attrs));
  }

  function link(hash, text) {
    return el("a", { href: "#" + hash, text });
  }

  function hashFor(name, params) {
    const query = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) if (v !== "" && v !== null && v !== undefined) query.set(k, v);
    const text = query.toString();
    return text ? name + "?" + text : name;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }

  function when(ms) {
    return ms >= 0 ? new Date(ms).toISOString() : "–";
  }

  function shown(value) {
    // a key, value or header value as the API shows it: text (cut), binary as base64
    if (value === null || value === undefined) return el("span", { class: "muted", text: "null" });
    const text = value.binary ? "base64:" + value.base64 : value.text;
    const note = value.truncated ? " … (" + bytes(value.size) + ")" : "";
    return el("pre", { text: text + note });
  }

  // --- the API ----------------------------------------------------------------------------------------------

  async function api(path, params) {
    const url = new URL(path, window.location.origin);
    for (const [k, v] of Object.entries(params || {})) if (v !== "" && v !== null && v !== undefined) url.searchParams.set(k, v);
    const resp = await fetch(url, { headers: { Accept: "application/json" } });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error || resp.statusText);
    return body;
  }

  async function post(path, body) {
    const resp = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify(body),
    });
    const answer = await resp.json();
    if (!resp.ok) throw new Error(answer.error || resp.statusText);
    return answer;
  }

  // --- stats and charts -------------------------------------------------------------------------------------

  async function pollStats() {
    try {
      const s = await api("/api/stats");
      samples.push(s);
      if (samples.length > MAX_POINTS + 1) samples.shift();
      const badge = document.getElementById("health");
      badge.textContent = s.ready ? "ready" : "not ready";
      badge.className = "badge " + (s.ready ? "ready" : "not-ready");
    } catch (e) {
      const badge = document.getElementById("health");
      badge.textContent = "unreachable";
      badge.className = "badge not-ready";
    }
  }

  function series(field, rate) {
    const out = [];
    for (let i = rate ? 1 : 0; i < samples.length; i++) {
      const s = samples[i];
      if (!rate) { out.push(Number(s[field]) || 0); continue; }
      const p = samples[i - 1];
      const seconds = Math.max(0.001, (s.time_ms - p.time_ms) / 1000);
      out.push(Math.max(0, (s[field] - p[field]) / seconds));
    }
    return out;
  }

  function chart(id, title, points, format) {
    const width = 260, height = 70;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("role", "img");
    const max = Math.max(1, ...points);
    const step = width / (MAX_POINTS - 1);
    const offset = MAX_POINTS - points.length;
    const coords = points.map((v, i) => ((i + offset) * step).toFixed(1) + "," + (height - 2 - (v / max) * (height - 4)).toFixed(1));
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", coords.join(" "));
    svg.append(line);
    const last = points.length ? points[points.length - 1] : 0;
    return el("figure", { class: "chart", id }, el("figcaption", {}, el("span", { text: title }), el("span", { class: "value", text: format(last) })), svg);
  }

  function charts() {
    const rate = (n) => n.toFixed(1) + "/s";
    const count = (n) => String(Math.round(n));
    return el(
      "div",
      { class: "charts", id: "charts" },
      chart("chart-records-in", "records in", series("records_in", true), rate),
      chart("chart-records-out", "records out", series("records_out", true), rate),
      chart("chart-bytes-in", "bytes in", series("bytes_in", true), (n) => bytes(Math.round(n)) + "/s"),
      chart("chart-requests", "requests", series("requests", true), rate),
      chart("chart-lag", "consumer lag", series("consumer_lag", false), count),
      chart("chart-connections", "connections", series("connections", false), count),
      chart("chart-timer", "delayed pending", series("timer_pending", false), count),
      chart("chart-log", "log size", series("log_bytes", false), (n) => bytes(Math.round(n))),
    );
  }

  // --- views ------------------------------------------------------------------------------------------------

  async function overview() {
    const o = await api("/api/overview");
    const b = o.broker;
    const checks = Object.entries(o.checks).map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td", { text: typeof v === "object" ? JSON.stringify(v) : String(v) })));
    const listeners = Object.entries(o.listeners).map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td", { text: v })));
    return el(
      "section",
      { id: "overview" },
      el("h2", { text: "Broker" }),
      table("broker-info", ["", ""], [
        el("tr", {}, el("td", { text: "version" }), el("td", { text: b.version })),
        el("tr", {}, el("td", { text: "node" }), el("td", { text: b.node_id + " (" + b.broker_group + ")" })),
        el("tr", {}, el("td", { text: "cluster" }), el("td", { text: b.cluster_mode ? b.cluster_id : "single broker" })),
        el("tr", {}, el("td", { text: "storage" }), el("td", { text: b.storage })),
        el("tr", {}, el("td", { text: "console writes" }), el("td", { text: o.writes ? "enabled" : "read-only" })),
        ...listeners,
      ]),
      el("h2", { text: "Health: " + (o.ready ? "ready" : "not ready") }),
      table("health-checks", ["check", "result"], checks),
      el("h2", { text: "Metrics" }),
      charts(),
    );
  }

  async function topics() {
    const t = await api("/api/topics");
    const rows = t.topics.map((x) =>
      el(
        "tr",
        { class: "topic", "data-topic": x.name },
        el("td", {}, link(hashFor("topic", { name: x.name }), x.name), x.internal ? el("span", { class: "muted", text: " internal" }) : null),
        num(x.partitions),
        num(x.records),
        num(bytes(x.size_bytes)),
        el("td", { text: x.engine }),
        el("td", { text: Object.entries(x.overrides).map(([k, v]) => k + "=" + v).join(", ") }),
      ),
    );
    return el("section", { id: "topics" }, el("h2", { text: "Topics" }), table("topics-table", ["topic", "partitions", "records", "size", "engine", "overrides"], rows));
  }

  function createTopicForm() {
    const status = el("span", { id: "create-status" });
    const form = el(
      "form",
      { id: "create-topic" },
      el("label", {}, "name", el("input", { name: "name", required: "required" })),
      el("label", {}, "partitions", el("input", { name: "partitions", type: "number", min: "1", value: "1" })),
      el("label", {}, "configs (k=v, comma separated)", el("input", { name: "configs" })),
      el("button", { type: "submit", text: "Create topic" }),
      status,
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const data = new FormData(form);
      const configs = {};
      for (const item of String(data.get("configs") || "").split(",")) {
        const i = item.indexOf("=");
        if (i > 0) configs[item.slice(0, i).trim()] = item.slice(i + 1).trim();
      }
      try {
        const answer = await post("/api/topics", { name: data.get("name"), partitions: Number(data.get("partitions")), configs });
        status.textContent = "created " + answer.created;
        status.className = "";
      } catch (e) {
        status.textContent = e.message;
        status.className = "error";
      }
    });
    return form;
  }

  async function topic(params) {
    const t = await api("/api/topic", { name: params.get("name") });
    const rows = t.partitions.map((p) =>
      p.local
        ? el(
            "tr",
            { class: "partition" },
            num(p.partition),
            num(p.log_start_offset),
            num(p.log_end_offset),
            num(p.records),
            num(bytes(p.size_bytes)),
            el("td", {}, link(hashFor("messages", { topic: t.name, partition: p.partition }), "browse")),
          )
        : el("tr", { class: "partition" }, num(p.partition), el("td", { colspan: "5", class: "muted", text: "not held by this broker" + (p.broker_group ? " (broker group " + p.broker_group + ", leader node " + p.leader + ")" : "") })),
    );
    const configs = t.configs.map((c) =>
      el("tr", { class: c.default ? "muted" : "" }, el("td", { text: c.name }), el("td", { text: c.value }), el("td", { text: c.default ? "default" : "topic" })),
    );
    return el(
      "section",
      { id: "topic" },
      el("h2", { id: "topic-name", text: "Topic " + t.name }),
      el("p", { class: "muted", text: "engine " + t.engine + ", id " + t.topic_id + (t.key_index ? ", record keys indexed" : "") }),
      table("partitions-table", ["partition", "log start", "log end", "records", "size", ""], rows),
      el("h2", { text: "Configuration" }),
      table("configs-table", ["name", "value", "source"], configs),
    );
  }

  async function groups() {
    const g = await api("/api/groups");
    const rows = g.groups.map((x) =>
      el("tr", { class: "group", "data-group": x.group }, el("td", {}, link(hashFor("group", { id: x.group }), x.group)), el("td", { text: x.state }), num(x.members), num(x.partitions), num(x.lag, { class: "num lag" })),
    );
    return el("section", { id: "groups" }, el("h2", { text: "Consumer groups" }), table("groups-table", ["group", "state", "members", "partitions", "lag"], rows));
  }

  async function group(params) {
    const g = await api("/api/group", { id: params.get("id") });
    const members = g.members.map((m) => el("tr", { class: "member" }, el("td", { text: m.member_id }), el("td", { text: m.client_id }), el("td", { text: m.client_host }), el("td", { text: m.instance_id || "" })));
    const offsets = g.offsets.map((o) =>
      el("tr", { class: "offset", "data-topic": o.topic, "data-partition": o.partition }, el("td", { text: o.topic }), num(o.partition), num(o.committed_offset), num(o.log_end_offset), num(o.lag, { class: "num lag" })),
    );
    return el(
      "section",
      { id: "group" },
      el("h2", { id: "group-name", text: "Group " + g.group }),
      el("p", {}, "state ", el("b", { id: "group-state", text: g.state }), ", total lag ", el("b", { id: "group-lag", text: String(g.lag) })),
      el("h2", { text: "Members" }),
      table("members-table", ["member", "client", "host", "instance"], members),
      el("h2", { text: "Committed offsets" }),
      table("offsets-table", ["topic", "partition", "committed", "log end", "lag"], offsets),
    );
  }

  function resetForm(g) {
    const topicsOf = [...new Set(g.offsets.map((o) => o.topic))];
    const status = el("span", { id: "reset-status" });
    const form = el(
      "form",
      { id: "reset-offsets" },
      el("label", {}, "topic", el("select", { name: "topic" }, ...topicsOf.map((t) => el("option", { value: t, text: t })))),
      el("label", {}, "to", el("select", { name: "to" }, ...["earliest", "latest", "offset", "timestamp"].map((t) => el("option", { value: t, text: t })))),
      el("label", {}, "value (offset or ms)", el("input", { name: "value", type: "number" })),
      el("button", { type: "submit", text: "Reset offsets" }),
      status,
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const data = new FormData(form);
      const body = { group: g.group, topic: data.get("topic"), to: data.get("to") };
      if (data.get("value") !== "") body.value = Number(data.get("value"));
      try {
        await post("/api/group/reset-offsets", body);
        status.textContent = "reset";
        status.className = "";
      } catch (e) {
        status.textContent = e.message;
        status.className = "error";
      }
    });
    return form;
  }

  async function messages(params) {
    const form = el(
      "form",
      { id: "message-query" },
      el("label", {}, "topic", el("input", { name: "topic", value: params.get("topic") || "", required: "required" })),
      el("label", {}, "partition", el("input", { name: "partition", type: "number", min: "0", value: params.get("partition") || "0" })),
      el("label", {}, "offset", el("input", { name: "offset", type: "number", min: "0", value: params.get("offset") || "" })),
      el("label", {}, "timestamp (ms)", el("input", { name: "timestamp", type: "number", value: params.get("timestamp") || "" })),
      el("label", {}, "key", el("input", { name: "key", value: params.get("key") || "" })),
      el("label", {}, "limit", el("input", { name: "limit", type: "number", min: "1", max: "200", value: params.get("limit") || "20" })),
      el("button", { type: "submit", text: "Show" }),
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const data = Object.fromEntries(new FormData(form).entries());
      window.location.hash = hashFor("messages", data);
    });
    const section = el("section", { id: "messages" }, el("h2", { text: "Messages" }), form);
    if (!params.get("topic")) return section;
    const query = {};
    for (const k of ["topic", "partition", "offset", "timestamp", "key", "limit"]) query[k] = params.get(k);
    const m = await api("/api/messages", query);
    if (m.by === "key" && !m.key_index && m.records.length === 0)
      section.append(el("p", { class: "muted", text: "Kafka record keys are indexed on topics with index.keys=true; RocketMQ KEYS always." }));
    const rows = m.records.map((r) => {
      const headers = el("ul", { class: "headers" }, ...r.headers.map((h) => el("li", { class: "header" }, el("b", { text: h.key }), ": ", h.value === null ? "null" : (h.value.binary ? "base64:" + h.value.base64 : h.value.text))));
      const rocket = r.rocketmq
        ? el("ul", { class: "properties" }, ...Object.entries(r.rocketmq.properties).map(([k, v]) => el("li", {}, el("b", { text: k }), ": ", v)))
        : el("span", { class: "muted", text: "–" });
      return el(
        "tr",
        { class: "message", "data-partition": r.partition, "data-offset": r.offset },
        num(r.partition),
        num(r.offset),
        el("td", { text: when(r.timestamp) }),
        el("td", { class: "key" }, shown(r.key)),
        el("td", { class: "value" }, shown(r.value)),
        el("td", { class: "headers" }, headers),
        el("td", { class: "rocketmq" }, rocket),
      );
    });
    section.append(
      el("p", { id: "message-summary", class: "muted", text: m.by === "key" ? "by key: " + m.records.length + " found" : "partition " + m.partition + ", offsets " + m.log_start_offset + "–" + m.log_end_offset + ", from " + m.from_offset }),
      table("messages-table", ["partition", "offset", "timestamp", "key", "value", "headers", "RocketMQ properties"], rows),
    );
    if (m.by !== "key" && m.next_offset < m.log_end_offset)
      section.append(link(hashFor("messages", { topic: m.topic, partition: m.partition, offset: m.next_offset, limit: params.get("limit") }), "next page"));
    return section;
  }

  async function delayed() {
    const d = await api("/api/delayed", { limit: 100 });
    const now = Date.now();
    const rows = d.items.map((i) =>
      el(
        "tr",
        { class: "delayed" },
        el("td", { text: when(i.due_ms) + " (in " + Math.max(0, Math.round((i.due_ms - now) / 1000)) + " s)" }),
        el("td", { text: i.topic || "" }),
        num(i.queue),
        el("td", { text: (i.keys || []).map((k) => k.text).join(" ") }),
        num(i.size_bytes === undefined ? null : bytes(i.size_bytes)),
        num(i.timer_offset),
      ),
    );
    return el(
      "section",
      { id: "delayed" },
      el("h2", { text: "Delayed messages" }),
      el("p", {}, "pending ", el("b", { id: "delayed-pending", text: String(d.pending) }), ", delivered ", el("b", { text: String(d.delivered) })),
      table("delayed-table", ["due", "topic", "queue", "keys", "size", "timer offset"], rows),
    );
  }

  // --- routing ----------------------------------------------------------------------------------------------

  const VIEWS = { overview, topics, topic, groups, group, messages, delayed };
  // views refreshed every REFRESH_MS; their forms (when writes are on) are built once, beside the refreshed part,
  // so a refresh never wipes what the user is typing
  const LIVE = new Set(["overview", "topics", "topic", "groups", "group", "delayed"]);
  const FORMS = {
    topics: async () => (writes ? createTopicForm() : null),
    group: async (params) => (writes ? resetForm(await api("/api/group", { id: params.get("id") })) : null),
  };

  async function render(name, params, mine, target) {
    let node;
    try {
      node = await VIEWS[name](params);
    } catch (e) {
      node = el("p", { class: "error", id: "error", text: e.message });
    }
    if (mine === generation) target.replaceChildren(node);
  }

  function route() {
    const hash = window.location.hash.slice(1) || "overview";
    const cut = hash.indexOf("?");
    let name = cut < 0 ? hash : hash.slice(0, cut);
    const params = new URLSearchParams(cut < 0 ? "" : hash.slice(cut + 1));
    if (!Object.prototype.hasOwnProperty.call(VIEWS, name)) name = "overview";
    const mine = ++generation;
    if (refresh !== null) clearInterval(refresh);
    refresh = null;
    const live = el("div", { id: "live" });
    const forms = el("div", { id: "forms" });
    view.replaceChildren(live, forms);
    render(name, params, mine, live);
    if (Object.prototype.hasOwnProperty.call(FORMS, name)) {
      FORMS[name](params)
        .then((node) => { if (node && mine === generation) forms.replaceChildren(node); })
        .catch(() => {}); // (the refreshed part shows why the view cannot be read)
    }
    if (LIVE.has(name)) refresh = setInterval(() => render(name, params, mine, live), REFRESH_MS);
  }

  async function start() {
    try {
      const o = await api("/api/overview");
      writes = o.writes;
      const b = o.broker;
      document.getElementById("broker").textContent = "v" + b.version + " · node " + b.node_id + (b.cluster_mode ? " · cluster " + b.cluster_id : "");
    } catch (e) {
      document.getElementById("broker").textContent = "broker unreachable";
    }
    await pollStats();
    setInterval(pollStats, REFRESH_MS);
    window.addEventListener("hashchange", route);
    route();
  }

  start();
})();
